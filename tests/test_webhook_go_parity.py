"""This project's webhook against Go HAMi's own, pod spec by pod spec.

``tests/data/go-webhook-vectors.json`` holds what Go HAMi v2.10's webhook (its handler and the
NVIDIA device's ``MutateAdmission``, run by ``scripts/gen-go-vectors.sh webhook``) answered for
each pod of ``tools/gohami-vectors/webhook/specs.json``. Each pod goes through
``hami.scheduler.webhook.review`` with the default configuration's device kinds, and both
stored pods are compared: admitted or not, ``schedulerName``, annotations, runtime class, and
per container its resources (requests completed from limits, as the API server does after the
webhook) and env. ``DIFFERENCES`` lists every case that may differ, the fields and the reason
(docs/interop.md "Webhook"); a listed case that starts agreeing fails, and so does any
disagreement not listed.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from _jsonpatch import apply_patch

from hami import config
from hami.scheduler.role import device_kinds
from hami.scheduler.webhook import review

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "tests/data/go-webhook-vectors.json").read_text())
SPECS = json.loads((ROOT / "tools/gohami-vectors/webhook/specs.json").read_text())
GO_COMMIT = "4707fb02c91c545bc7343ce26dba4c32919f9a3e"  # docs/interop.md
KINDS = device_kinds(config.from_mapping({}, env={}))
SCHEDULER = "hami-scheduler"

#: case -> (fields that differ, why). Kept in step with docs/interop.md "Webhook".
DIFFERENCES: dict[str, tuple[frozenset[str], str]] = {
    "forged-annotations-gpu": (
        frozenset({"annotations"}),
        "decision annotations a user wrote are removed: the node agent would act on them",
    ),
    "forged-annotations-plain": (
        frozenset({"annotations"}),
        "removed from pods that ask for no device too: any pod may land on a hami node",
    ),
    "cores-150": (
        frozenset({"allowed"}),
        "cores are a percent of one device; Go admits 150 and enforces nothing sensible",
    ),
    "percentage-0": (
        frozenset({"allowed"}),
        "Go ignores 0 % and gives the whole memory, the opposite of what was written",
    ),
    "priority-only": (
        frozenset({"schedulerName"}),
        "only hami's kube-scheduler profile ignores nvidia.com/priority; under the default "
        "scheduler the pod is Pending forever (no node advertises it)",
    ),
    "privileged-sidecar": (
        frozenset({"allowed"}),
        "a privileged container that asks for no device is no share to escape; Go denies the "
        "whole pod",
    ),
}


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """The fields a webhook may change, as the API server stores them."""
    spec = pod.get("spec") or {}
    fields: dict[str, Any] = {
        "schedulerName": spec.get("schedulerName"),
        "annotations": (pod.get("metadata") or {}).get("annotations") or {},
        "runtimeClassName": spec.get("runtimeClassName"),
    }
    for container in (spec.get("initContainers") or []) + spec["containers"]:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        # The API server copies a limit into an absent request after the webhook.
        requests = {**limits, **(resources.get("requests") or {})}
        fields[f"{container['name']}.resources"] = {"limits": limits, "requests": requests}
        fields[f"{container['name']}.env"] = container.get("env") or []
    return fields


def ours(pod: dict[str, Any]) -> dict[str, Any]:
    body = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "object": copy.deepcopy(pod)}}
    response = review(body, KINDS, SCHEDULER)["response"]
    if not response["allowed"]:
        return {"allowed": False, "message": response["status"]["message"]}
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return {"allowed": True, **stored(apply_patch(pod, ops))}


def go(vector: dict[str, Any]) -> dict[str, Any]:
    answer = vector["go"]
    if not answer["allowed"]:
        return {"allowed": False, "message": answer["message"]}
    return {"allowed": True, **stored(answer["result"])}


def differing(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    if a["allowed"] != b["allowed"]:
        return {"allowed"}
    if not a["allowed"]:
        return set()  # both refuse; the messages are each project's own
    return {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def test_vectors_come_from_the_pinned_commit_and_cover_every_spec() -> None:
    assert VECTORS["commit"] == GO_COMMIT
    assert "gen-go-vectors.sh webhook" in VECTORS["command"]
    assert [v["name"] for v in VECTORS["vectors"]] == [c["name"] for c in SPECS["cases"]]
    assert set(DIFFERENCES) <= {c["name"] for c in SPECS["cases"]}


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_mutation_matches_go_hami(vector: dict[str, Any]) -> None:
    mine, theirs = ours(vector["pod"]), go(vector)
    fields = differing(mine, theirs)
    listed = DIFFERENCES.get(vector["name"])
    if listed is None:
        assert not fields, (
            f"{vector['name']}: differs from Go HAMi in {sorted(fields)}\n"
            f"this project: {json.dumps({k: mine.get(k) for k in fields})}\n"
            f"Go HAMi:      {json.dumps({k: theirs.get(k) for k in fields})}"
        )
        return
    expected, reason = listed
    assert fields == expected, (
        f"{vector['name']} is listed as differing in {sorted(expected)} ({reason}) but "
        f"differs in {sorted(fields)}; update DIFFERENCES and docs/interop.md"
    )
