"""The compact pod record (hami.core.podrecord): what callers read is what went in."""

from __future__ import annotations

from _core_helpers import NOW, NVIDIA
from hypothesis import given
from hypothesis import strategies as st

from hami.core.cluster import Cluster
from hami.core.podrecord import PodRecord, assignment_values, held_of
from hami.core.usage import Use
from hami.protocol import ContainerDevice, encode_pod_devices


def test_usage_and_types_read_back_what_the_hold_was_built_from() -> None:
    usage = {"GPU-b": Use(1, 2000, 30), "GPU-a": Use(2, 4096, 0)}
    types = {"GPU-b": "nvidia", "GPU-a": "mlu"}
    record = PodRecord("ns/p", "u", "n1", held_of(usage, types))
    assert record.usage == usage
    assert record.types == types
    assert record.words == {"nvidia", "mlu"}


def test_the_same_devices_in_another_order_are_the_same_hold() -> None:
    first = held_of({"GPU-a": Use(1, 1, 1), "GPU-b": Use(1, 2, 2)}, {})
    second = held_of({"GPU-b": Use(1, 2, 2), "GPU-a": Use(1, 1, 1)}, {})
    assert first == second
    assert PodRecord("ns/p", "u", "n", first) == PodRecord("ns/p", "u", "n", second)


def test_a_different_hold_is_not_equal() -> None:
    one = PodRecord("ns/p", "u", "n", held_of({"GPU-a": Use(1, 1000, 10)}, {}))
    other = PodRecord("ns/p", "u", "n", held_of({"GPU-a": Use(1, 1001, 10)}, {}))
    assert one != other


devices = st.builds(
    ContainerDevice,
    uuid=st.from_regex(r"GPU-[a-z0-9]{1,8}", fullmatch=True),
    vendor=st.sampled_from(["NVIDIA", "Cambricon"]),
    memory=st.integers(0, 2**31 - 1),
    cores=st.integers(0, 100),
)


@given(
    st.dictionaries(
        st.sampled_from(["nvidia", "mlu"]),
        st.lists(st.lists(devices, max_size=3), min_size=1, max_size=4),
    )
)
def test_assignment_decodes_what_values_of_encoded(
    assignment: dict[str, list[list[ContainerDevice]]],
) -> None:
    usage = {
        d.uuid: Use(1, d.memory, d.cores) for per in assignment.values() for c in per for d in c
    }
    types = {d.uuid: w for w, per in assignment.items() for c in per for d in c}
    held = held_of(usage, types)  # one type: values is the text alone; two: word, text pairs
    record = PodRecord("ns/p", "u", "n", held, values=assignment_values(assignment, held))
    if len(assignment) == 2 and len(set(types.values())) == 2:
        assert isinstance(record.values, tuple) and len(record.values) == 4
    assert record.assignment == {word: [list(c) for c in per] for word, per in assignment.items()}
    assert set(record.words) == set(assignment)


def _pod(value: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-1",
            "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": value,
                "hami.io/bind-phase": "success",
            },
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": "Running"},
    }


def test_a_pods_record_keeps_its_value_as_text_and_reads_it_back() -> None:
    cluster = Cluster([NVIDIA])
    value = encode_pod_devices(
        [
            [ContainerDevice("GPU-1", "NVIDIA", 1000, 10)],
            [ContainerDevice("GPU-1", "NVIDIA", 500, 5), ContainerDevice("GPU-2", "NVIDIA", 7, 0)],
        ]
    )
    cluster.upsert_pod(_pod(value), NOW)
    record = cluster.pods["ns/p"]
    assert record.values == value  # one type: the text alone
    assert list(record.value_pairs()) == [("nvidia", value)]
    assert record.assignment["nvidia"][1][1] == ContainerDevice("GPU-2", "NVIDIA", 7, 0)
    # both containers' shares of GPU-1 add up: two slots
    assert record.usage == {"GPU-1": Use(2, 1500, 15), "GPU-2": Use(1, 7, 0)}
    assert record.types == {"GPU-1": "nvidia", "GPU-2": "nvidia"}


def test_an_unreadable_value_keeps_the_last_readable_text() -> None:
    cluster = Cluster([NVIDIA])
    good = encode_pod_devices([[ContainerDevice("GPU-1", "NVIDIA", 1000, 10)], []])
    cluster.upsert_pod(_pod(good), NOW)
    errors = cluster.upsert_pod(_pod("GPU-1,NVIDIA,notanumber,10:;"), NOW)
    assert errors
    record = cluster.pods["ns/p"]
    assert list(record.value_pairs()) == [("nvidia", good)]
    assert record.usage == {"GPU-1": Use(1, 1000, 10)}


def test_records_of_one_share_of_one_device_share_one_values_object() -> None:
    cluster = Cluster([NVIDIA])
    for name, uuid in (("p", "GPU-1"), ("q", "GPU-2")):
        pod = _pod(f"{uuid},NVIDIA,1000,10:;")
        pod["metadata"]["name"] = name  # type: ignore[index]
        cluster.upsert_pod(pod, NOW)
    p, q = cluster.pods["ns/p"], cluster.pods["ns/q"]
    assert p.values is q.values  # nothing per pod: rebuilt from the hold when read
    assert list(p.value_pairs()) == [("nvidia", "GPU-1,NVIDIA,1000,10:;")]
    assert list(q.value_pairs()) == [("nvidia", "GPU-2,NVIDIA,1000,10:;")]
    assert q.assignment == {"nvidia": [[ContainerDevice("GPU-2", "NVIDIA", 1000, 10)]]}


def test_a_value_that_is_not_exactly_the_canonical_one_is_kept_as_text() -> None:
    cluster = Cluster([NVIDIA])
    value = "GPU-1,NVIDIA,1000,10:;;"  # a second, empty entry: not rebuilt from the hold
    cluster.upsert_pod(_pod(value), NOW)
    record = cluster.pods["ns/p"]
    assert record.values == value
    assert list(record.value_pairs()) == [("nvidia", value)]
