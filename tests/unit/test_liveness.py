"""The reachability watch (stonemq/cluster/liveness.py) against real listeners: a process
SIGKILLed is judged dead within a fraction of a second (its kernel closes the connection and
refuses the next connect); a SIGSTOPped one never is (its connection stays open, its backlog
accepts); a listener that closes an idle connection but still accepts is live; a broker never
reached under its registration (still starting) is never judged; a new registration is judged
afresh; a dead broker whose listener accepts again is live again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from tcplistener import Listener

from stonemq.cluster.liveness import Reachability, Registration

pytestmark = pytest.mark.timeout(60)

# a listener that accepts and holds every connection, in a process of its own
SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
held = []
while True:
    held.append(s.accept()[0])
"""


@pytest.fixture
def watch() -> Iterator[Callable[[], tuple[Reachability, list[tuple[int, bool]]]]]:
    made: list[Reachability] = []

    def make() -> tuple[Reachability, list[tuple[int, bool]]]:
        events: list[tuple[int, bool]] = []
        reach = Reachability(1, lambda b, dead: events.append((b, dead)), retry_s=0.05)
        reach.start()
        made.append(reach)
        return reach, events

    yield make
    for reach in made:
        reach.close()


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 5.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, what
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_killed_process_is_dead_at_once_and_a_paused_one_never(watch) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        reach, events = watch()
        reach.set_brokers({2: Registration("127.0.0.1", port, 7)})
        time.sleep(0.3)  # connected
        server.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # paused: the connection stays open, connects are still accepted
        assert reach.dead() == frozenset() and events == []
        server.send_signal(signal.SIGKILL)
        took = _wait("judged dead", lambda: reach.dead() == {2})
        assert took < 1.0, took
        assert events == [(2, True)]
    finally:
        server.kill()
        server.wait()


def test_a_dead_listener_that_accepts_again_is_live_again(watch) -> None:
    listener = Listener()
    reach, events = watch()
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 7), 1: Registration("x", 1, 1)})
    _wait("connected", lambda: len(listener.accepted) == 1)
    listener.kill()
    _wait("judged dead", lambda: reach.dead() == {2})
    listener.revive()
    _wait("live again", lambda: reach.dead() == frozenset())
    assert events == [(2, True), (2, False)]


def test_an_idle_close_by_a_listening_broker_is_not_death(watch) -> None:
    listener = Listener()
    reach, events = watch()
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 7)})
    _wait("connected", lambda: len(listener.accepted) == 1)
    listener.drop_connections()  # connections.max.idle.ms: closed, but still listening
    _wait("connected again", lambda: len(listener.accepted) == 2)
    time.sleep(0.3)
    assert reach.dead() == frozenset() and events == []


def test_a_broker_never_reached_under_its_registration_is_not_judged(watch) -> None:
    listener = Listener()
    listener.kill()  # registered, not listening yet (recovering): refused from the start
    reach, events = watch()
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 7)})
    time.sleep(0.5)
    assert reach.dead() == frozenset() and events == []
    listener.revive()  # it listens: from now on a death is noticed
    _wait("connected", lambda: len(listener.accepted) == 1)
    listener.kill()
    _wait("judged dead", lambda: reach.dead() == {2})


def test_a_new_registration_is_judged_afresh(watch) -> None:
    listener = Listener()
    reach, events = watch()
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 7)})
    _wait("connected", lambda: len(listener.accepted) == 1)
    listener.kill()
    _wait("judged dead", lambda: reach.dead() == {2})
    # its session expired and it registered again (a restart still recovering): not dead
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 8)})
    _wait("not judged under the new registration", lambda: reach.dead() == frozenset())
    time.sleep(0.3)
    assert reach.dead() == frozenset()
    reach.set_brokers({})  # deregistered: nothing watched
    time.sleep(0.1)
    assert reach.dead() == frozenset()
    assert events == [(2, True)]  # only judgements are reported, not forgetting


def test_unreachable_includes_a_closed_connection_before_any_judgement(watch) -> None:
    """What clients are told (LEADER_NOT_AVAILABLE) may run ahead of the judgement: a broker
    whose connection is closed counts as unreachable at once, a judged one too, and neither
    once its listener accepts again; an idle close of a listening broker is put right by the
    immediate reconnect."""
    listener = Listener()
    reach, events = watch()
    reach.set_brokers({2: Registration("127.0.0.1", listener.port, 7)})
    _wait("connected", lambda: len(listener.accepted) == 1)
    time.sleep(0.01)
    assert reach.unreachable() == frozenset()
    listener.kill()
    _wait("unreachable", lambda: reach.unreachable() == {2})
    _wait("judged dead", lambda: reach.dead() == {2})
    assert reach.unreachable() == {2}
    listener.revive()
    _wait("reachable again", lambda: reach.unreachable() == frozenset(), timeout=5)
    # the watch's connect completes in the kernel's backlog: wait until the listener holds it,
    # or the idle close below would miss it
    _wait("accepted again", lambda: len(listener.accepted) == 2)
    listener.drop_connections()
    _wait("connected again", lambda: len(listener.accepted) >= 3)
    _wait("reachable after the idle close", lambda: reach.unreachable() == frozenset())
    assert events == [(2, True), (2, False)]  # the idle close was never judged
