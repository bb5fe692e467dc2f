"""This scheduler keeps a soft-split Ascend pod (``huawei.com/vnpu-mode: hami-core``) off
nodes that do not offer the soft split, as Go HAMi 2.10's Ascend ``Fit`` does (ModeNotFit):
a node offers it only with ``hami-vnpu-core: "true"`` (``"false"``, another value or none:
Go's chart default ``hamiVnpuCore: false``). VNPU-template pods go to every node. This
project's Ascend agent writes ``"false"`` and refuses soft-split pods at Allocate, so such a
pod is never placed where it would fail."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from hami import config
from hami.backends import registry
from hami.core.fit import MODE_NOT_FIT
from hami.core.requests import DeviceKind
from hami.scheduler.clock import Clock
from hami.scheduler.service import Scheduler

WORD = "Ascend910B3"
NOW = datetime(2026, 1, 2, 3, 4, 10, tzinfo=UTC)
KIND = DeviceKind.from_backend(registry.create(WORD))


def node(name: str, offer: str | None) -> dict[str, Any]:
    chips = [
        {
            "id": f"{name}-npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": WORD,
            "health": True,
        }
        for i in range(2)
    ]
    annotations = {
        f"hami.io/node-handshake-{WORD}": "Reported_2026.01.02 03:04:05",
        f"hami.io/node-register-{WORD}": json.dumps(chips),
    }
    if offer is not None:
        annotations["hami-vnpu-core"] = offer
    capacity = {f"huawei.com/{WORD}": "8", "cpu": "8", "memory": "64Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def pod(soft: bool) -> dict[str, Any]:
    annotations = {"huawei.com/vnpu-mode": "hami-core"} if soft else {}
    limits = {f"huawei.com/{WORD}": "1", f"huawei.com/{WORD}-memory": "4096"}
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u", "annotations": annotations},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


async def _filter(nodes: list[dict[str, Any]], the_pod: dict[str, Any]) -> dict[str, Any]:
    settings = config.from_mapping({}, env={}).scheduler
    scheduler = Scheduler(settings, [KIND], None, clock=Clock(now=lambda: NOW), emit_events=False)
    for obj in nodes:
        scheduler.on_node("ADDED", obj)
    names = [n["metadata"]["name"] for n in nodes]
    return await scheduler.filter({"Pod": the_pod, "NodeNames": names})


@pytest.mark.parametrize("offer", ["false", None, "yes", "True"])
def test_a_soft_split_pod_keeps_off_nodes_without_the_offer(offer: str | None) -> None:
    nodes = [node("npu-off", offer), node("npu-on", "true")]
    answer = asyncio.run(_filter(nodes, pod(soft=True)))
    assert answer["NodeNames"] == ["npu-on"], answer
    alone = asyncio.run(_filter([node("npu-off", offer)], pod(soft=True)))
    assert not alone["NodeNames"], alone
    assert MODE_NOT_FIT in alone["FailedNodes"]["npu-off"], alone


def test_with_no_node_offering_it_the_soft_split_pod_fits_nowhere() -> None:
    answer = asyncio.run(_filter([node("npu-a", "false"), node("npu-b", None)], pod(soft=True)))
    assert not answer["NodeNames"], answer
    assert all(MODE_NOT_FIT in why for why in answer["FailedNodes"].values()), answer


def test_a_template_pod_goes_to_every_node() -> None:
    answer = asyncio.run(_filter([node("npu-off", "false")], pod(soft=False)))
    assert answer["NodeNames"] == ["npu-off"], answer


def test_a_node_that_starts_offering_it_takes_the_pod() -> None:
    """The offer is read again when the Node changes (the register value did not)."""

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        settings = config.from_mapping({}, env={}).scheduler
        scheduler = Scheduler(
            settings, [KIND], None, clock=Clock(now=lambda: NOW), emit_events=False
        )
        off = node("npu-x", "false")
        scheduler.on_node("ADDED", off)
        before = await scheduler.filter({"Pod": pod(soft=True), "NodeNames": ["npu-x"]})
        on = copy.deepcopy(off)
        on["metadata"]["annotations"]["hami-vnpu-core"] = "true"
        scheduler.on_node("MODIFIED", on)
        after = await scheduler.filter({"Pod": pod(soft=True), "NodeNames": ["npu-x"]})
        return before, after

    before, after = asyncio.run(run())
    assert not before["NodeNames"] and MODE_NOT_FIT in before["FailedNodes"]["npu-x"], before
    assert after["NodeNames"] == ["npu-x"], after
