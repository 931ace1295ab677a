"""server/connection.py's ``start_eagerly``: a request's handler takes its first step in the
dispatcher's turn, not in the event loop's next iteration, and then goes on as a task would
(results, exceptions and cancellation as with ``loop.create_task``)."""

from __future__ import annotations

import asyncio

import pytest

from stonemq.server.connection import start_eagerly


def test_the_first_step_runs_before_anything_already_waiting_on_the_loop() -> None:
    """A callback made ready before the request started still runs after the handler's
    first step (with ``create_task`` it ran first: the handler waited a loop iteration)."""
    order: list[str] = []

    async def handler(name: str) -> None:
        order.append(f"{name}:first")
        await asyncio.sleep(0)
        order.append(f"{name}:second")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(order.append, "other")
        tasks = [start_eagerly(handler("a")), start_eagerly(handler("b"))]
        assert order == ["a:first", "b:first"]
        await asyncio.gather(*(t for t in tasks if t is not None))

    asyncio.run(run())
    assert order == ["a:first", "b:first", "other", "a:second", "b:second"]


def test_a_handler_done_in_its_first_step_needs_no_task() -> None:
    done: list[int] = []

    async def handler() -> None:
        done.append(1)

    async def run() -> None:
        assert start_eagerly(handler()) is None
        assert done == [1]

    asyncio.run(run())


def test_it_goes_on_with_the_outcome_of_what_it_awaited() -> None:
    seen: list[object] = []

    async def handler(first: asyncio.Future[int], second: asyncio.Future[int]) -> None:
        seen.append(await first)
        try:
            await second
        except ValueError as exc:
            seen.append(str(exc))
        seen.append(await asyncio.shield(asyncio.sleep(0, "slept")))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        task = start_eagerly(handler(first, second))
        assert task is not None and seen == []
        loop.call_later(0.01, first.set_result, 7)
        loop.call_later(0.02, second.set_exception, ValueError("bad"))
        await task

    asyncio.run(run())
    assert seen == [7, "bad", "slept"]


def test_cancelling_its_task_cancels_the_handler_where_it_waits() -> None:
    events: list[str] = []

    async def handler(waiting: asyncio.Future[None]) -> None:
        try:
            await waiting
        except asyncio.CancelledError:
            events.append("cancelled inside")
            raise
        finally:
            events.append("finally")

    async def run() -> None:
        waiting = asyncio.get_running_loop().create_future()
        task = start_eagerly(handler(waiting))
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiting.cancelled()

    asyncio.run(run())
    assert events == ["cancelled inside", "finally"]


def test_an_exception_after_the_first_step_fails_its_task() -> None:
    async def handler() -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    async def run() -> None:
        task = start_eagerly(handler())
        assert task is not None
        with pytest.raises(KeyError):
            await task

    asyncio.run(run())
