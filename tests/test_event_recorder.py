"""The pure folding and rate limit of Events (hami.kube.eventfold), on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hami.kube.eventfold import Folder, ObjectRef, Occurrence, Write

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POD = ObjectRef("ns", "p", "uid-p")
OTHER = ObjectRef("ns", "q", "uid-q")


def occ(
    message: str = "0/3 nodes are available", ref: ObjectRef = POD, at: float = 0.0
) -> Occurrence:
    return Occurrence(ref, "FilteringFailed", message, "Warning", T0 + timedelta(seconds=at))


def ack(folder: Folder, writes: list[Write], now: float) -> None:
    """The sender's side: every write succeeded; creates get a name."""
    for w in writes:
        folder.written(w, w.name or f"ev-{w.first.message}", now)


def test_identical_occurrences_fold_into_one_event_with_their_count() -> None:
    folder = Folder(burst=5, refill=60, update_every=60)
    for i in range(50):
        folder.add(occ(at=i * 0.5), now=i * 0.5)
    first = folder.due(now=0.0)
    assert len(first) == 1 and first[0].create and first[0].count == 50
    ack(folder, first, now=0.0)
    assert folder.folded == 49
    assert folder.due(now=59.0) == []  # nothing new to say
    assert folder.next_due(now=59.0) is None


def test_repeats_after_the_create_are_a_patch_of_count_and_last_time() -> None:
    folder = Folder(burst=5, refill=60, update_every=60)
    folder.add(occ(), now=0.0)
    ack(folder, folder.due(now=0.0), now=0.0)
    for i in range(1, 31):
        folder.add(occ(at=i), now=float(i))
        assert folder.due(now=float(i)) == []  # folded in memory, not written at once
    assert folder.next_due(now=30.0) == 30.0
    (patch,) = folder.due(now=60.0)
    assert not patch.create and patch.name == "ev-0/3 nodes are available"
    assert patch.count == 31 and patch.last == T0 + timedelta(seconds=30)


def test_different_messages_are_separate_events() -> None:
    folder = Folder(burst=5, refill=60, update_every=60)
    folder.add(occ("a"), now=0.0)
    folder.add(occ("b"), now=0.0)
    folder.add(occ("a"), now=0.0)
    writes = folder.due(now=0.0)
    assert sorted((w.first.message, w.count) for w in writes) == [("a", 2), ("b", 1)]
    assert all(w.create for w in writes)


def test_rate_limit_per_object_burst_then_one_per_refill() -> None:
    folder = Folder(burst=5, refill=60, update_every=60)
    writes: list[Write] = []
    # A new message every second for 30 s: only the burst gets out.
    for i in range(30):
        folder.add(occ(f"m{i}", at=i), now=float(i))
        batch = folder.due(now=float(i))
        ack(folder, batch, now=float(i))
        writes += batch
    assert [w.first.message for w in writes] == ["m0", "m1", "m2", "m3", "m4"]
    # The next token is there 60 s after the burst began to drain.
    assert folder.due(now=59.0) == []
    batch = folder.due(now=60.5)
    assert len(batch) == 1 and batch[0].first.message == "m5"  # oldest waiting key first


def test_rate_limit_is_per_object() -> None:
    folder = Folder(burst=2, refill=60, update_every=60)
    for i in range(4):
        folder.add(occ(f"m{i}"), now=0.0)
        folder.add(occ(f"m{i}", ref=OTHER), now=0.0)
    writes = folder.due(now=0.0)
    assert sorted((w.first.ref.name, w.first.message) for w in writes) == [
        ("p", "m0"),
        ("p", "m1"),
        ("q", "m0"),
        ("q", "m1"),
    ]


def test_new_keys_go_before_count_updates() -> None:
    folder = Folder(burst=1, refill=10, update_every=10)
    folder.add(occ("old"), now=0.0)
    ack(folder, folder.due(now=0.0), now=0.0)
    folder.add(occ("old"), now=1.0)  # a repeat: a patch due at 10
    folder.add(occ("new"), now=2.0)  # no token until 10
    (first,) = folder.due(now=10.0)
    assert first.first.message == "new" and first.create


def test_a_waiting_key_keeps_counting_until_its_token() -> None:
    folder = Folder(burst=1, refill=60, update_every=60)
    folder.add(occ("a"), now=0.0)
    ack(folder, folder.due(now=0.0), now=0.0)
    for i in range(10):
        folder.add(occ("b"), now=float(i))
        assert folder.due(now=float(i)) == []
    (write,) = folder.due(now=60.0)
    assert write.first.message == "b" and write.count == 10


def test_a_failed_write_is_retried_later_with_the_count_kept() -> None:
    folder = Folder(burst=5, refill=60, update_every=30)
    folder.add(occ(), now=0.0)
    (write,) = folder.due(now=0.0)
    folder.failed(write, now=0.0)
    folder.add(occ(), now=5.0)
    assert folder.due(now=29.0) == []
    (again,) = folder.due(now=30.0)
    assert again.create and again.count == 2


def test_an_expired_event_is_created_again_with_the_whole_count() -> None:
    folder = Folder(burst=5, refill=60, update_every=30)
    folder.add(occ(), now=0.0)
    ack(folder, folder.due(now=0.0), now=0.0)
    folder.add(occ(), now=1.0)
    (patch,) = folder.due(now=30.0)
    folder.failed(patch, now=30.0, gone=True)
    (create,) = folder.due(now=60.0)
    assert create.create and create.count == 2


def test_occurrences_during_a_write_are_sent_next_time() -> None:
    folder = Folder(burst=5, refill=60, update_every=30)
    folder.add(occ(), now=0.0)
    (write,) = folder.due(now=0.0)
    folder.add(occ(), now=0.1)  # arrives while the create is on the wire
    assert folder.due(now=0.2) == []
    folder.written(write, "ev", now=0.3)
    (patch,) = folder.due(now=30.3)
    assert patch.count == 2 and patch.name == "ev"


def test_drain_writes_everything_pending_ignoring_limits() -> None:
    folder = Folder(burst=1, refill=600, update_every=600)
    for i in range(4):
        folder.add(occ(f"m{i}"), now=0.0)
    ack(folder, folder.due(now=0.0), now=0.0)
    folder.add(occ("m0"), now=1.0)
    drained = folder.drain()
    assert sorted((w.first.message, w.count, w.create) for w in drained) == [
        ("m0", 2, False),
        ("m1", 1, True),
        ("m2", 1, True),
        ("m3", 1, True),
    ]


def test_memory_is_bounded() -> None:
    folder = Folder(burst=5, refill=60, update_every=60, max_keys=100)
    for i in range(1000):
        folder.add(occ(ref=ObjectRef("ns", f"p{i}", f"u{i}")), now=float(i))
    assert len(folder) == 100
    assert folder.evicted == 900  # never written: they were still waiting for the sender
    assert len(folder.due(now=1000.0)) == 100


def test_nothing_due_while_the_only_dirty_write_is_on_the_wire() -> None:
    folder = Folder()
    folder.add(occ(), now=0.0)
    (write,) = folder.due(now=0.0)
    assert folder.next_due(now=0.0) is None  # the sender waits for the queue, not a timer
    folder.written(write, "ev", now=1.0)
    assert folder.next_due(now=1.0) is None


@pytest.mark.parametrize("bad", [{"burst": 0}, {"refill": 0.0}, {"update_every": -1.0}])
def test_limits_that_would_spin_or_never_write_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Folder(**bad)  # type: ignore[arg-type]


def test_a_key_forgotten_and_seen_again_is_written_once() -> None:
    folder = Folder(burst=5, refill=60, update_every=60, max_keys=1)
    folder.add(occ("a"), now=0.0)
    folder.add(occ("b"), now=0.0)  # forgets "a"
    folder.add(occ("a"), now=0.0)  # forgets "b"; "a" again, due at the same time
    writes = folder.due(now=0.0)
    assert [(w.first.message, w.count) for w in writes] == [("a", 1)]


def test_many_waiting_events_are_each_written_when_due() -> None:
    folder = Folder(burst=1, refill=60, update_every=60)
    pods = [ObjectRef("ns", f"p{i}", f"u{i}") for i in range(300)]
    for i, ref in enumerate(pods):  # one create a second
        folder.add(occ(ref=ref), now=float(i))
        ack(folder, folder.due(now=float(i)), now=float(i))
    for ref in pods:  # then a repeat of each: due a minute after its create
        folder.add(occ(ref=ref), now=300.0)
    assert [w.first.ref.name for w in folder.due(now=70.0)] == [f"p{i}" for i in range(11)]
    assert len(folder.due(now=299.0)) == 229
    assert folder.next_due(now=299.0) == 1.0  # p240's turn at 300
