"""The MLU agent answers Allocate for what Go HAMi 2.10's scheduler writes for a Cambricon pod
placed from the node's capacity: cards named ``{node}-cambricon-mlu-{i}`` (card ``i`` in
index order), memory in whole 256 MiB units, ``CAMBRICON_DSMLU_PROFILE`` beside them;
malformed names or profiles fail the pod with an error naming it. Go's scheduler itself
over this agent: tests/test_interop_go_cambricon.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _cambricon_helpers import X4_0, X4_1, fake_cnmon
from _cambricon_helpers import backend as mlu_backend

from hami.backends.cambricon_go import ASSIGNED, PROFILE
from hami.node.allocate import AllocateError, plan_allocation
from hami.protocol import keys

NODE = "mlu-node"
TO_ALLOC = "hami.io/cambricon-mlu-devices-to-allocate"


def go_pod(value: str, profile: str | None = "0_100_91", node: str = NODE) -> dict[str, Any]:
    annotations = {
        keys.BIND_PHASE: "allocating",
        keys.VGPU_NODE: node,
        TO_ALLOC: value,
        "hami.io/cambricon-mlu-devices-allocated": value,
        ASSIGNED: "false",
    }
    if profile is not None:
        annotations[PROFILE] = profile
    limits = {"cambricon.com/vmlu": "1"}
    return {
        "metadata": {"namespace": "ml", "name": "infer", "uid": "u1", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


async def _agent(tmp_path: Path) -> tuple[Any, list[Any]]:
    backend = mlu_backend(fake_cnmon(tmp_path, "file"), host_root=str(tmp_path))
    return backend, await backend.enumerate()


async def test_gos_capacity_ids_name_the_cards_in_index_order(tmp_path: Path) -> None:
    backend, cards = await _agent(tmp_path)
    # card 1, a quarter of its cores and 16 vmemory units (4096 MiB), as Go writes it
    pod = go_pod(f"{NODE}-cambricon-mlu-1,MLU,4096,25:;", profile="1_25_16")
    plan = plan_allocation(pod, backend, [1], cards)
    (container,) = plan.containers
    assert [d.uuid for d in container.devices] == [X4_1]
    assert container.allocation.envs == {
        "CAMBRICON_SPLIT_ENABLE": "1",
        "CAMBRICON_SPLIT_VISIBLE_DEVICES": "1",
        "CAMBRICON_SPLIT_MEMS": "4096",
    }
    assert plan.done and plan.annotations[TO_ALLOC] == ";"


async def test_gos_whole_card_is_its_memory_in_whole_units(tmp_path: Path) -> None:
    """Go gives 100 % of a card the memory of its advertised units: 91 x 256 = 23296 MiB of
    the MLU370-X4's 23308; that is the whole card (no split), as this scheduler's 23308."""
    backend, cards = await _agent(tmp_path)
    plan = plan_allocation(go_pod(f"{NODE}-cambricon-mlu-0,MLU,23296,100:;"), backend, [1], cards)
    assert plan.containers[0].allocation.envs == {
        "CAMBRICON_SPLIT_VISIBLE_DEVICES": "0",
        "CAMBRICON_SPLIT_MEMS": "23296",
    }
    assert [d.uuid for d in plan.containers[0].devices] == [X4_0]


async def test_this_schedulers_uuids_are_still_read(tmp_path: Path) -> None:
    backend, cards = await _agent(tmp_path)
    plan = plan_allocation(go_pod(f"{X4_1},MLU,2048,0:;", profile=None), backend, [1], cards)
    assert plan.containers[0].allocation.envs["CAMBRICON_SPLIT_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize(
    ("value", "profile", "said"),
    [
        (f"{NODE}-cambricon-mlu-2,MLU,1024,0:;", "0_0_4", r"names card 2, the node has 2"),
        (f"{NODE}-cambricon-mlu-x,MLU,1024,0:;", "0_0_4", r"does not end in a card index"),
        (f"{NODE}-cambricon-mlu-01,MLU,1024,0:;", "0_0_4", r"does not end in a card index"),
        (f"{NODE}-cambricon-mlu-0,MLU,1024,0:;", "zero", r"CAMBRICON_DSMLU_PROFILE 'zero'"),
        (f"{NODE}-cambricon-mlu-0,MLU,1024,0:;", "5_0_4", r"names card 5, the node has 2"),
        (f"{NODE}-cambricon-mlu-0,MLU,1024,0:;", "0_-1_4", r"is not \{card index\}"),
        # another node's card: not a card of this node
        ("other-cambricon-mlu-0,MLU,1024,0:;", "0_0_4", r"device other-cambricon-mlu-0 is not"),
        # more memory than the card has
        (f"{NODE}-cambricon-mlu-0,MLU,99999,0:;", "0_0_4", r"memory 99999 MiB on device MLU-"),
    ],
)
async def test_malformed_go_values_fail_naming_the_pod(
    tmp_path: Path, value: str, profile: str, said: str
) -> None:
    backend, cards = await _agent(tmp_path)
    with pytest.raises(AllocateError, match=said) as caught:
        plan_allocation(go_pod(value, profile), backend, [1], cards)
    assert caught.value.pod == "ml/infer"
    assert "hami: pod ml/infer:" in str(caught.value)
    assert "delete the pod and create it again" in str(caught.value)
