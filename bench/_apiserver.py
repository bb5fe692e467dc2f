"""What the API server did during a benchmark window: its requests by verb and resource
(kube-apiserver's own ``apiserver_request_total``) and the CPU time of kube-apiserver and
etcd (from /proc). Read before and after the window; the difference is what the window
cost, whoever sent the requests.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hami.testkit.controlplane import ControlPlane

# apiserver_request_total{code="201",component="apiserver",...,verb="POST",version="v1"} 12
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: the verbs that change something (a watch, get or list only reads)
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})

Requests = Counter[tuple[str, str]]  # (verb, resource[/subresource]) -> count


@dataclass(frozen=True)
class Snapshot:
    requests: Requests
    cpu_seconds: float  # kube-apiserver and etcd together


def snapshot(plane: ControlPlane) -> Snapshot:
    pids = [proc.pid for proc in (plane.apiserver, plane.etcd) if proc is not None]
    return Snapshot(request_counts(plane), sum(cpu_seconds(pid) for pid in pids))


def request_counts(plane: ControlPlane) -> Requests:
    """``apiserver_request_total`` summed over codes, scopes and versions."""
    request = urllib.request.Request(f"{plane.server}/metrics")
    with urllib.request.urlopen(request, context=plane.ssl_context(), timeout=30) as answer:
        text = answer.read().decode()
    counts: Requests = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        if labels.get("code") == "409":
            resource += " (409 Conflict)"  # refused: a conditional write lost its race
        counts[(labels.get("verb", ""), resource)] += int(float(match["value"]))
    return counts


def writes(before: Snapshot, after: Snapshot) -> Requests:
    """The write requests made between two snapshots."""
    delta = after.requests - before.requests
    return Counter({key: n for key, n in delta.items() if key[0] in WRITES})


def per_pod(counts: Requests, pods: int) -> str:
    """``PATCH nodes 2.00, POST pods/binding 1.00, ...`` (largest first)."""
    if pods <= 0:
        return "-"
    parts = [f"{verb} {what} {n / pods:.2f}" for (verb, what), n in counts.most_common()]
    return ", ".join(parts)


def cpu_seconds(pid: int | None) -> float:
    """A process's user + system CPU so far (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
