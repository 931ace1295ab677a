"""The records of ``__consumer_offsets``: Kafka's key/value formats and the batches carrying them.

The internal topic holds two kinds of record, in Kafka's own binary layouts (so Kafka's tools
could read them):

- an **offset commit**: key ``OffsetCommitKey`` v1 (group, topic, partition), value
  ``OffsetCommitValue`` v3 (offset, leader epoch, metadata, commit timestamp), or v1 (offset,
  metadata, commit and expire timestamps) for a commit that carried a retention time; a null
  value is a tombstone (the offset was deleted or expired);
- a **group**: key ``GroupMetadataKey`` v2 (group), value ``GroupMetadataValue`` v3 (protocol
  type, generation, protocol, leader, state timestamp, members with their subscriptions and
  assignments); a null value means the group was deleted.

Strings are int16-length UTF-8 (-1 for null), byte strings int32-length, arrays int32-counted,
all big-endian (Kafka's group metadata schemas: the structs below are theirs, not the record
framing). A group lives in partition ``abs(javaHashCode(group)) % partitions``, like Kafka.
The batches carrying these records are built and read by the one record codec and validator
(:mod:`stonemq.protocol.record_batch`), under the rules a produce is checked by: a batch that
breaks them is skipped whole. Replaying a partition's records in order rebuilds its state;
records this module cannot parse are skipped (:class:`LogFormatError`), never fatal.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stonemq.protocol.record_batch import encode_batch, iter_records

OFFSETS_TOPIC = "__consumer_offsets"

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class LogFormatError(ValueError):
    """A record of the offsets topic this broker cannot read."""


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's routing: ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``."""
    h = 0
    data = group_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % partitions


# -- the values ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int  # -1 when unknown
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int = -1  # set by an OffsetCommit v2-v4 retention time


@dataclass(frozen=True, slots=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the metadata of the selected protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class StoredGroup:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    state_timestamp_ms: int
    members: tuple[StoredMember, ...]


Key = OffsetKey | GroupKey
Value = CommittedOffset | StoredGroup | None


# -- encoding --------------------------------------------------------------------------------
def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    raw = value.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def _bytes(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def encode_key(key: Key) -> bytes:
    if isinstance(key, OffsetKey):
        return (
            _I16.pack(OFFSET_KEY_VERSION)
            + _string(key.group_id)
            + _string(key.topic)
            + _I32.pack(key.partition)
        )
    return _I16.pack(GROUP_KEY_VERSION) + _string(key.group_id)


def encode_value(value: Value) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, CommittedOffset):
        if value.expire_timestamp_ms >= 0:  # only v1 holds an expiry (Kafka writes v1 then)
            return (
                _I16.pack(1)
                + _I64.pack(value.offset)
                + _string(value.metadata)
                + _I64.pack(value.commit_timestamp_ms)
                + _I64.pack(value.expire_timestamp_ms)
            )
        return (
            _I16.pack(OFFSET_VALUE_VERSION)
            + _I64.pack(value.offset)
            + _I32.pack(value.leader_epoch)
            + _string(value.metadata)
            + _I64.pack(value.commit_timestamp_ms)
        )
    parts = [
        _I16.pack(GROUP_VALUE_VERSION),
        _string(value.protocol_type),
        _I32.pack(value.generation),
        _string(value.protocol),
        _string(value.leader),
        _I64.pack(value.state_timestamp_ms),
        _I32.pack(len(value.members)),
    ]
    for m in value.members:
        parts += [
            _string(m.member_id),
            _string(m.group_instance_id),
            _string(m.client_id),
            _string(m.client_host),
            _I32.pack(m.rebalance_timeout_ms),
            _I32.pack(m.session_timeout_ms),
            _bytes(m.subscription),
            _bytes(m.assignment),
        ]
    return b"".join(parts)


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise LogFormatError("record field runs past its end")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self._take(n).decode("utf-8")

    def required_string(self) -> str:
        value = self.string()
        if value is None:
            raise LogFormatError("null where a string is required")
        return value

    def bytes_(self) -> bytes:
        n = self.i32()
        return b"" if n < 0 else self._take(n)


def decode_key(raw: bytes) -> Key:
    r = _Reader(raw)
    version = r.i16()
    if version in (0, 1):
        return OffsetKey(r.required_string(), r.required_string(), r.i32())
    if version == GROUP_KEY_VERSION:
        return GroupKey(r.required_string())
    raise LogFormatError(f"unknown key version {version}")


def decode_offset_value(raw: bytes) -> CommittedOffset:
    r = _Reader(raw)
    version = r.i16()
    if version not in (1, 3):
        raise LogFormatError(f"offset value version {version} not supported")
    offset = r.i64()
    epoch = r.i32() if version >= 3 else -1
    metadata = r.string() or ""
    timestamp = r.i64()
    expire = r.i64() if version == 1 else -1
    return CommittedOffset(offset, epoch, metadata, timestamp, expire)


def decode_group_value(raw: bytes) -> StoredGroup:
    r = _Reader(raw)
    version = r.i16()
    if version != GROUP_VALUE_VERSION:
        raise LogFormatError(f"group value version {version} not supported")
    protocol_type = r.required_string()
    generation = r.i32()
    protocol = r.string()
    leader = r.string()
    timestamp = r.i64()
    members = []
    for _ in range(r.i32()):
        members.append(
            StoredMember(
                member_id=r.required_string(),
                group_instance_id=r.string(),
                client_id=r.required_string(),
                client_host=r.required_string(),
                rebalance_timeout_ms=r.i32(),
                session_timeout_ms=r.i32(),
                subscription=r.bytes_(),
                assignment=r.bytes_(),
            )
        )
    return StoredGroup(protocol_type, generation, protocol, leader, timestamp, tuple(members))


def decode(key: bytes | None, value: bytes | None) -> tuple[Key, Value]:
    """One stored record; raises :class:`LogFormatError` for anything not ours."""
    if key is None:
        raise LogFormatError("record without a key")
    parsed = decode_key(key)
    if value is None:
        return parsed, None
    if isinstance(parsed, OffsetKey):
        return parsed, decode_offset_value(value)
    return parsed, decode_group_value(value)


# -- RecordBatch v2: through the one record codec --------------------------------------------
def build_batch(records: Sequence[tuple[bytes, bytes | None]], timestamp_ms: int = -1) -> bytearray:
    """One uncompressed RecordBatch v2 holding ``records`` (key, value), base offset 0, built
    by the record codec (:func:`stonemq.protocol.record_batch.encode_batch`); a bytearray, so
    the storage engine patches its base offset in place."""
    if not records:
        raise ValueError("a batch needs at least one record")
    if timestamp_ms < 0:
        timestamp_ms = int(time.time() * 1000)
    return bytearray(encode_batch(0, [(timestamp_ms, key, value, ()) for key, value in records]))


def decode_batch(
    batch: bytes | bytearray | memoryview,
) -> tuple[list[tuple[int, Key, Value]], int]:
    """The ``(offset, key, value)`` entries of one stored batch, and how many of its records
    are not ours (skipped, see :class:`LogFormatError`). The batch is read by the record
    codec under the validator's rules (:func:`stonemq.protocol.record_batch.iter_records`):
    a batch that breaks them raises the same RecordBatchError a produce of it would get
    (CorruptRecordError, InvalidRecordError), and none of its records is taken."""
    entries: list[tuple[int, Key, Value]] = []
    skipped = 0
    for rec in iter_records(batch):
        try:
            key, value = decode(rec.key, rec.value)
        except (LogFormatError, UnicodeDecodeError):
            skipped += 1
            continue
        entries.append((rec.offset, key, value))
    return entries, skipped


def encode_records(entries: Iterable[tuple[Key, Value]]) -> list[tuple[bytes, bytes | None]]:
    return [(encode_key(k), encode_value(v)) for k, v in entries]
