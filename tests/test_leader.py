"""Leader election on the real API server (hami.scheduler.leader), with short periods:
one leader at a time, takeover after the leader dies, hand-over on release, following
kube-scheduler's Lease, and a standby scheduler role that writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from _sched_helpers import scheduler_config, unique

from hami import config
from hami.kube.client import Kube
from hami.kube.raw import NotFound
from hami.scheduler.leader import LEASES, LeaderElector
from hami.scheduler.role import SchedulerRole
from hami.scheduler.service import STANDBY
from hami.testkit.cluster import poll

pytestmark = pytest.mark.controlplane
FAST = {"lease_duration": "3s", "renew_deadline": "2s", "retry_period": "0.3s"}


def settings(name: str, **extra: Any) -> config.LeaderElectionConfig:
    raw = {"leader_election": {"enabled": True, "lease_name": name, **FAST, **extra}}
    return config.from_mapping({"scheduler": raw}, env={}).scheduler.leader_election


class Running:
    """Electors whose loops run as tasks; ``kill`` stops one without releasing."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.electors: dict[str, LeaderElector] = {}
        self.overlaps = 0

    def start(self, elector: LeaderElector) -> None:
        self.electors[elector.identity] = elector
        self.tasks[elector.identity] = asyncio.create_task(elector.run())

    async def kill(self, identity: str) -> None:
        task = self.tasks.pop(identity)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def watch(self) -> None:
        """Count moments where two electors both think they lead."""
        while True:
            if sum(e.leading for e in self.electors.values()) > 1:
                self.overlaps += 1
            await asyncio.sleep(0.02)


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    run = Running()
    watcher = asyncio.create_task(run.watch())
    yield run
    watcher.cancel()
    for task in run.tasks.values():
        task.cancel()
    await asyncio.gather(watcher, *run.tasks.values(), return_exceptions=True)


async def lease(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return await kube.request("GET", LEASES.format(namespace=namespace) + "/" + name)


async def test_one_leader_and_a_takeover_after_it_dies(
    kube: Kube, namespace: str, running: Running
) -> None:
    name = unique("lease")
    a = LeaderElector(kube, settings(name), namespace, "a")
    b = LeaderElector(kube, settings(name), namespace, "b")
    running.start(a)
    await poll(lambda: a.leading, 10, "a leads")
    running.start(b)
    await poll(lambda: b.holder == "a", 10, "b has read the lease")
    assert not b.leading
    first = await lease(kube, namespace, name)
    assert first["spec"]["holderIdentity"] == "a"

    await running.kill("a")  # no release: b must wait the lease out
    loop = asyncio.get_running_loop()
    killed = loop.time()
    await poll(lambda: b.leading, 20, "b takes over")
    waited = loop.time() - killed
    assert waited >= 2  # not before a's renew deadline: a might still have been writing
    spec = (await lease(kube, namespace, name))["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == first["spec"]["leaseTransitions"] + 1
    assert not a.leading  # its renewals lapsed: it no longer counts itself leader
    assert running.overlaps == 0


async def test_a_released_lease_is_taken_at_once(
    kube: Kube, namespace: str, running: Running
) -> None:
    name = unique("lease")
    long = settings(name, lease_duration="60s", renew_deadline="40s", retry_period="0.3s")
    a = LeaderElector(kube, long, namespace, "a")
    b = LeaderElector(kube, long, namespace, "b")
    running.start(a)
    await poll(lambda: a.leading, 10, "a leads")
    running.start(b)
    await poll(lambda: b.holder == "a", 10, "b has read the lease")
    await running.kill("a")
    await a.release()
    # far sooner than the 60 s lease: the empty holder is taken on b's next try
    await poll(lambda: b.leading, 10, "b takes the released lease")
    assert (await lease(kube, namespace, name))["spec"]["holderIdentity"] == "b"
    assert running.overlaps == 0


async def test_racing_creators_elect_one(kube: Kube, namespace: str) -> None:
    name = unique("lease")
    electors = [LeaderElector(kube, settings(name), namespace, f"r{i}") for i in range(4)]
    await asyncio.gather(*(e.step() for e in electors))
    assert sum(e.leading for e in electors) == 1
    holder = (await lease(kube, namespace, name))["spec"]["holderIdentity"]
    assert [e.identity for e in electors if e.leading] == [holder]


async def test_it_leads_only_while_its_kube_scheduler_does(
    kube: Kube, namespace: str, running: Running
) -> None:
    name, ks = unique("lease"), unique("ks")
    path = LEASES.format(namespace=namespace)
    body = {"metadata": {"name": ks}, "spec": {"holderIdentity": "pod-b_1f2e"}}
    await kube.create(path, body)
    a = LeaderElector(
        kube, settings(name, follow_kube_scheduler=f"{namespace}/{ks}"), namespace, "pod-a"
    )
    running.start(a)
    await poll(lambda: a.steps >= 3, 10, "a has tried a few times")
    assert not a.leading  # its kube-scheduler does not lead: it does not even campaign
    with pytest.raises(NotFound):
        await lease(kube, namespace, name)

    current = await kube.request("GET", f"{path}/{ks}")
    current["spec"]["holderIdentity"] = "pod-a_9c8d"  # pod-a's kube-scheduler now leads
    await kube.request("PUT", f"{path}/{ks}", body=current)
    await poll(lambda: a.leading, 10, "a leads with its kube-scheduler")

    current = await kube.request("GET", f"{path}/{ks}")
    current["spec"]["holderIdentity"] = "pod-b_77aa"
    await kube.request("PUT", f"{path}/{ks}", body=current)
    await poll(lambda: not a.leading, 10, "a steps down with its kube-scheduler")
    # and hands hami's Lease back instead of letting it run out
    spec = (await lease(kube, namespace, name))["spec"]
    assert spec.get("holderIdentity", "") == ""


async def test_a_standby_follows_its_kube_schedulers_takeover_within_a_follow_poll(
    kube: Kube, namespace: str, running: Running
) -> None:
    """hami's Lease is free, only kube-scheduler's stands in the way: once this pod's
    kube-scheduler takes its Lease, the standby leads at its next FOLLOW_POLL read, not a
    whole retry_period (a minute here) later."""
    name, ks = unique("lease"), unique("ks")
    path = LEASES.format(namespace=namespace)
    await kube.create(path, {"metadata": {"name": ks}, "spec": {"holderIdentity": "pod-a_1"}})
    slow = settings(
        name,
        lease_duration="120s",
        renew_deadline="90s",
        retry_period="60s",
        follow_kube_scheduler=f"{namespace}/{ks}",
    )
    b = LeaderElector(kube, slow, namespace, "pod-b")
    running.start(b)
    await poll(lambda: b.awaiting_kube_scheduler, 10, "b waits for its kube-scheduler")
    current = await kube.request("GET", f"{path}/{ks}")
    current["spec"]["holderIdentity"] = "pod-b_2"  # pod-b's kube-scheduler took over
    await kube.request("PUT", f"{path}/{ks}", body=current)
    await poll(lambda: b.leading, 20, "b leads right after its kube-scheduler")
    assert b.steps == 2  # the second step, at once: no retry_period slept out
    assert (await lease(kube, namespace, name))["spec"]["holderIdentity"] == "pod-b"


async def _text(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


async def test_a_standby_role_is_ready_says_so_and_writes_nothing(
    kube: Kube, namespace: str
) -> None:
    name = unique("lease")
    election = {"enabled": True, "lease_name": name, "namespace": namespace, **FAST}
    cfg_a = scheduler_config(leader_election={**election, "identity": "a"})
    cfg_b = scheduler_config(leader_election={**election, "identity": "b"})
    async with SchedulerRole(cfg_a, kube) as a:
        await a.wait_ready()
        await poll(lambda: a.scheduler.leading, 10, "a leads")
        async with SchedulerRole(cfg_b, kube) as b:
            await b.wait_ready()
            assert b.elector is not None
            await poll(lambda: b.elector is not None and b.elector.holder == "a", 10, "b read")
            assert not b.scheduler.leading
            assert await _text(f"{b.probe_url}/readyz") == (200, "ok: standby")
            assert await _text(f"{a.probe_url}/readyz") == (200, "ok")
            _, metrics_b = await _text(f"{b.probe_url}/metrics")
            assert "hami_leader 0.0" in metrics_b
            assert "hami_pods_holding_devices" not in metrics_b  # cluster gauges: leader only
            metrics_a = (await _text(f"{a.probe_url}/metrics"))[1]
            assert "hami_leader 1.0" in metrics_a
            assert "hami_pods_holding_devices" in metrics_a
            answer = await b.scheduler.filter({"Pod": {}, "NodeNames": ["n"]})
            assert answer["Error"] == STANDBY
            assert (await b.scheduler.bind({"PodName": "p", "Node": "n"}))["Error"] == STANDBY
        # a stays leader when b stops
        assert a.scheduler.leading
    # a released on stop: the Lease is free for the next replica at once
    spec = (await lease(kube, namespace, name))["spec"]
    assert spec.get("holderIdentity", "") == ""
