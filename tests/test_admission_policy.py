"""docker/manifests' RBAC and ValidatingAdmissionPolicies on the real API server.

Requests are sent as the roles' service accounts by impersonation (the admin certificate is
in system:masters), with the node-name claim a pod-bound token carries as the user extra
``authentication.kubernetes.io/node-name``. Each rule is checked both ways: what the role
does is allowed, the neighbouring abuse is denied, by the policy, with its message.
Type-checking status is written by kube-controller-manager, which the test control plane
does not run; the allowed requests (every validation true) and the messages the denials
carry (every messageExpression evaluated) show that each CEL expression runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from _manifest_helpers import apply, documents, object_path

from hami.kube import events
from hami.kube.client import Kube, open_client
from hami.kube.raw import KubeError
from hami.protocol import keys

pytestmark = pytest.mark.controlplane

NODE_SA = "system:serviceaccount:hami-system:hami-node"
SCHEDULER_SA = "system:serviceaccount:hami-system:hami-scheduler"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
MERGE = "application/merge-patch+json"


class As:
    """Requests to the control plane as an impersonated user."""

    def __init__(self, plane: Any, session: aiohttp.ClientSession, user: str, node: str) -> None:
        self.plane, self.session = plane, session
        self.headers = [
            ("Impersonate-User", user),
            ("Impersonate-Group", "system:serviceaccounts"),
            ("Impersonate-Group", "system:serviceaccounts:hami-system"),
            ("Impersonate-Group", "system:authenticated"),
        ]
        if node:
            self.headers.append((f"Impersonate-Extra-{quote(NODE_NAME_CLAIM, safe='')}", node))

    async def send(
        self, method: str, path: str, body: Any = None, content_type: str = MERGE
    ) -> tuple[int, str]:
        async with self.session.request(
            method,
            self.plane.server + path,
            json=body,
            headers=[*self.headers, ("Content-Type", content_type)],
            ssl=self.plane.ssl_context(),
        ) as resp:
            return resp.status, await resp.text()

    async def annotate(self, path: str, annotations: dict[str, str | None]) -> tuple[int, str]:
        return await self.send("PATCH", path, {"metadata": {"annotations": annotations}})


def allowed(answer: tuple[int, str]) -> None:
    assert answer[0] in (200, 201), answer


def denied(answer: tuple[int, str], *words: str) -> None:
    status, text = answer
    assert status == 403, answer
    for word in words:
        assert word in text, answer


@contextlib.asynccontextmanager
async def hami_policies(kube: Kube, namespace: str) -> AsyncIterator[None]:
    """The manifests' RBAC and policies, applied for real. The decision-annotation policy
    applies to every user, so its binding is narrowed to this test's namespace; the two
    role policies match only the roles' service accounts."""
    docs = documents("00-*.yaml") + documents("10-*.yaml") + documents("15-*.yaml")
    for doc in docs:
        if doc["metadata"]["name"] == "hami-decision-annotations" and "policyName" in doc["spec"]:
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            }
        await apply(kube, doc)
    try:
        yield
    finally:
        for doc in docs:
            if doc["kind"].startswith("ValidatingAdmissionPolicy"):
                with contextlib.suppress(KubeError):
                    await kube.request("DELETE", object_path(doc))


async def make_node(kube: Kube, name: str) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": "on"}, "annotations": {"team": "a"}},
    }
    await kube.request("POST", "/api/v1/nodes", body=body)
    return f"/api/v1/nodes/{name}"


async def make_pod(kube: Kube, namespace: str, name: str, node: str | None) -> str:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


async def wait_for_policies(kube: Kube, agent: As, node_b: str, pod_b: str) -> None:
    """Bindings reach the admission plugin through an informer: wait until each bites
    (the probes write harmless values while they do not)."""
    async with asyncio.timeout(30):
        while (await agent.annotate(node_b, {"hami.io/probe": "x"}))[0] != 403:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        for attempt in itertools.count():
            try:
                await kube.request(
                    "PATCH",
                    pod_b,
                    body={"metadata": {"annotations": {"hami.io/vgpu-time": str(attempt)}}},
                    content_type=MERGE,
                )
            except KubeError as exc:
                assert exc.status == 403, exc
                return
            await asyncio.sleep(0.2)


@pytest.fixture
async def scene(controlplane: Any, kube: Kube, namespace: str) -> AsyncIterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    a, b = f"policy-a-{suffix}", f"policy-b-{suffix}"
    paths = {"node_a": await make_node(kube, a), "node_b": await make_node(kube, b)}
    paths["pod_a"] = await make_pod(kube, namespace, "on-a", a)
    paths["pod_b"] = await make_pod(kube, namespace, "on-b", b)
    paths["pending"] = await make_pod(kube, namespace, "pending", None)
    async with aiohttp.ClientSession() as session, hami_policies(kube, namespace):
        agent = As(controlplane, session, NODE_SA, a)
        await wait_for_policies(kube, agent, paths["node_b"], paths["pod_b"])
        yield {
            "names": (a, b),
            "namespace": namespace,
            "node": agent,
            "legacy_node": As(controlplane, session, NODE_SA, ""),
            "scheduler": As(controlplane, session, SCHEDULER_SA, ""),
            **paths,
        }
    for node in (a, b):
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/nodes/{node}")


async def test_node_agent_changes_only_its_node_and_its_pods_hami_annotations(
    scene: dict[str, Any],
) -> None:
    agent: As = scene["node"]
    node_a, node_b, pod_a = scene["node_a"], scene["node_b"], scene["pod_a"]
    # what it does: register/handshake/lock release on its Node, bind phase on its pods
    allowed(await agent.send("GET", node_a))
    allowed(await agent.annotate(node_a, {"hami.io/node-handshake-nvidia": "Reported_now"}))
    allowed(await agent.annotate(node_a, {"hami.io/node-handshake-nvidia": None}))
    allowed(await agent.annotate(pod_a, {"hami.io/bind-phase": "success"}))
    allowed(
        await agent.send("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={scene['names'][0]}")
    )
    # another Node, or a pod bound elsewhere or nowhere
    denied(await agent.annotate(node_b, {"hami.io/x": "y"}), "hami-node-scope", "only its own")
    denied(await agent.annotate(scene["pod_b"], {"hami.io/bind-phase": "success"}), "on policy-b")
    denied(await agent.annotate(scene["pending"], {"hami.io/bind-phase": "x"}), "not bound")
    # on its own Node and pods: only hami.io/ annotations
    denied(await agent.annotate(node_a, {"team": "b"}), "only hami.io/ annotations, not team")
    denied(await agent.send("PATCH", node_a, {"metadata": {"labels": {"gpu": "off"}}}), "labels")
    denied(await agent.send("PATCH", node_a, {"spec": {"unschedulable": True}}), "spec")
    image = {"spec": {"containers": [{"name": "c", "image": "evil"}]}}
    denied(await agent.send("PATCH", pod_a, image, "application/strategic-merge-patch+json"))
    # a token without the node-name claim (a legacy secret token) changes nothing
    denied(await scene["legacy_node"].annotate(node_a, {"hami.io/x": "y"}), "bound service account")
    # RBAC: no creating pods, no events
    pods = f"/api/v1/namespaces/{scene['namespace']}/pods"
    pod = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    denied(await agent.send("POST", pods, pod, "application/json"))
    event = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "on-a"}}
    denied(
        await agent.send(
            "POST", f"/api/v1/namespaces/{scene['namespace']}/events", event, "application/json"
        )
    )


async def test_scheduler_changes_only_hami_annotations_and_binds(scene: dict[str, Any]) -> None:
    scheduler: As = scene["scheduler"]
    namespace, node_b = scene["namespace"], scene["node_b"]
    # what it does: handshake and lock on any Node, decisions on any pod, Binding, Events
    allowed(await scheduler.annotate(node_b, {"hami.io/mutex.lock": "2024-01-01T00:00:00Z"}))
    allowed(await scheduler.annotate(scene["pending"], {"hami.io/vgpu-node": scene["names"][1]}))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "pending"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": scene["names"][1]},
    }
    allowed(
        await scheduler.send("POST", scene["pending"] + "/binding", binding, "application/json")
    )
    event = {
        "metadata": {"name": "pending.e1"},
        "involvedObject": {"kind": "Pod", "name": "pending", "namespace": namespace},
        "reason": "Test",
        "message": "m",
    }
    allowed(
        await scheduler.send(
            "POST", f"/api/v1/namespaces/{namespace}/events", event, "application/json"
        )
    )
    # nothing else on Nodes and pods
    denied(await scheduler.annotate(node_b, {"team": "b"}), "hami-scheduler-scope", "not team")
    denied(await scheduler.send("PATCH", node_b, {"metadata": {"labels": {"gpu": "x"}}}))
    image = {"spec": {"containers": [{"name": "c", "image": "evil"}]}}
    denied(
        await scheduler.send(
            "PATCH", scene["pod_a"], image, "application/strategic-merge-patch+json"
        ),
        "hami-scheduler-scope",
    )


async def test_only_hami_writes_decision_annotations(kube: Kube, scene: dict[str, Any]) -> None:
    namespace, pod_a = scene["namespace"], scene["pod_a"]
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "forged",
            "annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-x,NVIDIA,99999,100:;"},
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    with pytest.raises(KubeError) as refused:
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=forged)
    assert refused.value.status == 403
    assert "hami.io/vgpu-devices-to-allocate" in str(refused.value)
    for change in ({"hami.io/bind-phase": "success"}, {"hami.io/gpu-devices-allocated": "x"}):
        with pytest.raises(KubeError, match="hami-decision-annotations"):
            await kube.request(
                "PATCH",
                pod_a,
                body={"metadata": {"annotations": change}},
                content_type=MERGE,
            )
    # other annotations, and hami's own roles, are not concerned
    await kube.request(
        "PATCH",
        pod_a,
        body={"metadata": {"annotations": {"team": "b"}}},
        content_type=MERGE,
    )
    allowed(await scene["node"].annotate(pod_a, {"hami.io/vgpu-devices-allocated": "x"}))
    # ...and a user cannot remove what hami wrote (it is the scheduler's usage record)
    with pytest.raises(KubeError, match=r"hami\.io/vgpu-devices-allocated"):
        await kube.request(
            "PATCH",
            pod_a,
            body={"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": None}}},
            content_type=MERGE,
        )
    # nor slip a decision in through a Binding (the API server would merge its annotations)
    await make_pod(kube, namespace, "via-binding", None)
    carried = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "via-binding",
            "annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-x,NVIDIA,99999,100:;"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": scene["names"][0]},
    }
    with pytest.raises(KubeError, match="hami-decision-annotations") as refused:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods/via-binding/binding", carried)
    assert refused.value.status == 403
    stored = await kube.get_pod(namespace, "via-binding")
    assert not stored["spec"].get("nodeName")
    # a Binding without hami's keys (kube-scheduler's own) is not concerned
    plain = {**carried, "metadata": {"name": "via-binding", "annotations": {"team": "b"}}}
    await kube.create(f"/api/v1/namespaces/{namespace}/pods/via-binding/binding", plain)


@contextlib.asynccontextmanager
async def client_as(plane: Any, user: str, node: str = "") -> AsyncIterator[Kube]:
    """hami's own client, impersonating ``user`` (one request header per value)."""
    async with open_client(plane.kubeconfig) as kube:
        kube.api.set_default_header("Impersonate-User", user)
        if node:
            claim = f"Impersonate-Extra-{quote(NODE_NAME_CLAIM, safe='')}"
            kube.api.set_default_header(claim, node)
        yield kube


async def test_the_roles_own_calls_pass(controlplane: Any, scene: dict[str, Any]) -> None:
    """The requests hami's code really sends, through its own client, as each role."""
    namespace = scene["namespace"]
    a, b = scene["names"]
    async with client_as(controlplane, NODE_SA, a) as kube:
        node = await kube.get_node(a)
        version = node["metadata"]["resourceVersion"]
        await kube.patch_node_annotations(a, {keys.NODE_LOCK: None}, version)
        listed = await kube.list_pods(field_selector=f"spec.nodeName={a}")
        assert [p["metadata"]["name"] for p in listed] == ["on-a"]
        await kube.get_pod(namespace, "pending")  # a lock holder not bound yet
        await kube.patch_pod_annotations(namespace, "on-a", {keys.BIND_PHASE: "success"})
        with pytest.raises(KubeError) as refused:
            await kube.patch_pod_annotations(namespace, "on-b", {keys.BIND_PHASE: "success"})
        assert refused.value.status == 403
    async with client_as(controlplane, SCHEDULER_SA) as kube:
        await kube.patch_node_annotations(b, {keys.NODE_LOCK: "lock"}, None)
        pod = await kube.get_pod(namespace, "pending")
        await kube.patch_pod_annotations(namespace, "pending", {keys.VGPU_NODE: b})
        # the Binding carries the decision (scheduler.decision_in_binding)
        carried = {keys.BIND_PHASE: "allocating", "hami.io/vgpu-devices-allocated": ";"}
        await kube.bind_pod(namespace, "pending", pod["metadata"]["uid"], b, annotations=carried)
        bound = await kube.get_pod(namespace, "pending")
        assert bound["metadata"]["annotations"][keys.BIND_PHASE] == "allocating"
        assert await events.emit_pod_event(kube, pod, "BindingSucceed", "bound") is True


async def test_the_node_agents_watches_run_as_its_service_account(
    controlplane: Any, scene: dict[str, Any]
) -> None:
    """Allocate reads its pod from watches of its own Node and of the pods bound to it
    (hami.node.podcache): the node role's RBAC must allow list and watch of both, or every
    Allocate falls back to API reads."""
    from hami.node.podcache import NodeCache

    a, _b = scene["names"]
    async with client_as(controlplane, NODE_SA, a) as kube:
        cache = NodeCache(kube, a, max_backoff=0.5)
        task = asyncio.get_running_loop().create_task(cache.run())
        try:
            async with asyncio.timeout(20):
                for reflector in cache.reflectors:
                    await reflector.synced.wait()
            assert cache.not_current() is None
            assert [p["metadata"]["name"] for p in cache.pods()] == ["on-a"]
            node = cache.node_object
            assert node is not None and node["metadata"]["name"] == a
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
