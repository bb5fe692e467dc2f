"""The scheduler role fills the ``defrag`` policy's rows ahead of decisions after its
weights change (``hami.scheduler.role._prefill_defrag``), on the real control plane. A
cluster of its own: the change of weights would follow any other test's decisions."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from test_defrag_controlplane import NODES, TIMING, pod

from hami import log
from hami.core import defrag
from hami.testkit.cluster import LocalCluster, poll
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with LocalCluster(
        NODES, plane=controlplane, timing=TIMING, webhook=True, node_policy="defrag"
    ) as c:
        yield c


async def test_the_role_fills_the_rows_ahead_after_the_weights_change(
    cluster: LocalCluster,
) -> None:
    """After a change of the policy's weights every node's row is stale: the scheduler
    role's background task fills them while idle, without a decision asking."""
    assert cluster.role is not None
    scheduler = cluster.role.scheduler
    policy = scheduler.cluster.defrag
    await cluster.create_pod(pod(cluster, "weighed", "1", gpus=1))  # a request weighed
    await cluster.wait_running(["weighed"])
    generation, filled = policy.shapes.generation, policy.filled
    policy.shapes.observe(defrag.Shape("nvidia", 1, 35, 0, 35, (), (), 3000, 4096))
    policy.shapes.force_reweigh()
    assert policy.shapes.generation != generation

    def filled_ahead() -> bool:
        # rows=0 fills nothing here: it only says whether stale rows are left
        return not scheduler.cluster.prefill_defrag(0) and policy.filled > filled

    await poll(filled_ahead, 10, "rows filled ahead by the role")
