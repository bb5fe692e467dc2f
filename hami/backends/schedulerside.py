"""Backends this project serves on the scheduler side only: the node side is the vendor's
(or HAMi's) own device plug-in. Started in a node agent, such a backend refuses with one
message that names the plug-in to run instead."""

from __future__ import annotations

from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
)


class SchedulerSideBackend(Backend):
    """Set ``vendor`` and ``node_plugin``; ``plugin_does`` says what the plug-in puts on
    the Node that the scheduler reads (a property where it depends on the type)."""

    vendor: str  # "Huawei Ascend"
    node_plugin: str  # "HAMi's ascend-device-plugin"
    plugin_does: str  # "writes hami.io/node-register-Ascend910B3"
    # The request rules and the pod value name the resources the vendor's plug-in
    # advertises and reads: where set, other names in the configuration are refused.
    fixed_resources = False

    def __init__(self, settings: BackendSettings | None = None) -> None:
        super().__init__(settings)
        if self.fixed_resources and self.resources != self.default_resources:
            raise BackendError(
                f"{self.type_word}: the resource names are Go HAMi's and the plug-in's "
                f"({', '.join(self.default_resources.all())}); remove backends."
                f"{self.type_word}.resources"
            )

    def no_node_side(self) -> BackendError:
        return BackendError(
            f"{self.type_word}: this project has no node side for {self.vendor}; run "
            f"{self.node_plugin} on the node (it {self.plugin_does}) and enable the "
            f"{self.type_word} backend only in the scheduler's configuration"
        )

    async def enumerate(self) -> list[Device]:
        raise self.no_node_side()

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        raise self.no_node_side()
