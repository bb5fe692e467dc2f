"""Idle resident memory of ``hami run --role node`` (fake backend) and what it imports.

    .venv/bin/python bench/bench_node_rss.py               # 3 agent processes, one at a time
    .venv/bin/python bench/bench_node_rss.py --runs 5 --settle 5

What runs: etcd + kube-apiserver (``hami.testkit.ControlPlane``, loopback only), a Node
object, and ``hami run --role node`` as its own process with the ``fake`` backend (8
devices), started ``--runs`` times in turn. Each run waits for the agent's first
registration (the Node annotation and the device-plugin socket), lets it idle ``--settle``
seconds, then reads its VmRSS. The last run is started with ``python -X importtime`` to
count the modules it imported, list the top-level packages with their cumulative import
time and say whether the demo, the test kit or kubernetes_asyncio's generated client were
imported (``hami run --role node`` imports none of them). The load average is printed
with the figures (the machine may be shared).

A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hami import log
from hami.kube.client import Kube, open_client
from hami.kube.raw import KubeError
from hami.testkit.cluster import poll
from hami.testkit.controlplane import ControlPlane, free_port

REGISTER = "hami.io/node-nvidia-register"
WATCHED = (
    "hami.demo",
    "hami.testkit",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio",
    "grpclib",
    "aiohttp",
    "yaml",
)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def write_config(work: Path, node: str) -> Path:
    cfg = {
        "log": {"level": "warning", "format": "json"},
        "node": {
            "register_period": "30s",
            "device_plugin_dir": str(work / "plugins"),
            "http": {"address": "127.0.0.1", "port": free_port()},
        },
        "backends": {
            "nvidia": {"enabled": False},
            "fake": {
                "enabled": True,
                "devices": [{"count": 8, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960}],
                "uuid_prefix": f"GPU-{node}",
                "hamicore": {"containers_dir": str(work / "containers")},
            },
        },
    }
    path = work / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def spawn(
    plane: ControlPlane, work: Path, node: str, importtime: bool
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``hami run --role node`` in its own session, output to a file in ``work``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg = write_config(work, node)
    with_x = ["-X", "importtime"] if importtime else []
    argv = [sys.executable, *with_x, "-m", "hami", "run", "--role", "node", "--config", str(cfg)]
    argv += ["--kubeconfig", str(plane.kubeconfig), "--node-name", node]
    log_path = work / "agent.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log_path


async def one_run(
    kube: Kube, plane: ControlPlane, work: Path, node: str, settle: float, importtime: bool
) -> tuple[float, float, str]:
    """Start the agent, wait for its registration, idle, read RSS; (rss MiB, start s, log)."""
    # the previous run's registration must not count as this one's
    await kube.patch_node_annotations(node, {REGISTER: None})
    began = time.perf_counter()
    proc, log_path = spawn(plane, work, node, importtime)
    socket = work / "plugins" / "hami-nvidia.sock"
    try:

        async def registered() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited ({proc.returncode}): {log_path.read_text()}")
            annotations = (await kube.get_node(node))["metadata"].get("annotations") or {}
            return socket.exists() and REGISTER in annotations

        await poll(registered, 60, "the agent process to register", interval=0.05)
        startup = time.perf_counter() - began
        await asyncio.sleep(settle)
        rss = rss_mib(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait, 5)
    return rss, startup, log_path.read_text(errors="replace")


def imports(text: str) -> dict[str, float]:
    """Top-level packages (and the WATCHED ones) from ``-X importtime``: cumulative ms."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not cumulative.isdigit():
            continue
        top = name.split(".")[0]
        ms = int(cumulative) / 1000
        if name in WATCHED:
            out[name] = max(out.get(name, 0.0), ms)
        if name == top:
            out[top] = max(out.get(top, 0.0), ms)
    return out


def module_count(text: str) -> int:
    """Modules imported, from ``-X importtime`` (one line each, after its header)."""
    return sum(1 for line in text.splitlines() if line.startswith("import time:")) - 1


async def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hb-rss-", dir="/tmp"))
    plane: ControlPlane | None = None
    node = "bench-rss"
    try:
        plane = ControlPlane()
        await asyncio.to_thread(plane.start)
        async with open_client(plane.kubeconfig) as kube:
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
            try:
                await kube.request("POST", "/api/v1/nodes", body=body)
            except KubeError as exc:
                if exc.status != 409:
                    raise
            rss: list[float] = []
            starts: list[float] = []
            text = ""
            for i in range(args.runs):
                last = i == args.runs - 1
                value, startup, text = await one_run(
                    kube, plane, work / str(i), node, args.settle, importtime=last
                )
                if not last or args.runs == 1:
                    rss.append(value)
                starts.append(startup)
        print(
            f"== hami run --role node, fake backend (8 devices), idle {args.settle:g}s after "
            f"its first registration; {len(rss)} runs (+1 with -X importtime, not counted)"
        )
        print(
            f"idle RSS: median {statistics.median(rss):.1f} MiB (min {min(rss):.1f}, "
            f"max {max(rss):.1f}); registered {statistics.median(starts):.2f}s after exec"
        )
        found = imports(text)
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"modules imported: {module_count(text)}")
        for name in ("hami.demo", "hami.testkit", "kubernetes_asyncio.client"):
            print(f"{name} imported: {'YES' if name in found else 'no'}")
        heavy = sorted(found.items(), key=lambda kv: -kv[1])[: args.top]
        print("largest imports (cumulative import time, ms): ")
        print("  " + ", ".join(f"{name} {ms:.0f}" for name, ms in heavy))
    finally:
        if plane is not None:
            await asyncio.to_thread(plane.stop)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="agent starts (the last one traced)")
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds before reading")
    parser.add_argument("--top", type=int, default=12, help="how many imports to list")
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
