"""``hami demo``: a local cluster with simulated GPU nodes, sample pods and a placement table.

It starts etcd, kube-apiserver and kube-scheduler as local processes (building them first
when they are missing and ``tests/controlplane/build.sh`` is at hand), the hami scheduler
role as kube-scheduler's extender, three simulated GPU nodes shared by HAMi-core (hami node
agent with the ``fake`` backend + a kubelet emulator each), one whose agent runs the NVIDIA
backend in ``operating_mode: mig`` on the fake NVML (an A100 in MIG mode), and one Ascend
node whose agent runs the Ascend backend over a stand-in ``npu-smi`` (two 910B3 chips; the
kubelet emulator starts its pod with the vNPU template Ascend Docker Runtime reads). Then it
submits a mix of device pods,
waits for them, prints where each landed and how its device is shared, and why the one that
cannot fit stays Pending, and shuts everything down (``--keep``: keeps it running until
Ctrl-C and prints the kubeconfig).
``--mode dra`` submits the same HAMi-core pods, unchanged, to a DRA-mode cluster instead
(hami.demo.dra): hami's webhook turns them into claims, kube-scheduler alone places them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from hami import log
from hami.demo.placement import placement_rows, table
from hami.demo.samples import UNFIT as UNFIT
from hami.demo.samples import samples
from hami.testkit.ascend_node import AscendNodeSpec
from hami.testkit.cluster import (
    DEMO_ASCEND_NODE,
    DEMO_MIG_NODE,
    DEMO_NODES,
    LocalCluster,
    NodeSpec,
    Timing,
    phase_of,
    poll,
)
from hami.testkit.controlplane import FIX_HINT, ControlPlane, ControlPlaneError, find_binaries

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "controlplane" / "build.sh"
#: the extender demo's nodes: HAMi-core ones and the MIG one
EXTENDER_NODES: tuple[NodeSpec, ...] = (*DEMO_NODES, DEMO_MIG_NODE)


# --------------------------------------------------------------------------- output


class Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.began = time.monotonic()

    def __call__(self, line: str) -> None:
        print(f"[{time.monotonic() - self.began:5.1f}s] {line}", file=self.out, flush=True)

    def raw(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)


# --------------------------------------------------------------------------- the demo


async def run_demo(
    out: TextIO,
    *,
    keep: bool = False,
    plane: ControlPlane | None = None,
    nodes: Sequence[NodeSpec] | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109
    mode: str = "extender",
    ascend: Sequence[AscendNodeSpec] = (DEMO_ASCEND_NODE,),
) -> int:
    """``nodes``: the simulated GPU nodes (default: ``EXTENDER_NODES``, in DRA mode
    ``DEMO_NODES``); ``ascend``: the Ascend nodes (extender mode only; the samples expect
    ``DEMO_ASCEND_NODE``)."""
    say = Printer(out)
    if mode == "dra":
        from hami.demo.dra import run_dra_demo

        return await run_dra_demo(
            out,
            say,
            plane=plane,
            nodes=DEMO_NODES if nodes is None else nodes,
            timeout=timeout,
            keep=_wait_for_signal if keep else None,
        )
    work = samples(ascend_agent=all(spec.agent for spec in ascend))
    cluster = LocalCluster(
        EXTENDER_NODES if nodes is None else nodes,
        plane=plane,
        timing=Timing(),
        progress=say,
        ascend=ascend,
    )
    async with cluster:
        say(f"submitting {len(work)} sample pods to namespace {cluster.namespace} ...")
        for sample in work:
            await cluster.create_pod(sample.pod)
        fitting = [s.name for s in work if s.name != UNFIT and s.started]
        pods = await cluster.wait_running(fitting, timeout=timeout)
        bound = [s.name for s in work if not s.started]
        for name in bound:
            pods[name] = await cluster.wait_pod(name, _bound, timeout=timeout)
        held = f", {len(bound)} bound to the Ascend stand-in" if bound else ""
        say(
            f"{len(fitting)} pods started{held}; waiting for the scheduler's verdict on {UNFIT} ..."
        )
        reason = await _filtering_failed(cluster, UNFIT, timeout)
        pods[UNFIT] = await cluster.get_pod(UNFIT)
        say.raw()
        order = [(s.name, s.request) for s in work]
        for line in table(placement_rows(pods, order, cluster.model_of)):
            say.raw("  " + line)
        say.raw()
        for name in bound:
            say.raw(
                f"{name} is Bound: this scheduler placed it and wrote the decision HAMi's "
                "ascend-device-plugin reads; its node is a stand-in annotated as that plug-in "
                "would, with no kubelet or agent, so nothing starts it here."
            )
            say.raw()
        say.raw(f"{UNFIT} is {phase_of(pods[UNFIT])}: {reason}")
        assert cluster.role is not None
        nodes_reasons = cluster.role.scheduler.explain_pod(pods[UNFIT]).get("nodes") or {}
        for node in sorted(nodes_reasons):
            say.raw(f"  {node}: {nodes_reasons[node]}")
        say.raw()
        if keep:
            say.raw(f"the cluster keeps running; kubeconfig: {cluster.kubeconfig}")
            say.raw(f"  kubectl --kubeconfig {cluster.kubeconfig} -n {cluster.namespace} get pods")
            say.raw(f"  {explain_command(cluster.namespace, cluster.kubeconfig, cluster.port)}")
            say.raw("press Ctrl-C to stop it")
            await _wait_for_signal()
        say("shutting down ...")
    say("done")
    return 0


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


async def _filtering_failed(cluster: LocalCluster, name: str, timeout: float) -> str:  # noqa: ASYNC109
    found: list[str] = []

    async def seen() -> bool:
        found[:] = [
            str(e.get("message") or "")
            for e in await cluster.events(name)
            if e.get("reason") == "FilteringFailed"
        ]
        return bool(found)

    await poll(seen, timeout, f"the FilteringFailed event of {name}")
    return found[-1]


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def ensure_binaries(out: TextIO, build: bool) -> bool:
    """True when etcd, kube-apiserver and kube-scheduler are there (building them if we
    may); otherwise prints what to do."""
    try:
        find_binaries()
        return True
    except ControlPlaneError as exc:
        missing = str(exc)
    if not build or not BUILD_SCRIPT.is_file():
        print(f"hami demo: {missing}", file=out)
        return False
    print(
        "hami demo: the control plane binaries are missing; building them now with "
        f"{BUILD_SCRIPT} (needs Go; a cold build takes about 7 minutes on 2 cores) ...",
        file=out,
        flush=True,
    )
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.DEVNULL)
    if result.returncode != 0:
        print(f"hami demo: the build failed (exit {result.returncode}); {FIX_HINT}", file=out)
        return False
    try:
        find_binaries()
    except ControlPlaneError as exc:
        print(f"hami demo: {exc}", file=out)
        return False
    return True


def explain_command(namespace: str, kubeconfig: str | Path, port: int) -> str:
    """The ``hami explain`` line to print: this interpreter's, so no venv need be activated."""
    argv = [sys.executable, "-m", "hami", "explain", UNFIT, "-n", namespace]
    argv += ["--kubeconfig", str(kubeconfig), "--url", f"http://127.0.0.1:{port}"]
    return shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    log.configure(args.log_level, "console")
    if not ensure_binaries(out, build=not args.no_build):
        return 2
    try:
        return asyncio.run(run_demo(out, keep=args.keep, mode=getattr(args, "mode", "extender")))
    except ControlPlaneError as exc:
        print(f"hami demo: the control plane did not start: {exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:
        print(f"hami demo: {exc}", file=sys.stderr)
        return 1
