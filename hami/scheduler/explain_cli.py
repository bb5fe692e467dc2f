"""``hami explain POD [-n NS]``: why each node takes or rejects a pod.

Asks a running scheduler (``GET {url}/explain``) first; when none answers, or with
``--offline``, computes the same from the cluster's Node and Pod annotations, or, for a pod
that names DRA claims, from its claims and the ResourceSlices (docs/dra.md "Why Pending").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from hami import config
from hami.cliargs import add_common_flags, load_config, tool_log_level

# hami.kube and hami.log are imported by the functions that use them: ``hami --help`` builds
# this parser, and must not pay for kubernetes_asyncio and aiohttp.


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "explain", help="why a pod was (not) placed: every node's reason"
    )
    add_common_flags(parser)
    parser.add_argument("pod", help="pod name")
    parser.add_argument("-n", "--namespace", default="default", help="pod namespace")
    parser.add_argument(
        "--url",
        help="a running scheduler role (default: http://127.0.0.1:{scheduler.extender.port})",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="compute from the API server only (annotations; claims and slices for a DRA pod)",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hami import log
    from hami.kube.client import KubeConfigError
    from hami.kube.raw import KubeError

    cfg = load_config(args)
    log.configure(tool_log_level(args), cfg.log.format)
    answer: dict[str, Any] | None = None
    if not args.offline:
        url = args.url or f"http://127.0.0.1:{cfg.scheduler.extender.port}"  # /explain is there
        answer = ask_scheduler(url, args.namespace, args.pod)
        if answer is None:
            print(f"no scheduler answered at {url}; computing from the API server", file=sys.stderr)
    if answer is None:
        try:
            answer = asyncio.run(compute(cfg, args.namespace, args.pod))
        except (KubeConfigError, KubeError) as exc:
            print(f"hami explain: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        print_answer(answer)
    return 1 if answer.get("error") else 0


def ask_scheduler(url: str, namespace: str, name: str) -> dict[str, Any] | None:
    query = urllib.parse.urlencode({"namespace": namespace, "name": name})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/explain?{query}", timeout=30) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except urllib.error.HTTPError as exc:
        try:
            data = json.loads(exc.read())
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


async def compute(cfg: config.Config, namespace: str, name: str) -> dict[str, Any]:
    from hami.kube.client import open_client
    from hami.kube.raw import KubeError
    from hami.scheduler import draexplain
    from hami.scheduler.explain import waits_on_claims
    from hami.scheduler.role import device_kinds
    from hami.scheduler.service import Scheduler

    async with open_client(cfg.kubeconfig or None) as kube:
        scheduler = Scheduler(cfg.scheduler, device_kinds(cfg), kube, emit_events=False)
        pod = await kube.get_pod(namespace, name)
        if waits_on_claims(pod, scheduler.parse):  # no need to list every pod and node
            dra = await draexplain.explain(kube, pod)
            if dra is not None:  # else: claims of no hami DeviceClass
                return dra
        nodes, _ = await kube.list_all("/api/v1/nodes")
        for node in nodes:
            scheduler.on_node("ADDED", node)
        scheduler.cluster.refresh(scheduler.clock.now())
        for pod in await kube.list_pods():
            scheduler.on_pod("ADDED", pod)
        if cfg.scheduler.resource_quotas:
            try:
                quotas, _ = await kube.list_all("/api/v1/resourcequotas")
            except KubeError as exc:  # explain the nodes all the same
                print(f"resource quotas not read: {exc}", file=sys.stderr)
                quotas = []
            for quota in quotas:
                scheduler.on_quota("ADDED", quota)
        return await scheduler.explain(namespace, name)


def print_answer(answer: dict[str, Any]) -> None:
    print(f"pod {answer.get('pod')}")
    if answer.get("assigned"):
        print(f"placed on node {answer['assigned']} (its own hold is not counted below)")
    if answer.get("error"):
        print(f"error: {answer['error']}")
        return
    nodes: dict[str, str] = answer.get("nodes") or {}
    if not nodes:
        print("no nodes known")
        return
    if answer.get("mode") == "dra":
        print_dra(answer)
        return
    if answer.get("scheduler_message"):
        # every node fits hami's devices: the pod waits on something else (taints, CPU, ...)
        print(f"hami's devices fit on all {len(nodes)} node(s); kube-scheduler says:")
        print(f"  {answer['scheduler_message']}")
        print_quota(answer)
        return
    width = max(len("NODE"), *(len(n) for n in nodes))
    print(f"{'NODE'.ljust(width)}  REASON")
    for node, reason in sorted(nodes.items()):
        print(f"{node.ljust(width)}  {reason}")
    print_quota(answer)


def print_dra(answer: dict[str, Any]) -> None:
    """A DRA pod: each node's verdict, one line per request, device and shortfall."""
    for row in answer.get("allocated") or []:
        devices = ", ".join(row.get("devices") or [])
        print(f"{row.get('claim')} is allocated on node {row.get('node')} ({devices})")
    requests = answer.get("requests") or []
    if requests:
        print("waits on: " + "; ".join(str(r) for r in requests))
    nodes: dict[str, str] = answer.get("nodes") or {}
    details: dict[str, list[str]] = answer.get("details") or {}
    width = max(len("NODE"), *(len(n) for n in nodes))
    print(f"{'NODE'.ljust(width)}  REASON")
    for node, reason in sorted(nodes.items()):
        lines = details.get(node) or [reason]
        if reason == "fits":
            lines = ["fits", *(f"  ({line})" for line in details.get(node) or [])]
        print(f"{node.ljust(width)}  {lines[0]}")
        for line in lines[1:]:
            print(f"{''.ljust(width)}  {line}")
    for note in answer.get("notes") or []:
        print(f"note: {note}")
    for error in answer.get("object_errors") or []:
        print(f"unreadable: {error}")
    if answer.get("scheduler_message"):
        print(f"kube-scheduler says: {answer['scheduler_message']}")


def print_quota(answer: dict[str, Any]) -> None:
    """The namespace's device quota: used of limit, per resource."""
    quota: dict[str, Any] = answer.get("quota") or {}
    namespace = str(answer.get("pod") or "").partition("/")[0]
    for resource, row in sorted(quota.items()):
        unit = row.get("unit", "")
        used = f"{row.get('used')}{unit} used"
        if row.get("limit") is None:
            print(f"quota {namespace} {resource}: {used}, no limit")
        else:
            print(
                f"quota {namespace} {resource}: {used} of {row['limit']}{unit} "
                f"(ResourceQuota {row.get('quota')})"
            )
