"""What a handler gets: the request's identity, the broker's parts, and version-aware builders."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import heapq
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from stonemq.protocol.record_batch import CorruptRecordError
from stonemq.quotas.entity import ANONYMOUS_USER
from stonemq.server.collector import defer_full_collections, resume_full_collections
from stonemq.server.threads import name_os_thread

if TYPE_CHECKING:
    from stonemq.broker import Broker
    from stonemq.cluster.routing import BrokerEndpoint


T = TypeVar("T")

log = logging.getLogger("stonemq.handlers")

SLICE_NS = 5_000_000
"""Event-loop time a handler working through a request's entries (:meth:`RequestContext.paced`)
spends before it lets the other connections go first: one request naming 100,000 entries
held the loop for 1-3 s, and every other client waited that long (issue 17)."""
PACE_EVERY = 16
"""Entries between two looks at the clock in :meth:`RequestContext.paced`."""
_SORT_RUN = 8192
"""Entries sorted in one step by :meth:`RequestContext.paced_sorted` (about 4 ms of names)."""
ENTRIES_OFF_LOOP = 512
"""A request whose handler went through at least this many entries gets its response encoded
in the heavy-work thread: kio's encoder costs about 10 µs an entry, on the loop 1-2 s for
100,000 of them."""


@functools.cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    """The kio module that holds the response classes for one API version."""
    import importlib

    cls = load_response_schema(api_key, api_version)
    return importlib.import_module(cls.__module__)


@functools.cache
def field_names(cls: type) -> frozenset[str]:
    """The fields a kio entity class has (versions of an entity differ in them)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


MAX_ERROR_MESSAGE_CHARS = 1024
"""An error message longer than this is cut short. Messages echo what the client sent (a topic
name of 32,767 characters made one of 32,830, past what a string holds in non-flexible
versions: the answer failed to encode, the connection closed with an internal error logged:
an independent fuzz campaign); at 4 bytes a character this stays far inside the limit."""


def build(cls: type, **values: Any) -> Any:
    """Instantiate a kio entity, dropping the values this version of it has no field for.

    Handlers are written once for all versions of an API; fields a version lacks are simply
    not sent, exactly as Kafka does. ``throttle_time`` may be given in ms as an int.
    """
    names = field_names(cls)
    kept = {k: v for k, v in values.items() if k in names}
    message = kept.get("error_message")
    if isinstance(message, str) and len(message) > MAX_ERROR_MESSAGE_CHARS:
        kept["error_message"] = message[: MAX_ERROR_MESSAGE_CHARS - 3] + "..."
    if "throttle_time" in kept and isinstance(kept["throttle_time"], int):
        kept["throttle_time"] = datetime.timedelta(milliseconds=kept["throttle_time"])
    return cls(**kept)


_heavy: ThreadPoolExecutor | None = None


def named_once(
    groups: Sequence[Any],
    key: Callable[[Any], Any],
    parts: Callable[[Any], Sequence[Any]],
    index: Callable[[Any], int],
) -> dict[int, Any] | None:
    """Kafka's KafkaApis keeps a request's partitions in an ordered map: a partition named
    twice is taken once, where it was first named, with its last entry. ``groups`` are the
    request's topic entries (``key(g)`` names the topic, ``parts(g)`` its partition entries,
    ``index(p)`` a partition's number). None when no partition is named twice: the common
    case, found by one set's size (a single entry of at most one partition skips even that).
    Otherwise, by ``id`` of every partition entry, the entry that stands in its place, or
    None for one dropped (Produce, Fetch)."""
    if len(groups) == 1 and len(parts(groups[0])) < 2:
        return None
    keys = [((key(g), index(p)), p) for g in groups for p in parts(g)]
    if len({k for k, _ in keys}) == len(keys):
        return None
    last = dict(keys)
    out: dict[int, Any] = {}
    for k, p in keys:
        out[id(p)] = last.pop(k, None)  # the first entry of k takes the last; others None
    return out


def read_failure(exc: Exception, partition: str, what: str) -> ErrorCode:
    """The error of one partition whose read failed with ``exc`` (called in its ``except``
    clause; logged): one partition's failure is its own, the request's other partitions are
    answered and the connection stays, as Kafka's ``ReplicaManager.readFromLog`` and
    ``KafkaApis`` ListOffsets answer any exception per partition. Stored bytes that do not
    parse are CORRUPT_MESSAGE (Kafka's ``CorruptRecordException``), anything unforeseen
    UNKNOWN_SERVER_ERROR with its traceback."""
    if isinstance(exc, CorruptRecordError):
        log.error("%s of %s: %s", what, partition, exc)
        return ErrorCode.corrupt_message
    log.exception("%s of %s failed", what, partition)
    return ErrorCode.unknown_server_error


def heavy_work() -> ThreadPoolExecutor:
    """The one thread that builds and encodes large responses (Metadata of many partitions):
    Python work that would hold the event loop for long. One at a time, so the loop keeps a
    fair share of the GIL while it runs."""
    global _heavy
    if _heavy is None:
        _heavy = ThreadPoolExecutor(
            1, thread_name_prefix="stonemq-heavy", initializer=name_os_thread
        )
    return _heavy


@dataclasses.dataclass(slots=True)
class RequestContext:
    """One request being handled."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    broker: Broker
    # set by a handler whose response is large (Metadata of many partitions): the
    # connection encodes it in a thread instead of on the event loop
    encode_in_thread: bool = False
    # the name of the listener the request came in on (Kafka's listener name)
    listener: str = "PLAINTEXT"
    # the client's principal name for quotas (Kafka's anonymous principal without SASL)
    user: str = ANONYMOUS_USER
    # set by a handler that throttled its own response (a fetch over its consumer byte
    # rate answers empty): the connection mutes for at least this long (KIP-219)
    throttle_ms: int = 0
    # the connection's share of the dispatcher's rounds (stonemq/server/dispatcher.py), for a
    # handler that moves many bytes in steps; None outside a connection
    turns: Any = None
    # bytes this request's handler charged to the connection's turns so far
    charged: int = 0
    # set by a handler answering with a response kept for reuse (codec.EncodedOnce: a cached
    # Metadata response): the connection sends those bytes when it sends ``reuse.response``
    # unchanged (a handler that encodes its answer itself returns a codec.Encoded instead)
    reuse: Any = None
    # the connection sends FileRanges (storage/file_range.py) with sendfile: a fetch may
    # answer with segment ranges instead of bytes read into memory
    file_ranges: bool = False
    # perf_counter ns at which this request's current slice of loop time ends (paced); 0:
    # not started
    slice_end_ns: int = 0
    # entries the handler went through with paced()
    entries: int = 0
    # a large request: the collector's full collections wait until it ends (collector.py)
    defers_collections: bool = False
    # set by a handler that answers by closing the connection (Kafka's closeConnection: an
    # acks=0 produce that failed): closed once the responses queued before it are sent
    close_reason: str | None = None

    async def paced(self, items: Iterable[T]) -> AsyncIterator[T]:
        """``items`` one by one, letting the other connections go first whenever this request
        has held the event loop for ``SLICE_NS`` since it last let them: the one way a
        handler works through a request's entries (topics, partitions, groups, resources),
        however many a client names. A request of ``ENTRIES_OFF_LOOP`` entries or more also
        gets its response encoded off the loop."""
        n = 0
        for item in items:
            yield item
            n += 1
            if n == PACE_EVERY:
                n = 0
                self.entries += PACE_EVERY
                if self.entries >= ENTRIES_OFF_LOOP and not self.encode_in_thread:
                    self.mark_large()
                await self.keep_pace()
        self.entries += n

    async def keep_pace(self) -> None:
        """:meth:`paced`'s look at the clock, for a hot loop that cannot take an async
        iterator (Fetch's partitions, every ``PACE_EVERY``): let the other connections go
        first if this request's slice of loop time is spent."""
        now = time.perf_counter_ns()
        if not self.slice_end_ns:
            self.slice_end_ns = now + SLICE_NS
        elif now >= self.slice_end_ns:
            await self.give_way()

    async def paced_sorted(self, items: Iterable[Any]) -> list[Any]:
        """``sorted(items)``, in steps that let the other connections go first as
        :meth:`paced` does: runs of ``_SORT_RUN`` sorted one at a time, then merged (one
        ``sorted`` of 100,000 topic names held the loop 50 ms)."""
        values = list(items)
        if len(values) <= _SORT_RUN:
            return sorted(values)
        runs = [
            sorted(values[i : i + _SORT_RUN])
            async for i in self.paced(range(0, len(values), _SORT_RUN))
        ]
        return [value async for value in self.paced(heapq.merge(*runs))]

    def mark_large(self) -> None:
        """This request names many entries: its response is encoded in the heavy-work thread,
        and full collections wait until its task ends."""
        self.encode_in_thread = True
        if self.defers_collections:
            return
        task = asyncio.current_task()
        if task is not None:
            self.defers_collections = True
            defer_full_collections()
            task.add_done_callback(resume_full_collections)

    async def give_way(self) -> None:
        """Let the other connections go first: wait for this connection's next turn in the
        dispatcher's rounds (one loop iteration when nobody else has work), and start a new
        slice of loop time."""
        turns = self.turns
        if turns is None:
            await asyncio.sleep(0)
        else:
            await turns.next_turn()
        self.slice_end_ns = time.perf_counter_ns() + SLICE_NS

    async def take_turn(self) -> None:
        """Wait for the connection's next turn if it has spent the current one (a handler
        moving many bytes calls this between steps: the fetch before each partition), so
        other connections are served meanwhile."""
        turns = self.turns
        if turns is not None and turns.allowance <= 0:
            await turns.next_turn()

    def charge(self, nbytes: int) -> None:
        """Charge ``nbytes`` this request moved (a fetch's records) to the connection's turns;
        its response's other bytes are charged when it is sent."""
        if self.turns is not None and nbytes:
            self.charged += nbytes
            self.turns.charge(nbytes, self.api_key)

    @property
    def advertised_address(self) -> tuple[str, int]:
        """This broker's address for the client's listener, as Kafka answers each listener's
        clients with that listener's advertised endpoint."""
        return self.broker.settings.advertised_for(self.listener)

    def address_of(self, broker_id: int, host: str, port: int) -> tuple[str, int]:
        """The address a response gives for a broker: this broker's for the client's
        listener, another broker's as it registered."""
        if broker_id == self.broker.broker_id:
            return self.advertised_address
        return host, port

    @property
    def module(self) -> ModuleType:
        return response_module(self.api_key, self.api_version)

    def build(self, type_name: str, **values: Any) -> Any:
        """Build ``type_name`` from this request's response module (see :func:`build`)."""
        return build(getattr(self.module, type_name), **values)

    def not_here(self, topic: str, partition: int) -> ErrorCode:
        """The error for a partition storage does not hold: NOT_LEADER_OR_FOLLOWER when the
        topic has it and its journal partition is led by another broker (clients then
        refresh their metadata and go there), else UNKNOWN_TOPIC_OR_PARTITION."""
        record = self.broker.topics.get(topic)
        if record is None or not 0 <= partition < record.partitions:
            return ErrorCode.unknown_topic_or_partition
        if self.broker.routing.leads(record.journal_partitions[partition]):
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.not_leader_or_follower

    def leader_epoch_error(self, record: Any, partition: int, client_epoch: int) -> ErrorCode:
        """KIP-320: the client's ``current_leader_epoch`` for a partition (Fetch v9+, ListOffsets
        v4+, OffsetForLeaderEpoch v2+) against the partition's leader epoch here (its journal
        partition's, as Metadata gives it), as Kafka's ``Partition.checkCurrentLeaderEpoch``:
        -1 (not given) or equal passes; below it FENCED_LEADER_EPOCH (the client's metadata is
        stale: it refreshes it), above it UNKNOWN_LEADER_EPOCH (this broker has not learned the
        new epoch yet: the client retries). Checked before leadership, as Kafka does."""
        if client_epoch == -1:
            return ErrorCode.none
        current = self.broker.routing.leadership(record.journal_partitions[partition]).leader_epoch
        if client_epoch == current:
            return ErrorCode.none
        if client_epoch < current:
            return ErrorCode.fenced_leader_epoch
        return ErrorCode.unknown_leader_epoch

    def not_led_here(self, record: Any, partition: int) -> bool:
        """In a cluster: the partition's journal partition is not led here (or not ready:
        its epoch not yet checkpointed), so clients get NOT_LEADER_OR_FOLLOWER even when
        this broker holds it as a follower. Always False on a single node."""
        replicas = self.broker.replicas
        return replicas is not None and not replicas.leads(record.journal_partitions[partition])

    def current_leader(self, topic: str, partition: int) -> tuple[int, int, BrokerEndpoint | None]:
        """KIP-951's hint for a NOT_LEADER_OR_FOLLOWER answer: the partition's leader id and
        leader epoch (-1, -1 when unknown) and that leader's endpoint, if it is alive."""
        record = self.broker.topics.get(topic)
        if record is None or not 0 <= partition < record.partitions:
            return -1, -1, None
        routing = self.broker.routing
        lead = routing.leadership(record.journal_partitions[partition])
        endpoint = routing.broker(lead.leader) if lead.leader >= 0 else None
        return lead.leader, lead.leader_epoch, endpoint
