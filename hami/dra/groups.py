"""Which of a claim's requests the agent prepares as one CDI device. Pure.

kubelet gives a container the CDI ids on the devices of each request it names
(``resources.claims[].request``), and every id of the claim when it names none
(kubelet's ``ClaimInfo.cdiDevicesAsList``; ids are not deduplicated). HAMi-core's
contract is per container: one ``NVIDIA_VISIBLE_DEVICES`` list, ``CUDA_DEVICE_MEMORY_LIMIT_{i}``
by the container's device index, one shared region mounted at one path. Two of this
driver's CDI devices in one container would overwrite each other's variables and mount, so
the agent makes one CDI device per *group*: the requests some container uses together,
merged with every other group they share a request with (a container naming the whole
claim merges all of them: one device, as before). Requests no known container names form
one group of their own, so a container of a pod that joins a shared claim later still gets
one consistent device.

The containers are those of the pods in the claim's ``status.reservedFor`` at the first
prepare on the node; the groups are checkpointed with the answer and never change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def base_request(name: str) -> str:
    """``gpu/a100`` (a ``firstAvailable`` subrequest) -> ``gpu``: what containers name."""
    return name.split("/", 1)[0]


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _pod_entries(pod: Mapping[str, Any], claim_name: str) -> set[str]:
    """The pod's ``spec.resourceClaims`` entry names that resolve to ``claim_name``."""
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    generated = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in _dicts(status.get("resourceClaimStatuses"))
    }
    out: set[str] = set()
    for entry in _dicts(spec.get("resourceClaims")):
        name = str(entry.get("name", ""))
        resolved = entry.get("resourceClaimName") or generated.get(name)
        if resolved == claim_name:
            out.add(name)
    return out


def container_requests(
    pod: Mapping[str, Any], claim_name: str, requests: Sequence[str]
) -> list[frozenset[str]]:
    """For each container of ``pod`` that uses the claim, which of ``requests`` (this
    driver's, base names) it gets: those it names, all of them when it names the claim
    without a request. The pod is API input: anything malformed is skipped."""
    mine = set(requests)
    entries = _pod_entries(pod, claim_name)
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    extended = _mapping(status.get("extendedResourceClaimStatus"))
    mapped = extended.get("resourceClaimName") == claim_name
    out: list[frozenset[str]] = []
    for container in [*_dicts(spec.get("initContainers")), *_dicts(spec.get("containers"))]:
        used: set[str] = set()
        refs = _dicts(_mapping(container.get("resources")).get("claims"))
        for ref in refs:
            if ref.get("name") not in entries:
                continue
            request = ref.get("request")
            used |= {base_request(str(request))} & mine if request else mine
        if mapped:  # kube-scheduler's claim for a DeviceClass-mapped extended resource
            for m in _dicts(extended.get("requestMappings")):
                if m.get("containerName") == container.get("name"):
                    used |= {base_request(str(m.get("requestName", "")))} & mine
        if used:
            out.append(frozenset(used))
    return out


def request_groups(
    requests: Sequence[str], used: Iterable[frozenset[str]]
) -> list[tuple[str, ...]]:
    """``requests`` (base names, in the claim's result order, duplicates allowed) split into
    groups: overlapping sets of ``used`` merged, the unused requests one group. Groups are
    ordered by their first request, their requests in ``requests`` order."""
    order = list(dict.fromkeys(requests))
    parent = {r: r for r in order}

    def root(r: str) -> str:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    sets = [sorted(s & parent.keys(), key=order.index) for s in used]
    named = {r for s in sets for r in s}
    unused = [r for r in order if r not in named]
    for members in [*sets, unused]:
        for other in members[1:]:
            parent[root(other)] = root(members[0])
    groups: dict[str, list[str]] = {}
    for r in order:
        groups.setdefault(root(r), []).append(r)
    return [tuple(g) for g in groups.values()]
