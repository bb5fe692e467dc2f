"""``hami simulate`` (issue 21): the trace is placed by the scheduler's own decision code,
one pod at a time, never past a node's CPU, memory or a GPU's share, and the metric is
the paper's arithmetic. Small fixtures written for these tests (tests/data/openb_sample_*),
never the trace itself."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hami.cli import main as hami_main
from hami.core.cluster import Cluster
from hami.core.noderesources import NodeResources, node_allocatable, pod_requests
from hami.simulate import cli, engine, report, trace
from hami.simulate.engine import (
    CLASSIC_POLICIES,
    DEFRAG_POLICY,
    Policy,
    Simulator,
    simulate,
    unallocated,
)
from hami.simulate.trace import TraceNode, TracePod

DATA = Path(__file__).parent / "data"
EVERY_POLICY = (*CLASSIC_POLICIES, DEFRAG_POLICY)
NODES = trace.read_nodes((DATA / "openb_sample_nodes.csv").read_text())
PODS = trace.read_pods((DATA / "openb_sample_pods.csv").read_text())


def pod(name: str, milli: int, count: int = 1, cpu: int = 1000, mem: int = 1024) -> TracePod:
    return TracePod(name, cpu, mem, count, milli if count else 0)


def test_metric_arithmetic() -> None:
    nodes = [TraceNode("n0", 64000, 262144, 2, "T4")]
    pods = [pod("a", 500), pod("b", 500), pod("c", 1000)]
    placed = simulate(nodes, pods, policy=Policy("binpack", "binpack"))
    assert [p.used for p in placed] == [500, 1000, 2000]
    assert [p.arrived for p in placed] == [500, 1000, 2000]
    assert [unallocated(p.used, 2000) for p in placed] == [75.0, 50.0, 0.0]
    # k = 50: the first pod that brings arrival to 1000 milli is b
    assert report.at_level(placed, 2000, 50) == 50.0
    assert report.at_level(placed, 2000, 100) == 0.0
    assert report.at_level(placed, 2000, 130) is None  # never arrived
    assert report.curve(placed, 2000, step=25) == [(25, 75.0), (50, 50.0), (75, 0.0), (100, 0.0)]
    # the default device policy (spread) puts a and b on different GPUs: c fits nowhere
    spread = simulate(nodes, pods)
    assert [p.node for p in spread] == ["n0", "n0", None]
    assert report.at_level(spread, 2000, 100) == 50.0


def test_a_pod_that_does_not_fit_arrives_but_is_not_used() -> None:
    nodes = [TraceNode("n0", 64000, 262144, 1, "T4")]
    placed = simulate(nodes, [pod("a", 600), pod("b", 600), pod("c", 400)])
    assert [p.node for p in placed] == ["n0", None, "n0"]
    assert [p.arrived for p in placed] == [600, 1200, 1600]
    assert placed[-1].used == 1000
    assert report.at_level(placed, 1000, 100) == 40.0  # after b: 600 of 1000 used


@pytest.mark.parametrize("policy", EVERY_POLICY, ids=lambda p: p.label)
def test_online_first_k_rows_never_depend_on_later_rows(policy: Policy) -> None:
    full = simulate(NODES, PODS, policy=policy)
    for k in range(len(PODS)):
        assert simulate(NODES, PODS[:k], policy=policy) == full[:k]


@pytest.mark.parametrize("split", [100, 10, 2])
@pytest.mark.parametrize("policy", EVERY_POLICY, ids=lambda p: p.label)
def test_never_past_node_cpu_memory_or_gpu_share(policy: Policy, split: int) -> None:
    workload = trace.arrivals(PODS, trace.gpu_capacity(NODES), seed=3, tune=3.0)
    placed = simulate(NODES, workload, policy=policy, split_count=split)
    by_name = {n.name: n for n in NODES}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    milli: Counter[tuple[str, int]] = Counter()
    slots: Counter[tuple[str, int]] = Counter()
    rows = {p.name: p for p in workload}
    for p in placed:
        if p.node is None:
            continue
        row = rows[p.pod]
        cpu[p.node] += row.cpu_milli
        mem[p.node] += row.memory_mib
        assert len(p.devices) == row.num_gpu
        assert len({i for i, _ in p.devices}) == row.num_gpu  # distinct GPUs
        if row.gpu_spec:
            assert by_name[p.node].model in row.gpu_spec
        for index, given in p.devices:
            assert 0 <= index < by_name[p.node].gpus
            milli[p.node, index] += given
            slots[p.node, index] += 1
    assert any(p.node is None for p in placed)  # the cluster did fill up
    for name, used in cpu.items():
        assert used <= by_name[name].cpu_milli
        assert mem[name] <= by_name[name].memory_mib
    assert all(v <= 1000 for v in milli.values())
    assert all(v <= split for v in slots.values())


def test_cpu_and_memory_rule_out_a_node_with_idle_gpus() -> None:
    nodes = [TraceNode("a-small", 4000, 8192, 4, "T4"), TraceNode("b-big", 64000, 262144, 1, "T4")]
    placed = simulate(nodes, [pod("p", 1000, cpu=8000), pod("q", 1000, cpu=8000)])
    assert [p.node for p in placed] == ["b-big", None]  # a-small's 4 GPUs stay idle


def test_gpu_spec_is_the_type_selector() -> None:
    nodes = [TraceNode("a", 64000, 262144, 2, "P100"), TraceNode("b", 64000, 262144, 2, "T4")]
    spec = TracePod("p", 1000, 1024, 1, 300, ("T4",))
    assert simulate(nodes, [spec])[0].node == "b"
    obj = engine.pod_object(spec)
    assert obj["metadata"]["annotations"] == {"nvidia.com/use-gputype": "T4"}
    limits = obj["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "30",
        "nvidia.com/gpumem-percentage": "30",
    }


def test_placements_come_from_cluster_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = Cluster.decide

    def spy(self: Cluster, request, candidates=None, **kw):  # type: ignore[no-untyped-def]
        calls.append(request)
        return real(self, request, candidates, **kw)

    monkeypatch.setattr(Cluster, "decide", spy)
    sim = Simulator(NODES)
    placed = [sim.place(p) for p in PODS]
    gpu_rows = [p for p in PODS if p.num_gpu]
    assert len(calls) == sim.decided == len(gpu_rows)
    # and with a decide that refuses everything, no GPU pod is placed
    monkeypatch.setattr(
        Cluster, "decide", lambda self, *a, **k: real(self, *a, **k).__class__(None)
    )
    refused = simulate(NODES, PODS)
    assert all(p.node is None for p, row in zip(refused, PODS, strict=True) if row.num_gpu)
    assert any(p.node for p in placed)


def test_node_policy_changes_the_answer_through_the_cluster() -> None:
    nodes = [TraceNode(f"n{i}", 64000, 262144, 2, "T4") for i in range(3)]
    pods = [pod(f"p{i}", 300) for i in range(3)]
    binpack = {p.node for p in simulate(nodes, pods, policy=Policy("binpack", "binpack"))}
    spread = {p.node for p in simulate(nodes, pods, policy=Policy("spread", "spread"))}
    assert len(binpack) == 1 and len(spread) == 3


def test_arrivals_seeded_and_resampled_to_tune() -> None:
    capacity = trace.gpu_capacity(NODES)
    one = trace.arrivals(PODS, capacity, seed=7, tune=1.3)
    assert one == trace.arrivals(PODS, capacity, seed=7, tune=1.3)
    assert one != trace.arrivals(PODS, capacity, seed=8, tune=1.3)
    demand = sum(p.demand for p in one)
    assert demand >= 1.3 * capacity > demand - one[-1].demand
    assert len({p.name for p in one}) == len(one)
    assert sorted(p.name for p in one[: len(PODS)]) == sorted(p.name for p in PODS)
    short = trace.arrivals(PODS, capacity, seed=7, tune=0.5)
    assert sum(p.demand for p in short) >= 0.5 * capacity > sum(p.demand for p in short[:-1])


def test_read_multigpu_variant_without_spec_column_and_empty_cells() -> None:
    pods = trace.read_pods((DATA / "openb_sample_pods_multigpu.csv").read_text())
    assert [(p.num_gpu, p.gpu_milli, p.gpu_spec) for p in pods] == [
        (1, 1000, ()),
        (1, 460, ()),
        (1, 460, ()),
        (0, 0, ()),
        (2, 1000, ()),
    ]
    # repeated names are separate pods
    placed = simulate(NODES, pods)
    assert [p.used for p in placed][:3] == [1000, 1460, 1920]


def test_node_resources_from_node_and_pod_objects() -> None:
    node = engine.node_object(NODES[0], 10)
    assert node_allocatable(node) == NodeResources(64000, 262144)
    assert pod_requests(engine.pod_object(PODS[1])) == (6000, 12288)
    init = {
        "spec": {
            "initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}],
            "containers": [
                {"resources": {"requests": {"cpu": "500m"}}},
                {"resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}}},
            ],
        }
    }
    assert pod_requests(init) == (4000, 1024)


def test_cli_file_order_writes_placements_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, plot = tmp_path / "p.jsonl", tmp_path / "p.svg"
    rc = hami_main(
        [
            "simulate",
            "--nodes",
            str(DATA / "openb_sample_nodes.csv"),
            "--pods",
            str(DATA / "openb_sample_pods.csv"),
            "--order",
            "file",
            "--policy",
            "spread/binpack",
            "--split-count",
            "100",
            "--levels",
            "50,100",
            "--placements",
            str(out),
            "--plot",
            str(plot),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "node-spread/gpu-binpack" in text
    assert "FGD (published)" not in text  # published figures are for the openb lists only
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["pod"] for line in lines] == [p.name for p in PODS]
    assert all(set(line) == {"pod", "node", "devices"} for line in lines)
    expected = simulate(NODES, PODS, policy=Policy("spread", "binpack"))
    assert lines == [p.as_json() for p in expected]
    cpu_only = [line for line, row in zip(lines, PODS, strict=True) if not row.num_gpu]
    assert all(line["devices"] == [] for line in cpu_only)
    assert plot.read_text().startswith("<svg")


def test_cli_without_a_trace_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(cli.TRACE_ENV, raising=False)
    assert hami_main(["simulate"]) == 2
    assert cli.TRACE_ENV in capsys.readouterr().err


def test_table_layout() -> None:
    text = report.table({"a": [1.0, None]}, [90, 100])
    assert text.splitlines()[2].split() == ["a", "1.00", "-"]
    assert report.mean_of([1.0, 3.0]) == 2.0 and report.mean_of([1.0, None]) is None


def running_pod(node: str, uuid: str, percent: int, cpu: str) -> dict[str, object]:
    """A pod bound to ``node`` and running, holding ``percent`` of a T4's cores and memory."""
    from hami.protocol.poddevices import ContainerDevice, encode_pod_devices

    held = encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", 15360 * percent // 100, percent)]])
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": str(percent)}
    container = {"name": "c", "resources": {"limits": limits, "requests": {"cpu": cpu}}}
    return {
        "metadata": {
            "name": "live",
            "namespace": "default",
            "uid": "live-uid",
            "annotations": {"hami.io/vgpu-node": node, "hami.io/vgpu-devices-allocated": held},
        },
        "spec": {"nodeName": node, "containers": [container]},
        "status": {"phase": "Running"},
    }


def test_from_objects_the_running_pods_hold_is_never_over_committed() -> None:
    """A live cluster's start: a running pod holds 70 % of the one GPU and 30 of the 32
    CPUs; the trace pods get only what is left, through the same decision code."""
    node = engine.node_object(TraceNode("live-0", 32000, 131072, 1, "T4"), 10)
    held = running_pod("live-0", engine.gpu_uuid("live-0", 0), 70, "30")
    done = {**running_pod("live-0", engine.gpu_uuid("live-0", 0), 90, "1"), "status": {}}
    done["metadata"] = {**done["metadata"], "name": "done", "uid": "done"}  # type: ignore[dict-item]
    done["status"] = {"phase": "Succeeded"}
    for policy in EVERY_POLICY:
        sim = Simulator.from_objects([node], [held, done], engine.NOW, policy, cpu_pods="kube")
        assert sim.capacity == 1000
        assert (sim.arrived, sim.used) == (700, 700)  # the running pod's share
        placed = [
            sim.place(p)
            for p in (pod("a", 500), pod("b", 300), pod("c", 100), pod("d", 0, 0, cpu=4000))
        ]
        assert [p.node for p in placed] == [None, "live-0", None, None], policy
        assert placed[1].devices == ((0, 300),)
        assert placed[-1].used == 1000
        assert sim.resources["live-0"].free_cpu_milli == 1000


def test_snapshot_keeps_running_pods_and_starts_after_the_newest_heartbeat() -> None:
    from datetime import timedelta

    from hami.protocol import handshake
    from hami.simulate import snapshot

    held = running_pod("n", "u", 10, "1")
    pending = {**held, "spec": {"containers": []}}
    finished = {**held, "status": {"phase": "Failed"}}
    assert snapshot.running([held, pending, finished]) == [held]
    at = engine.NOW + timedelta(hours=1)
    nodes = [
        {"metadata": {"annotations": {"hami.io/node-handshake": handshake.reported(at)}}},
        engine.node_object(TraceNode("x", 1000, 1024, 1, "T4"), 10),
    ]
    assert snapshot.start_time(nodes, engine.NOW) == at + timedelta(seconds=1)
    assert snapshot.start_time([], engine.NOW) == engine.NOW


def test_cli_from_cluster_without_an_api_server_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    pods = str(DATA / "openb_sample_pods.csv")
    argv = ["simulate", "--from-cluster", "--kubeconfig", str(kubeconfig), "--pods", pods]
    assert hami_main(argv) == 2
    err = capsys.readouterr().err
    assert "could not list nodes and pods" in err and "--kubeconfig" in err
    assert "Traceback" not in err
    assert hami_main([*argv[:3], str(tmp_path / "missing"), *argv[4:]]) == 2
    assert "--from-cluster" in capsys.readouterr().err
