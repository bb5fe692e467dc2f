"""DRA mode, node side: publishing devices as ResourceSlices and the kubelet DRA plugin.

A backend with ``mode: dra`` (config) is served through Dynamic Resource Allocation instead
of the extender protocol: kube-scheduler allocates memory/core slices of the published
devices itself, and kubelet asks this plugin to prepare each allocated ResourceClaim
(docs/dra.md "Node side").

- ``names``: driver, pool, slice, device and CDI names (pure);
- ``slices``: ResourceSlice and DeviceClass bodies from a backend's devices (pure);
- ``claims``: a claim's allocation results for this driver, validated (pure);
- ``cdi``: the CDI spec that carries one claim's HAMi-core contract (pure + file I/O);
- ``checkpoint``: prepared claims kept across agent restarts (a JSON file);
- ``publisher``: keeps this node's ResourceSlice current on the API server;
- ``plugin``: the plugin registration and DRA gRPC services kubelet calls.
"""
