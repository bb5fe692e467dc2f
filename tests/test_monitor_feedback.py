"""HAMi's priority feedback: the pure rule, and the writer that sets the fields in a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _monitor_helpers import RegionSpec, read_int32, write_region
from hypothesis import given
from hypothesis import strategies as st

from hami.node.monitor.cachefile import open_dir, read_region, write_field
from hami.node.monitor.feedback import FeedbackState, FeedbackWrite, plan_feedback
from hami.node.monitor.layout import V0, V1, Layout
from hami.node.monitor.region import CacheError

A, B = "GPU-a", "GPU-b"


def state(
    priority: int, recent: int, switch: int = 0, uuids: tuple[str, ...] = (A,)
) -> FeedbackState:
    return FeedbackState(priority, recent, switch, uuids)


def test_an_active_high_priority_container_blocks_and_throttles_a_low_one() -> None:
    writes = plan_feedback({"high": state(0, 2), "low": state(1, 2)})
    # high: decayed to 1, still active, nothing above it
    assert writes["high"] == FeedbackWrite(recent_kernel=1, utilization_switch=None)
    # low: blocked (-1) and throttled (switch 1)
    assert writes["low"] == FeedbackWrite(recent_kernel=-1, utilization_switch=1)


def test_the_low_one_is_released_once_the_high_one_went_idle() -> None:
    # recent_kernel 1 decays to 0: no longer active
    writes = plan_feedback({"high": state(0, 1), "low": state(1, -1, switch=1)})
    assert writes["high"] == FeedbackWrite(recent_kernel=0, utilization_switch=None)
    assert writes["low"] == FeedbackWrite(recent_kernel=0, utilization_switch=0)


def test_only_containers_sharing_a_device_affect_each_other() -> None:
    writes = plan_feedback({"high": state(0, 3, uuids=(A,)), "low": state(1, 0, uuids=(B,))})
    assert "low" not in writes


def test_two_active_containers_of_one_priority_share_by_the_limit() -> None:
    writes = plan_feedback({"x": state(1, 3), "y": state(1, 3), "z": state(1, 3, uuids=(B,))})
    assert writes["x"].utilization_switch == 1 and writes["y"].utilization_switch == 1
    assert writes["x"].recent_kernel == 2  # decayed, not blocked
    assert writes["z"].utilization_switch is None  # alone on its device


def test_a_negative_priority_takes_no_part() -> None:
    writes = plan_feedback({"odd": state(-1, 5, switch=1), "low": state(1, 0)})
    assert writes["odd"] == FeedbackWrite(recent_kernel=4, utilization_switch=0)
    assert "low" not in writes


def _go_observe(states: dict[int, FeedbackState]) -> dict[int, tuple[int, int]]:
    """Go HAMi's Observe/CheckBlocking/CheckPriority, transliterated (per-uuid lists)."""
    recent = {k: s.recent_kernel for k, s in states.items()}
    on: dict[str, list[int]] = {}
    for k, s in states.items():
        if recent[k] > 0:
            recent[k] -= 1
            if recent[k] > 0:
                for uuid in s.uuids:
                    if s.priority < 0:
                        continue
                    row = on.setdefault(uuid, [])
                    while s.priority >= len(row):
                        row.append(0)
                    row[s.priority] += 1
    result = {}
    for k, s in states.items():
        p, rk, switch = s.priority, recent[k], s.utilization_switch
        blocking = any(on[u][i] > 0 for u in s.uuids if u in on for i in range(min(p, len(on[u]))))
        if blocking and rk >= 0:
            rk = -1
        elif not blocking and rk < 0:
            rk = 0
        same = any(0 <= p < len(on[u]) and on[u][p] > 1 for u in s.uuids if u in on)
        switch = 1 if blocking or same else 0
        result[k] = (rk, switch)
    return result


states_st = st.dictionaries(
    st.integers(0, 20),
    st.builds(
        FeedbackState,
        st.integers(-2, 4),
        st.integers(-3, 4),
        st.integers(0, 1),
        st.lists(st.sampled_from([A, B, "GPU-c"]), max_size=3, unique=True).map(tuple),
    ),
    max_size=8,
)


@given(states_st)
def test_the_rule_is_go_hamis_observe(states: dict[int, FeedbackState]) -> None:
    writes = plan_feedback(states)
    for key, (recent, switch) in _go_observe(states).items():
        write = writes.get(key, FeedbackWrite(None, None))
        old = states[key]
        got = (
            old.recent_kernel if write.recent_kernel is None else write.recent_kernel,
            old.utilization_switch
            if write.utilization_switch is None
            else write.utilization_switch,
        )
        assert got == (recent, switch)
        # only changes are written
        assert write.recent_kernel != old.recent_kernel
        assert write.utilization_switch != old.utilization_switch


@pytest.mark.parametrize("layout", [V0, V1])
def test_write_field_sets_exactly_that_int32_in_the_file(tmp_path: Path, layout: Layout) -> None:
    path = write_region(
        tmp_path, "uid", "c", RegionSpec(layout=layout, recent_kernel=2, priority=1)
    )
    before = path.read_bytes()
    fd = open_dir(str(path.parent))
    try:
        cache = read_region(fd, path.name)
        write_field(fd, cache, "utilization_switch", 1)
        write_field(fd, cache, "recent_kernel", -1)
    finally:
        os.close(fd)
    after = path.read_bytes()
    assert read_int32(path, layout.utilization_switch) == 1
    assert read_int32(path, layout.recent_kernel) == -1
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed and min(changed) >= layout.utilization_switch
    assert max(changed) < layout.recent_kernel + 4
    assert len(after) == len(before)


def test_write_field_refuses_a_replaced_or_linked_file(tmp_path: Path) -> None:
    path = write_region(tmp_path, "uid", "c", RegionSpec())
    fd = open_dir(str(path.parent))
    try:
        cache = read_region(fd, path.name)
        os.link(path, tmp_path / "other")  # a second link: maybe a host file's
        with pytest.raises(CacheError, match="replaced"):
            write_field(fd, cache, "utilization_switch", 1)
        os.unlink(tmp_path / "other")
        new = write_region(tmp_path, "uid", "c", RegionSpec(), name="new.cache")
        os.replace(new, path)  # another inode under the same name
        with pytest.raises(CacheError, match="replaced"):
            write_field(fd, cache, "utilization_switch", 1)
        with pytest.raises(ValueError, match="not a feedback field"):
            write_field(fd, read_region(fd, path.name), "priority", 0)
    finally:
        os.close(fd)
    assert read_int32(path, V1.utilization_switch) == 0
