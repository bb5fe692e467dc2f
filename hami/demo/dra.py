"""``hami demo --mode dra``: the extender demo's HAMi-core pods, unchanged, placed by
kube-scheduler alone.

The node agents publish ResourceSlices (fake backend in ``mode: dra``); hami's webhook turns
each pod's ``nvidia.com/*`` limits into a ResourceClaimTemplate with one request per
container (docs/dra.md "Unchanged HAMi pods"); kube-scheduler's DynamicResources plugin
allocates slices of shared devices (consumable capacity) and each kubelet emulator prepares
the claims through its node's DRA plugin. The table is the extender demo's, read from the
allocated claims; the pod that cannot fit gets ``hami explain``'s answer for claims.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from hami.demo import claimrows
from hami.demo.placement import table
from hami.demo.samples import UNFIT, Sample, hami_core_samples, samples
from hami.scheduler import draexplain
from hami.testkit.cluster import DEMO_NODES, LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane

RESOURCE_API = "/apis/resource.k8s.io/v1"
#: why the extender demo's other pods are not submitted here (one line each)
LEFT_OUT = {
    "mig-small": "nvidia.com/vgpu-mode: mig, which the webhook refuses in a DRA namespace "
    "(its devices are hami-core); this demo has no DRA MIG node",
    "mig-large": "nvidia.com/vgpu-mode: mig, as mig-small",
    "npu-vnpu": "an Ascend vNPU: this project has no Ascend DRA driver",
}


def left_out() -> list[Sample]:
    """The extender demo's pods this mode does not submit."""
    core = {s.name for s in hami_core_samples()}
    return [s for s in samples() if s.name not in core]


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


async def _uuids(cluster: LocalCluster) -> dict[claimrows.DeviceKey, str]:
    items, _ = await cluster.kube.list_all(f"{RESOURCE_API}/resourceslices")
    return claimrows.slice_uuids(items)


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
    async with LocalCluster(
        nodes, plane=plane, timing=Timing(), progress=say, mode="dra", webhook=True
    ) as cluster:
        say(
            f"submitting {len(work)} sample pods unchanged (nvidia.com/* limits) to "
            f"{cluster.namespace}; hami's webhook turns each into a claim ..."
        )
        for sample in work:
            await cluster.create_pod(_unchanged(cluster, sample))
        fitting = [s.name for s in work if s.name != UNFIT]
        pods = await cluster.wait_running(fitting, timeout=timeout)
        say(f"{len(fitting)} pods started; waiting for kube-scheduler's verdict on {UNFIT} ...")
        reason = await _failed_scheduling(cluster, UNFIT, timeout)
        pods[UNFIT] = await cluster.get_pod(UNFIT)
        claims, uuids = await _claims(cluster), await _uuids(cluster)
        order = [(s.name, s.request) for s in work]
        say.raw()
        say.raw("placed by kube-scheduler alone (DRA); each row is a device of the pod's claim:")
        rows = claimrows.placement_rows(pods, order, claims, uuids, cluster.model_of)
        for line in table(rows):
            say.raw("  " + line)
        say.raw()
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
