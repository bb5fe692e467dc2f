"""``hami demo --mode dra``: the extender demo's HAMi-core pods, unchanged, placed by
kube-scheduler alone.

The node agents publish ResourceSlices (fake backend in ``mode: dra``); hami's webhook turns
each pod's ``nvidia.com/*`` limits into a ResourceClaimTemplate with one request per
container (docs/dra.md "Unchanged HAMi pods"); kube-scheduler's DynamicResources plugin
allocates slices of shared devices (consumable capacity) and each kubelet emulator prepares
the claims through its node's DRA plugin. The extender demo's MIG pods
(``vgpu-mode: mig``, which the webhook does not convert) are written as what they are in
this mode: a claim for the same MIG profile by CEL, on the A100 in MIG mode whose agent
publishes its partitions (docs/dra.md "MIG GPUs: partitionable devices"). The table is the
extender demo's, read from the allocated claims; the pod that cannot fit gets
``hami explain``'s answer for claims.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from hami.demo import claimrows
from hami.demo.placement import table
from hami.demo.samples import UNFIT, Sample, hami_core_samples, samples
from hami.dra.names import MIG_PROFILE
from hami.scheduler import draexplain
from hami.testkit.cluster import (
    DEMO_MIG_NODE,
    DEMO_NODES,
    LocalCluster,
    NodeSpec,
    Timing,
    phase_of,
    poll,
)
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import dra_pod, templates_path
from hami.testkit.mig_node import mig_backend

RESOURCE_API = "/apis/resource.k8s.io/v1"
DRIVER = "nvidia.hami.io"
#: the extender demo's MIG pods -> the profile its scheduler picks for them (the smallest
#: that holds the memory), asked here by CEL
MIG_PROFILES = {"mig-small": "1g.5gb", "mig-large": "3g.20gb"}
#: the MIG node: its agent runs the NVIDIA backend over the fake NVML, in ``mode: dra``
DRA_MIG_NODE = NodeSpec(DEMO_MIG_NODE.name, DEMO_MIG_NODE.devices)
#: why the extender demo's other pods are not submitted here (one line each)
LEFT_OUT = {"npu-vnpu": "an Ascend vNPU: this project has no Ascend DRA driver"}


@dataclass(frozen=True)
class MigClaim:
    """An extender-demo MIG pod, as a claim for its profile."""

    name: str
    request: str
    profile: str

    @property
    def template(self) -> str:
        return f"mig-{self.profile.replace('.', '-')}"


def mig_claims() -> list[MigClaim]:
    by_name = {s.name: s for s in samples()}
    return [
        MigClaim(name, f"MIG {profile} by CEL ({by_name[name].request.split(' (')[0]})", profile)
        for name, profile in MIG_PROFILES.items()
    ]


def mig_template(claim: MigClaim) -> dict[str, Any]:
    """A ResourceClaimTemplate for one partition of ``claim.profile``."""
    # has() first: on a shared device the attribute is missing, and kube-scheduler stops
    # at a CEL error instead of passing the device over
    attribute = f'device.attributes["{DRIVER}"].{MIG_PROFILE}'
    expression = f'has({attribute}) && {attribute} == "{claim.profile}"'
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression": expression}}],
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": claim.template},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def left_out() -> list[Sample]:
    """The extender demo's pods this mode does not submit in any form."""
    here = {s.name for s in hami_core_samples()} | set(MIG_PROFILES)
    return [s for s in samples() if s.name not in here]


def dra_nodes(nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """The demo's nodes: ``nodes`` and the MIG node."""
    return [*nodes, DRA_MIG_NODE]


def make_mig_node(cluster: LocalCluster) -> None:
    """Give the MIG node its backend: NVIDIA over the fake NVML, GPUs in MIG mode (the test
    kit starts it as its DRA nodes, under the backend key ``fake``)."""
    node = cluster.nodes[DRA_MIG_NODE.name]
    node.backend = mig_backend(DRA_MIG_NODE.devices, node.uuid_prefix, node.dir)
    # no usage monitor, as on the extender demo's MIG node: a MIG instance has no
    # HAMi-core files and the GPU no utilization to read
    monitor = dataclasses.replace(node.cfg.node.monitor, enabled=False)
    node.cfg = dataclasses.replace(
        node.cfg, node=dataclasses.replace(node.cfg.node, monitor=monitor)
    )


async def _instances(cluster: LocalCluster, pod: Mapping[str, Any]) -> claimrows.Instances:
    """What each container sees of its MIG devices (the CDI environment)."""
    envs = (await cluster.admission(pod)).envs
    return {
        name: [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u.startswith("MIG-")]
        for name, env in envs.items()
    }


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


async def _claims(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    path = f"{RESOURCE_API}/namespaces/{cluster.namespace}/resourceclaims"
    items, _ = await cluster.kube.list_all(path)
    return {str(c["metadata"]["name"]): c for c in items}


async def _devices(cluster: LocalCluster) -> dict[claimrows.DeviceKey, claimrows.SliceDevice]:
    items, _ = await cluster.kube.list_all(f"{RESOURCE_API}/resourceslices")
    return claimrows.slice_devices(items)


def explain_lines(answer: Mapping[str, Any] | None, nodes: Iterable[str]) -> list[str]:
    """``hami explain``'s answer for claims, on ``nodes`` only (the shared API server may
    hold other clusters' nodes): the requests it waits on, each node's reasons."""
    if answer is None:
        return ["hami explain: the pod names no claim of a hami DeviceClass"]
    if answer.get("error"):
        return [f"hami explain: {answer['error']}"]
    lines = [f"hami explain (claims): waits on {'; '.join(answer.get('requests') or [])}"]
    details: Mapping[str, Sequence[str]] = answer.get("details") or {}
    verdicts: Mapping[str, str] = answer.get("nodes") or {}
    for node in sorted(set(nodes) & set(verdicts)):
        reasons = list(details.get(node) or [verdicts[node]])
        lines.append(f"  {node}: {reasons[0]}")
        lines.extend(f"  {' ' * len(node)}  {r}" for r in reasons[1:])
    return lines


def _unchanged(cluster: LocalCluster, sample: Sample) -> dict[str, Any]:
    """The sample's pod as the extender demo submits it, plus the label the test kit's
    webhook selects its own pods by (other tests share the API server)."""
    pod = copy.deepcopy(sample.pod)
    pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **cluster.node_selector}
    return pod


async def run_dra_demo(
    out: TextIO,
    say: Any,
    *,
    plane: ControlPlane | None = None,
    nodes: Sequence[NodeSpec] = DEMO_NODES,
    timeout: float = 60.0,  # noqa: ASYNC109
    keep: Callable[[], Awaitable[None]] | None = None,
) -> int:
    work = hami_core_samples()
    migs = mig_claims()
    cluster = LocalCluster(
        dra_nodes(nodes), plane=plane, timing=Timing(), progress=say, mode="dra", webhook=True
    )
    make_mig_node(cluster)
    async with cluster:
        say(
            f"submitting {len(work)} sample pods unchanged (nvidia.com/* limits) to "
            f"{cluster.namespace}; hami's webhook turns each into a claim ..."
        )
        for sample in work:
            await cluster.create_pod(_unchanged(cluster, sample))
        say(f"submitting {len(migs)} MIG pods as claims for their profile (CEL) ...")
        for mig in migs:
            await cluster.kube.create(templates_path(cluster.namespace), mig_template(mig))
            await cluster.create_pod(dra_pod(mig.name, [mig.template]))
        fitting = [s.name for s in work if s.name != UNFIT] + [m.name for m in migs]
        pods = await cluster.wait_running(fitting, timeout=timeout)
        say(f"{len(fitting)} pods started; waiting for kube-scheduler's verdict on {UNFIT} ...")
        reason = await _failed_scheduling(cluster, UNFIT, timeout)
        pods[UNFIT] = await cluster.get_pod(UNFIT)
        claims, devices = await _claims(cluster), await _devices(cluster)
        instances = {m.name: await _instances(cluster, pods[m.name]) for m in migs}
        order = [(s.name, s.request) for s in work[:-1]]
        order += [(m.name, m.request) for m in migs] + [(work[-1].name, work[-1].request)]
        say.raw()
        say.raw("placed by kube-scheduler alone (DRA); each row is a device of the pod's claim:")
        rows = claimrows.placement_rows(pods, order, claims, devices, cluster.model_of, instances)
        for line in table(rows):
            say.raw("  " + line)
        say.raw()
        say.raw(
            f"{', '.join(m.name for m in migs)}: nvidia.com/vgpu-mode: mig has no webhook "
            "form (its claims are HAMi-core shares), so these ask for the profile the "
            "extender picks, by CEL on the MIG node's partitions"
        )
        for sample in left_out():
            say.raw(f"not submitted: {sample.name} asks for {LEFT_OUT.get(sample.name, '?')}")
        say.raw()
        say.raw(f"{UNFIT} is {phase_of(pods[UNFIT])}: {reason}")
        answer = await draexplain.explain(cluster.kube, pods[UNFIT])
        for line in explain_lines(answer, cluster.nodes):
            say.raw(line)
        say.raw()
        if keep is not None:
            from hami.demo.cli import explain_command

            say.raw(f"the cluster keeps running; kubeconfig: {cluster.kubeconfig}")
            say.raw(
                f"  kubectl --kubeconfig {cluster.kubeconfig} -n {cluster.namespace} "
                "get pods,resourceclaims"
            )
            say.raw(f"  {explain_command(cluster.namespace, cluster.kubeconfig, cluster.port)}")
            say.raw("press Ctrl-C to stop it")
            await keep()
        say("shutting down ...")
    say("done")
    return 0
