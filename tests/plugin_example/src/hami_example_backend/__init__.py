"""An example accelerator backend, shipped outside hami: two "XPU" cards, no core limiter."""

from __future__ import annotations

from hami.backends import (
    AllocationRequest,
    Backend,
    ContainerAllocation,
    Device,
    DeviceNode,
    ResourceNames,
)


class ExampleBackend(Backend):
    type_word = "xpu"
    vendor_word = "XPU"
    default_resources = ResourceNames(count="example.com/xpu", memory="example.com/xpu-mem")
    allocated_key = "hami.io/xpu-devices-allocated"
    to_allocate_key = "hami.io/xpu-devices-to-allocate"

    async def enumerate(self) -> list[Device]:
        return [Device(f"XPU-example-{i}", i, "XPU-Example-16G", 16384) for i in range(2)]

    def core_limit(self, device: Device) -> int:
        return 0

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        slots = {d.uuid: d.index for d in request.node_devices}
        chosen = [slots[d.uuid] for d in request.devices]
        return ContainerAllocation(
            envs={"XPU_VISIBLE_DEVICES": ",".join(map(str, chosen))},
            devices=[DeviceNode(f"/dev/xpu{i}", f"/dev/xpu{i}") for i in chosen],
        )
