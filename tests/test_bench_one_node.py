"""bench/_one_node.py's bookkeeping: the steps a watch event marks, and the figures made
of them (the marginal cost of an extra pod, the median of each step of the chain)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def one_node(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("_one_node")


def pod(name: str, phase: str = "Pending", node: str = "", bind: str = "") -> dict[str, Any]:
    annotations = {"hami.io/bind-phase": bind} if bind else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def node(lock_pod: str) -> dict[str, Any]:
    value = f"2026-12-03T19:00:00Z,ns,{lock_pod}" if lock_pod else None
    annotations = {"hami.io/mutex.lock": value} if value else {}
    return {"metadata": {"name": "gpu-one", "annotations": annotations}}


def test_watch_events_mark_each_step_once_at_its_first_arrival(one_node: ModuleType) -> None:
    timeline = one_node.Timeline()
    timeline.on_pod("ADDED", pod("a"), 1.0)
    timeline.on_node(node("a"), 2.0)
    timeline.on_pod("MODIFIED", pod("a", bind="allocating"), 3.0)
    timeline.on_pod("MODIFIED", pod("a", node="gpu-one", bind="allocating"), 4.0)
    timeline.on_pod("MODIFIED", pod("a", node="gpu-one", bind="success"), 5.0)
    timeline.on_pod("MODIFIED", pod("a", "Running", "gpu-one", "success"), 6.0)
    timeline.on_pod("MODIFIED", pod("a", "Running", "gpu-one", "success"), 9.0)
    timeline.on_node(node("b"), 7.0)  # the next pod's lock replaces a's
    assert timeline.marks["a"] == {
        "created": 1.0,
        "locked": 2.0,
        "allocating": 3.0,
        "bound": 4.0,
        "success": 5.0,
        "running": 6.0,
        "released": 7.0,
    }
    assert timeline.marks["b"] == {"locked": 7.0}


def test_claims_mark_their_owner_pod(one_node: ModuleType) -> None:
    timeline = one_node.Timeline()
    claim: dict[str, Any] = {
        "metadata": {"ownerReferences": [{"kind": "Pod", "name": "d"}]},
        "status": {},
    }
    timeline.on_claim(claim, 1.0)
    timeline.on_claim({**claim, "status": {"allocation": {"devices": {}}}}, 2.0)
    assert timeline.marks["d"] == {"claimed": 1.0, "allocated": 2.0}


def test_marginal_cost_and_chain_of_the_extra_pods(one_node: ModuleType) -> None:
    steps = {
        "p0": {"locked": 0.00, "bound": 0.02, "running": 0.05, "released": 0.06},
        "p1": {"locked": 0.07, "bound": 0.09, "running": 0.12, "released": 0.13},
        "p2": {"locked": 0.15, "bound": 0.17, "running": 0.21, "released": 0.22},
    }
    burst = one_node.Burst(["p2", "p0", "p1"], steps, True)
    assert burst.order() == ["p0", "p1", "p2"]
    assert one_node.marginal(burst) == pytest.approx(0.08)
    assert one_node.spacing(burst.running()) == pytest.approx([0.07, 0.09])
    chain = one_node.chain(
        burst,
        (("prev.released", "locked", "wait"), ("locked", "bound", "bind"), ("x", "y", "none")),
    )
    assert chain[0][0] == "wait" and chain[0][1] == pytest.approx(0.015) and chain[0][2] == 2
    assert chain[1][1] == pytest.approx(0.02)
    assert chain[2][2] == 0
