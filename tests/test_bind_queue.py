"""The per-node bind queue (issue 11 item 2): first come first served, only the head waits
for the node lock, and one lock change wakes exactly one bind."""

from __future__ import annotations

import asyncio

import pytest

from hami.scheduler.bindqueue import BindQueue, QueueTimeout

LONG = 30.0  # bounds that never run out in these tests


async def settle() -> None:
    """Let every runnable task run until it blocks again."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_one_lock_change_wakes_exactly_one_bind_in_order() -> None:
    queue = BindQueue()
    woken: list[int] = []  # binds past their wait for a lock change, in order
    finish = asyncio.Event()

    async def bind(i: int) -> None:
        async with queue.turn("n", LONG):
            mark = queue.generation("n")
            assert await queue.wait_change("n", mark, LONG)
            woken.append(i)
            await finish.wait()  # its turn lasts until the test lets it end

    tasks = [asyncio.create_task(bind(i)) for i in range(5)]
    await settle()
    assert woken == [] and queue.waiting("n") == 5
    for expected in range(5):
        assert queue.changed("n")  # the lock was released: one bind is woken ...
        await settle()
        assert woken == list(range(expected + 1))  # ... exactly one, the first in line
        assert queue.wakes == expected + 1
        # a second change while the head is still busy wakes nobody else
        assert not queue.changed("n")
        await settle()
        assert len(woken) == expected + 1
        finish.set()  # the head's turn ends: the next one takes the head
        await settle()
        finish.clear()
    await asyncio.gather(*tasks)
    assert queue.waiting("n") == 0


async def test_nodes_queue_independently() -> None:
    queue = BindQueue()
    inside: list[str] = []
    release = asyncio.Event()

    async def bind(node: str) -> None:
        async with queue.turn(node, LONG):
            inside.append(node)
            await release.wait()

    tasks = [asyncio.create_task(bind(n)) for n in ("a", "b", "a")]
    await settle()
    assert inside == ["a", "b"]  # the second bind on a waits, b does not
    release.set()
    await asyncio.gather(*tasks)
    assert inside == ["a", "b", "a"]


async def test_a_change_seen_before_waiting_is_not_missed() -> None:
    queue = BindQueue()
    async with queue.turn("n", LONG):
        mark = queue.generation("n")
        queue.changed("n")  # e.g. while the bind was reading the lock's pod
        assert await queue.wait_change("n", mark, LONG)
        assert not await queue.wait_change("n", queue.generation("n"), 0.01)


async def test_a_bind_whose_turn_does_not_come_in_time_leaves_the_line() -> None:
    queue = BindQueue()
    first_done = asyncio.Event()

    async def first() -> None:
        async with queue.turn("n", LONG):
            await first_done.wait()

    holder = asyncio.create_task(first())
    await settle()
    with pytest.raises(QueueTimeout) as caught:
        async with queue.turn("n", 0.01):
            pytest.fail("the turn must not come while the first bind holds it")
    assert caught.value.ahead == 1
    assert queue.waiting("n") == 1  # only the first one is left
    # a cancelled waiter leaves the line too, and the turn still passes on
    waiter = asyncio.create_task(first())
    third_in = asyncio.Event()

    async def third() -> None:
        async with queue.turn("n", LONG):
            third_in.set()

    last = asyncio.create_task(third())
    await settle()
    waiter.cancel()
    await settle()
    first_done.set()
    await asyncio.wait_for(third_in.wait(), LONG)
    await asyncio.gather(holder, last)
    assert queue.waiting("n") == 0
