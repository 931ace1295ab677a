"""The request budget's reading rules and the dispatcher's rounds and split-lag holds, on
stand-in connections (the rules are pure; the broker-level behaviour is tested over sockets
in tests/integration/test_hostile_requests.py and test_backpressure.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

from stonemq.handlers.context import RequestContext
from stonemq.server.budget import RequestBudget
from stonemq.server.dispatcher import TURN_BYTES, Dispatcher


class _Reader:
    def __init__(self) -> None:
        self.woken = 0
        self.receiving_since = 0.0
        self.yields = False

    def update_reading(self) -> None:
        self.woken += 1


def test_request_budget_lets_one_in_and_wakes_waiters_below_the_limit() -> None:
    budget = RequestBudget(100)
    assert not budget.exhausted
    budget.take(5000)  # one request larger than the limit is always let in
    assert budget.exhausted
    a, b = _Reader(), _Reader()
    budget.waiting |= {a, b}
    budget.give_back(4900)  # 100 left: at the limit
    assert budget.exhausted and (a.woken, b.woken) == (0, 0)
    budget.give_back(1)
    assert not budget.exhausted and (a.woken, b.woken) == (1, 1)
    assert not budget.waiting
    unlimited = RequestBudget(-1)
    unlimited.take(1 << 40)
    assert not unlimited.exhausted
    assert unlimited.may_read(a, growing=True, busy=True)


def test_past_the_limit_only_the_first_partial_frame_grows() -> None:
    budget = RequestBudget(1000)
    first, second, small = _Reader(), _Reader(), _Reader()
    assert budget.may_read(first, growing=True, busy=False)  # under the limit: anyone grows
    budget.reserve(first, 800)
    assert budget.may_read(second, growing=True, busy=False)
    budget.reserve(second, 400)  # 1200 reserved: past the limit
    assert budget.owner is first
    assert budget.may_read(first, growing=True, busy=False)
    assert not budget.may_read(second, growing=True, busy=False)
    assert budget.may_read(small, growing=False, busy=True)  # nothing in flight: reads go on
    budget.waiting.add(second)
    budget.reserve(first, 0)  # its frame arrived whole: the next partial frame owns
    assert budget.owner is second and second.woken == 1
    assert budget.may_read(second, growing=True, busy=False)
    budget.forget(second)
    assert budget.used_bytes == 0 and budget.owner is None


def test_an_owner_whose_frame_arrived_goes_to_the_back_of_the_line() -> None:
    """A buffer that still holds part of the next frame keeps its reservation, but not its
    place: the frame that started next owns (before, the first connection stayed the owner
    for as long as its buffer held more than 64 KiB, and read on past the limit)."""
    budget = RequestBudget(1000)
    first, second = _Reader(), _Reader()
    budget.may_read(first, growing=True, busy=False)
    budget.reserve(first, 900)
    budget.may_read(second, growing=True, busy=False)
    budget.reserve(second, 300)
    budget.waiting.add(second)
    budget.frame_taken(first)
    assert budget.owner is second and second.woken == 1
    assert budget.reserved_bytes == 1200  # still held, still counted
    assert not budget.may_read(first, growing=True, busy=False)
    budget.frame_taken(second)
    assert budget.owner is first


def test_an_owner_the_broker_pauses_yields_to_the_next() -> None:
    """A throttled (or held) connection's partial frame cannot finish until the broker lets it
    read again: meanwhile the next partial frame owns, and the first gets its place back."""
    budget = RequestBudget(1000)
    throttled, other = _Reader(), _Reader()
    budget.may_read(throttled, growing=True, busy=False)
    budget.reserve(throttled, 600)
    budget.take(500)  # 1100 used: past the limit
    assert not budget.may_read(other, growing=True, busy=False)
    budget.waiting.add(other)
    throttled.yields = True
    budget.recheck()
    assert other.woken == 1 and budget.owner is other
    assert budget.may_read(other, growing=True, busy=False)
    throttled.yields = False
    assert budget.owner is throttled


def test_yielding_owners_are_passed_over_only_while_they_hold_less_than_the_limit() -> None:
    """Connections that grow a frame as owner, then yield, must not each leave a whole frame
    held past the limit: once those passed over hold the limit, the yielding one stays the
    owner and the rest wait until it reads again (it is not closed as stalled meanwhile)."""
    budget = RequestBudget(1000)
    first, second, third = _Reader(), _Reader(), _Reader()
    for conn, held in ((first, 700), (second, 400), (third, 0)):
        budget.may_read(conn, growing=True, busy=False)
        budget.reserve(conn, held)
    first.yields = True
    assert budget.owner is second  # 700 passed over: under the limit
    second.yields = True
    assert budget.owner is second  # 1100 would be passed over: it stays the owner
    assert not budget.may_read(third, growing=True, busy=False)
    budget.waiting.add(third)
    assert budget.stalled_owner(now=1e9, stall_s=5) is None  # its silence is the broker's
    second.yields = False
    budget.reserve(second, 0)  # its frame arrived whole
    assert third.woken == 1 and budget.owner is third


def test_a_closed_owner_hands_over_even_with_nothing_reserved() -> None:
    """An owner whose buffer is full but not grown yet holds 0 bytes: closing it still wakes
    the next in line (before, only a reservation that shrank woke anyone)."""
    budget = RequestBudget(1000)
    owner, next_in_line = _Reader(), _Reader()
    budget.take(1500)  # past the limit, none of it theirs
    budget.may_read(owner, growing=True, busy=False)
    assert not budget.may_read(next_in_line, growing=True, busy=False)
    budget.waiting.add(next_in_line)
    budget.forget(owner)
    assert budget.owner is next_in_line and next_in_line.woken == 1
    assert budget.reserved_bytes == 0


def test_requests_in_flight_past_the_limit_stop_only_connections_with_their_own() -> None:
    """A client's backlog (a throttled producer's pipelined requests) holding the whole budget
    stops that client, not a connection with nothing in flight: it reads its next request."""
    budget = RequestBudget(1000)
    owner, busy, idle = _Reader(), _Reader(), _Reader()
    budget.may_read(owner, growing=True, busy=False)
    budget.reserve(owner, 100)
    budget.take(2000)
    assert budget.may_read(owner, growing=True, busy=False)  # its frame can finish
    assert not budget.may_read(owner, growing=True, busy=True)  # its own drain first
    assert not budget.may_read(busy, growing=False, busy=True)
    assert budget.may_read(idle, growing=False, busy=False)
    assert not budget.may_read(idle, growing=True, busy=False)  # but not grow: not the owner
    budget.waiting |= {owner, busy, idle}
    budget.recheck()
    assert (owner.woken, busy.woken, idle.woken) == (1, 0, 0)


def test_an_owner_silent_while_others_wait_is_the_stalled_one() -> None:
    budget = RequestBudget(1000)
    owner, other = _Reader(), _Reader()
    budget.may_read(owner, growing=True, busy=False)
    budget.reserve(owner, 2000)
    owner.receiving_since = 100.0
    assert budget.stalled_owner(now=200.0, stall_s=5) is None  # nobody waits for it
    assert not budget.may_read(other, growing=True, busy=False)
    budget.waiting.add(other)
    assert budget.stalled_owner(now=104.0, stall_s=5) is None  # silent for 4 s only
    # silent: its peer sends nothing, or reads none of its responses (the broker paused it)
    assert budget.stalled_owner(now=105.0, stall_s=5) is owner
    budget.waiting.add(owner)  # paused by the budget itself: its silence is not its peer's
    assert budget.stalled_owner(now=300.0, stall_s=5) is None
    budget.waiting.discard(owner)
    owner.yields = True  # throttled: the next partial frame owns; nobody is stalled by it
    assert budget.stalled_owner(now=300.0, stall_s=5) is None


API_KEYS = {"produce": 0, "fetch": 1, "metadata": 3, "heartbeat": 12}


class _Conn:
    """Stands in for a connection: a queue of named requests, a log of what started."""

    def __init__(self, name: str, requests: list[str], started: list[str], size: int = 100):
        self.name = name
        self.requests = requests
        self.started = started
        self.size = size
        self.released = 0
        self.dispatcher: Dispatcher | None = None
        self.allowance = 0
        self.waiters: list[asyncio.Future[None]] = []
        self.handlers: dict[str, Callable[[_Conn], Coroutine[Any, Any, None]]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def charge(self, nbytes: int, api_key: int) -> None:  # RequestContext's turns
        assert self.dispatcher is not None
        self.dispatcher.charge(self, nbytes, api_key)

    def next_turn(self) -> asyncio.Future[None]:
        assert self.dispatcher is not None
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        self.dispatcher.ready(self)
        return future

    def wake_steps(self) -> None:
        waiters, self.waiters = self.waiters, []
        for future in waiters:
            future.set_result(None)

    def start_next(self) -> tuple[int, int] | None:
        assert self.dispatcher is not None
        if not self.requests:
            return None
        if self.requests[0] == "produce" and self.dispatcher.produce_held:
            self.dispatcher.hold(self)
            return None
        request = self.requests.pop(0)
        self.started.append(f"{self.name}:{request}")
        handler = self.handlers.get(request)
        if handler is not None:  # a handler that runs on, as a connection's task does
            self.tasks.append(asyncio.get_running_loop().create_task(handler(self)))
        return API_KEYS[request], self.size

    @property
    def next_api_key(self) -> int | None:
        return API_KEYS[self.requests[0]] if self.requests else None

    def release(self) -> None:
        self.released += 1
        assert self.dispatcher is not None
        self.dispatcher.ready(self)


async def serve(dispatcher: Dispatcher, *conns: _Conn, iterations: int = 10) -> None:
    for conn in conns:
        conn.dispatcher = dispatcher
        dispatcher.ready(conn)
    for _ in range(iterations):
        await asyncio.sleep(0)


def test_rounds_start_one_request_per_connection_and_hold_only_produces() -> None:
    lag = [5000]  # the splitter lags: produces wait, the others do not
    dispatcher = Dispatcher(lambda: lag[0], max_lag_bytes=1000)
    started: list[str] = []
    hog = _Conn("hog", ["metadata"] * 5, started)
    producer = _Conn("p", ["produce", "produce"], started)
    consumer = _Conn("c", ["fetch", "heartbeat"], started)

    async def run() -> None:
        await serve(dispatcher, hog, producer, consumer)
        assert started == [
            "hog:metadata", "c:fetch",
            "hog:metadata", "c:heartbeat",
            "hog:metadata", "hog:metadata", "hog:metadata",
        ]  # fmt: skip
        assert set(dispatcher.held) == {producer}
        dispatcher.recheck()
        assert producer.released == 0  # still lagging
        lag[0] = 1000
        dispatcher.recheck()
        await serve(dispatcher, iterations=4)
        assert producer.released == 1 and not dispatcher.held
        assert started[-2:] == ["p:produce", "p:produce"]  # in one turn: they share a write

    asyncio.run(run())


def test_a_turn_starts_pipelined_produces_up_to_a_mebibyte() -> None:
    started: list[str] = []
    big = _Conn("big", ["produce"] * 6 + ["metadata", "produce"], started, size=300_000)
    other = _Conn("o", ["metadata", "metadata"], started)
    asyncio.run(serve(Dispatcher(), big, other))
    assert started == [
        "big:produce", "big:produce", "big:produce", "big:produce", "o:metadata",
        "big:produce", "big:produce", "o:metadata",
        "big:metadata",
        "big:produce",
    ]  # fmt: skip


MIB = 1 << 20


def stepped_fetch(partitions: int, started: list[str]) -> Callable[[_Conn], Any]:
    """A fetch handler as handlers/fetch.py steps: before each partition it waits for its
    connection's turn if the last one is spent, and charges the records it reads."""

    async def handler(conn: _Conn) -> None:
        ctx = RequestContext(1, 12, 0, "c", "h", None, turns=conn)  # type: ignore[arg-type]
        for p in range(partitions):
            await ctx.take_turn()
            started.append(f"{conn.name}:part{p}")
            ctx.charge(MIB)
        started.append(f"{conn.name}:answered")

    return handler


def test_a_large_fetch_is_read_a_turn_per_round_between_the_producers_turns() -> None:
    """A consumer's fetch of 8 partitions of 1 MiB each and a producer pipelining 256 KiB
    produces: the fetch reads about one turn's bytes per round, and the producer starts a
    run of produces in between, every round. The dispatcher's own accounting bounds what one
    connection moved in a round to a turn plus one partition (before, a fetch read and
    answered all 8 MiB in one go while the producer waited)."""
    started: list[str] = []
    dispatcher = Dispatcher()
    consumer = _Conn("c", ["fetch"], started)
    consumer.handlers["fetch"] = stepped_fetch(8, started)
    producer = _Conn("p", ["produce"] * 40, started, size=256 * 1024)

    async def run() -> None:
        await serve(dispatcher, consumer, producer, iterations=60)
        await asyncio.gather(*consumer.tasks)

    asyncio.run(run())
    parts = [i for i, s in enumerate(started) if s.startswith("c:part")]
    last_produce = max(i for i, s in enumerate(started) if s == "p:produce")
    assert len(parts) == 8 and started[-1] == "c:answered"
    assert started.count("p:produce") == 40
    while_producing = [i for i in parts if i < last_produce]
    assert len(while_producing) >= 4, started
    for before, after in itertools.pairwise(while_producing):
        # the producer started produces between two steps of the fetch
        assert "p:produce" in started[before + 1 : after], started
    # once the producer is done the fetch reads on without waiting for rounds of nobody
    assert started[parts[-1] + 1 :] == ["c:answered"]
    assert dispatcher.most_in_a_round <= TURN_BYTES + MIB, dispatcher.most_in_a_round
    assert dispatcher.rounds >= 8


def test_a_connection_in_debt_skips_rounds_unless_it_is_alone() -> None:
    """A connection that moved 3.5 MiB more than its turn (a large response) skips 3 rounds
    while another is served each round; alone, it is credited at once (no idle rounds)."""
    started: list[str] = []
    dispatcher = Dispatcher()
    debtor = _Conn("d", ["metadata"] * 2, started)
    other = _Conn("o", ["metadata"] * 6, started)
    debtor.dispatcher = other.dispatcher = dispatcher
    debtor.allowance = -(3 * MIB + MIB // 2)

    async def together() -> None:
        await serve(dispatcher, debtor, other, iterations=12)

    asyncio.run(together())
    assert started[:7] == ["o:metadata"] * 3 + ["d:metadata", "o:metadata"] * 2, started
    started.clear()
    alone = _Conn("a", ["metadata"], started)
    alone.allowance = -(50 * MIB)
    solo = Dispatcher()

    async def by_itself() -> None:
        await serve(solo, alone, iterations=1)

    asyncio.run(by_itself())
    assert started == ["a:metadata"]
    assert solo.rounds == 51  # credited 51 times within one loop iteration
