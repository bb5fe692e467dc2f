"""Pods written for Go HAMi (issue 10 item 7) in the cluster state: the node annotation
``hami.io/node-nvidia-score`` read from either writer (Go HAMi's plugin or this project's
NVIDIA backend write the same JSON); a damaged value never costs the node."""

from __future__ import annotations

import json
from typing import Any

from _core_helpers import MLU, NOW, NVIDIA, gpu, node, pod, register

from hami.core import topology
from hami.core.cluster import Cluster
from hami.core.requests import PodRequest, parse_pod

POLICY = "hami.io/gpu-scheduler-policy"
WEIGHTS = "hami.io/device-scoring-weights"


def req(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> PodRequest:
    r = parse_pod(pod(*containers, annotations=annotations), [NVIDIA, MLU])
    assert r is not None
    return r


def test_the_cluster_reads_the_score_annotation_of_either_writer() -> None:
    cluster = Cluster([NVIDIA])
    value = register(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], memory=10000)
    pairs = {("GPU-2", "GPU-3"): 1200, ("GPU-3", "GPU-2"): 1200}
    score = topology.encode_pair_scores(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], pairs)
    cluster.upsert_node(node("n1", value, extra={"hami.io/node-nvidia-score": score}), NOW)
    cluster.refresh(NOW)
    topo = req(gpu(count=2, mem=1000), annotations={POLICY: "topology-aware"})
    decision = cluster.decide(topo)
    assert decision.fit is not None
    assert [d.uuid for d in decision.fit.assignment["nvidia"][0]] == ["GPU-2", "GPU-3"]
    # a damaged value costs the topology preference, never the node
    cluster.upsert_node(node("n1", value, rv="2", extra={"hami.io/node-nvidia-score": "["}), NOW)
    decision = cluster.decide(topo)
    assert decision.fit is not None
    assert [d.uuid for d in decision.fit.assignment["nvidia"][0]] == ["GPU-0", "GPU-1"]
    assert cluster.nodes["n1"].types["nvidia"].score_error
    json.dumps(cluster.nodes["n1"].types["nvidia"].pair_scores)  # plain data
