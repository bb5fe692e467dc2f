"""Issue 10 items 1 and 2 on the real control plane: a node agent with ``register_format:
json`` writes Go HAMi's JSON register value and both NVIDIA heartbeat keys to its Node,
and this project's scheduler places pods from it as from the seed form."""

from __future__ import annotations

from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    running_scheduler,
    unique,
)

from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.kube.client import Kube
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar
from hami.node.state import DeviceState
from hami.protocol import decode_node_devices, keys
from hami.testkit.cluster import poll

DEVICES = [{"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960}]


async def test_a_json_registering_agent_is_read_and_scheduled(kube: Kube, namespace: str) -> None:
    fake = FakeClock()
    name = unique("json")
    backend = FakeBackend(
        BackendSettings(
            register_format="json", options={"devices": DEVICES, "uuid_prefix": f"GPU-{name}"}
        )
    )
    state = DeviceState("fake", backend)
    state.set_enumerated(await backend.enumerate())
    await create_node(kube, name, {})
    try:
        registrar = Registrar(state, kube, node=name, period=30, metrics=NodeMetrics())
        assert await registrar.write_once()
        node = await kube.request("GET", f"/api/v1/nodes/{name}")
        annotations = node["metadata"]["annotations"]
        value = annotations[keys.node_register("nvidia")]
        assert value.startswith(f'[{{"id":"GPU-{name}-0","count":10,"devmem":40960,')
        assert annotations[keys.NVIDIA_HANDSHAKE] == annotations[keys.node_handshake("nvidia")]
        assert annotations[keys.NVIDIA_HANDSHAKE].startswith("Reported_")
        assert [d.uuid for d in decode_node_devices(value)] == [f"GPU-{name}-0", f"GPU-{name}-1"]
        async with running_scheduler(kube, fake) as role:
            cluster = role.scheduler.cluster
            await poll(
                lambda: name in cluster.nodes and cluster.nodes[name].types["nvidia"].available
            )
            assert len(cluster.nodes[name].types["nvidia"].devices) == 2
            await role.scheduler.handshake_pass()
            stamped = (await kube.request("GET", f"/api/v1/nodes/{name}"))["metadata"][
                "annotations"
            ]
            # Requesting_ under both keys, as the agent wrote both.
            assert stamped[keys.NVIDIA_HANDSHAKE].startswith("Requesting_")
            assert stamped[keys.node_handshake("nvidia")] == stamped[keys.NVIDIA_HANDSHAKE]
            pod = await create_pod(kube, namespace, gpu_pod("p", mem=3000))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
    finally:
        await delete_nodes(kube, [name])
