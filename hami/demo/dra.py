"""``hami demo --mode dra``: the same sample workloads, placed by kube-scheduler alone.

The node agents publish ResourceSlices (fake backend in ``mode: dra``), the pods name
ResourceClaimTemplates instead of ``nvidia.com/*`` limits, kube-scheduler's DynamicResources
plugin allocates slices of shared devices (consumable capacity), and each kubelet emulator
prepares the claims through its node's DRA plugin. The table shows what every container
gets from the CDI spec: the HAMi-core limits the extender mode gives the same request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from hami.testkit.cluster import DEMO_NODES, LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claim_template, dra_pod, percent_template, templates_path

UNFIT = "too-big"


@dataclass(frozen=True)
class DRASample:
    name: str
    request: str  # what it asks for, in words
    templates: list[str]  # one per container
    init: list[str] = field(default_factory=list)
    note: str = ""  # how it differs from the extender mode's sample


def templates(nodes: Sequence[NodeSpec]) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates the samples use (docs/dra.md "Requests")."""
    models = {str(g["model"]): int(g["memory"]) for n in nodes for g in n.devices}
    return [
        claim_template("whole-a100", model="A100"),
        claim_template("mem-3000", mem=3000),
        percent_template("half-mem-30-cores", models, 50, cores=30),
        claim_template("two-x-8000", count=2, mem=8000, cores=50),
        claim_template("mem-4000", mem=4000),
        claim_template("mem-2000", mem=2000),
        claim_template("mem-6000", mem=6000),
        claim_template("v100-10000", mem=10000, cores=25, model="V100"),
        claim_template("mem-64000", mem=64000),
    ]


def samples() -> list[DRASample]:
    return [
        DRASample("train-a100", "1 whole A100", ["whole-a100"]),
        DRASample("infer-small", "3000 MiB", ["mem-3000"]),
        DRASample(
            "infer-half",
            "50% memory, 30% cores",
            ["half-mem-30-cores"],
            note="50% as a per-model list (firstAvailable)",
        ),
        DRASample("multi-gpu", "2 GPUs x 8000 MiB, 50% cores", ["two-x-8000"]),
        DRASample("sidecars", "2 containers: 4000 + 2000 MiB", ["mem-4000", "mem-2000"]),
        DRASample(
            "with-init",
            "init 2000 MiB, then 6000 MiB",
            ["mem-6000"],
            init=["mem-2000"],
            note="the init claim is held for the pod's life",
        ),
        DRASample("on-v100", "10000 MiB on a V100 (CEL selector)", ["v100-10000"]),
        DRASample(
            "spread-me",
            "2000 MiB (no per-pod node policy in DRA)",
            ["mem-2000"],
            note="kube-scheduler's own scoring",
        ),
        DRASample(UNFIT, "64000 MiB (no GPU is that large)", ["mem-64000"]),
    ]


def _limits(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(uuid, memory MiB, cores %) per device, from a container's HAMi-core environment."""
    uuids = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
    cores = env.get("CUDA_DEVICE_SM_LIMIT", "0")
    out = []
    for i, uuid in enumerate(uuids):
        memory = re.sub(r"m$", "", env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "?"))
        out.append((uuid, memory, cores))
    return out


async def placement_rows(
    cluster: LocalCluster, pods: Mapping[str, Mapping[str, Any]], order: Sequence[DRASample]
) -> list[list[str]]:
    rows = [["POD", "REQUEST", "NODE", "DEVICE", "MODEL", "MEMORY MiB", "CORES %", "STATUS"]]
    for sample in order:
        pod = pods[sample.name]
        node = str((pod.get("spec") or {}).get("nodeName") or "-")
        status = phase_of(pod)
        lines: list[list[str]] = []
        if node != "-" and status == "Running":
            adm = await cluster.admission(pod)
            names = [f"init{i}" for i in range(len(sample.init))]
            names += [f"c{i}" for i in range(len(sample.templates))]
            for cname in names:
                for uuid, memory, cores in _limits(adm.envs.get(cname, {})):
                    who = sample.name if len(names) == 1 else f"{sample.name}/{cname}"
                    model = cluster.model_of(uuid).removeprefix("NVIDIA-")
                    lines.append([who, sample.request, node, uuid, model, memory, cores, status])
        if not lines:
            lines.append([sample.name, sample.request, node, "-", "-", "-", "-", status])
        for i, line in enumerate(lines):
            if i:
                line[1] = ""
            rows.append(line)
    return rows


async def _failed_scheduling(cluster: LocalCluster, name: str, timeout: float) -> str:  # noqa: ASYNC109
    found: list[str] = []

    async def seen() -> bool:
        found[:] = [
            str(e.get("message") or "")
            for e in await cluster.events(name)
            if e.get("reason") == "FailedScheduling"
        ]
        return bool(found)

    await poll(seen, timeout, f"the FailedScheduling event of {name}")
    return found[-1]


async def run_dra_demo(
    out: TextIO,
    say: Any,
    table: Any,
    *,
    plane: ControlPlane | None = None,
    nodes: Sequence[NodeSpec] = DEMO_NODES,
    timeout: float = 60.0,  # noqa: ASYNC109
    keep: Any = None,
) -> int:
    work = samples()
    async with LocalCluster(
        nodes, plane=plane, timing=Timing(), progress=say, mode="dra"
    ) as cluster:
        say(f"creating {len(templates(nodes))} ResourceClaimTemplates in {cluster.namespace} ...")
        for body in templates(nodes):
            await cluster.kube.create(templates_path(cluster.namespace), body)
        say(f"submitting {len(work)} sample pods (claims, no nvidia.com/* limits) ...")
        for sample in work:
            await cluster.create_pod(dra_pod(sample.name, sample.templates, init=sample.init))
        fitting = [s.name for s in work if s.name != UNFIT]
        pods = await cluster.wait_running(fitting, timeout=timeout)
        say(f"{len(fitting)} pods started; waiting for kube-scheduler's verdict on {UNFIT} ...")
        reason = await _failed_scheduling(cluster, UNFIT, timeout)
        pods[UNFIT] = await cluster.get_pod(UNFIT)
        say.raw()
        say.raw("placed by kube-scheduler alone (DRA); limits as the containers get them (CDI):")
        for line in table(await placement_rows(cluster, pods, work)):
            say.raw("  " + line)
        say.raw()
        for sample in work:
            if sample.note:
                say.raw(f"  {sample.name}: {sample.note}")
        say.raw()
        say.raw(f"{UNFIT} is {phase_of(pods[UNFIT])}: {reason}")
        say.raw()
        if keep is not None:
            say.raw(f"the cluster keeps running; kubeconfig: {cluster.kubeconfig}")
            say.raw(
                f"  kubectl --kubeconfig {cluster.kubeconfig} -n {cluster.namespace} "
                "get pods,resourceclaims"
            )
            say.raw("press Ctrl-C to stop it")
            await keep()
        say("shutting down ...")
    say("done")
    return 0
