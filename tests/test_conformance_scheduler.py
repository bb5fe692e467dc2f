"""Conformance of the scheduler's watch handlers and handshake pass to protocol.md
sections 1 and 2."""

from __future__ import annotations

from typing import Any

from _core_helpers import MLU, NOW, NVIDIA, node, register
from structlog.testing import capture_logs

from hami.config import Config
from hami.scheduler.service import Clock, Scheduler


def scheduler() -> Scheduler:
    return Scheduler(
        Config().scheduler, [NVIDIA, MLU], None, clock=Clock(now=lambda: NOW), emit_events=False
    )


def two_types(nvidia: str, rv: str, shake: str = "Reported_2024-05-20 09:59:00") -> dict[str, Any]:
    obj = node("n", nvidia, shake=shake, rv=rv)
    obj["metadata"]["annotations"].update(
        {
            "hami.io/node-mlu-register": register(["MLU-a"], model="MLU-MLU370-X4", cores=0),
            "hami.io/node-handshake-mlu": shake,
        }
    )
    return obj


def test_malformed_register_logs_one_error_naming_node_key_and_reason() -> None:
    sched = scheduler()
    with capture_logs() as logs:
        sched.on_node("ADDED", two_types("GPU-a,10,lots,100,M,0,true:", "1"))
        # The next heartbeats carry the same bad value: no new log.
        sched.on_node("MODIFIED", two_types("GPU-a,10,lots,100,M,0,true:", "2", "Requesting_x"))
        sched.on_node("MODIFIED", two_types("GPU-a,10,lots,100,M,0,true:", "3"))
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["node"] == "n"
    assert "hami.io/node-nvidia-register" in errors[0]["error"]
    assert "memory is not an integer" in errors[0]["error"]
    types = sched.cluster.nodes["n"].types
    assert types["mlu"].available and not types["nvidia"].available
