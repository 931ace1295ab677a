"""The Spark sink's choice of each row's partition, as Kafka's Java producer makes it, over whole
Arrow columns: ``Utils.murmur2`` of the key vectorized with numpy, an explicit ``partition``
column first, and Kafka's built-in sticky partitioning (KIP-794) for rows without a key.

Spark's Kafka sink hands each row to Kafka's Java producer, whose built-in partitioner takes
a record's partition when it has one, ``toPositive(murmur2(key)) % partitions`` when it has a
key, and otherwise sticks to one partition until ``batch.size`` bytes went to it, then moves
on. :func:`partitions_for` gives the same answer for a whole Arrow batch with a few numpy
calls per key word and per sticky run, never a Python call per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

# Kafka's Utils.murmur2 constants
MURMUR2_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)
_R = np.uint32(24)

_BINARY_LIKE = (pa.BinaryArray, pa.LargeBinaryArray, pa.StringArray, pa.LargeStringArray)
_NO_BYTES = np.zeros(0, dtype=np.uint8)


def murmur2(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's ``Utils.murmur2`` of every value of ``keys`` (binary, large binary, string or
    large string, or a view of either: strings hash their UTF-8 bytes), as uint32 (Java's
    int read unsigned); a null row's hash is that of whatever bytes its offsets span
    (usually none) and means nothing.

    Nothing is done per row in Python: the rows are ordered by their number of 4-byte words,
    longest first, so the rows that have a word ``w`` are a prefix of that order; every
    word's mix (which does not depend on the hash) is computed at once, then the hash takes
    them in with a loop over the word index, two numpy operations on that prefix a step.
    """
    if isinstance(keys, pa.ChunkedArray):
        if keys.num_chunks == 0:
            return np.zeros(0, dtype=np.uint32)
        return np.concatenate([murmur2(chunk) for chunk in keys.chunks])
    if not isinstance(keys, _BINARY_LIKE):
        if not (pa.types.is_binary_view(keys.type) or pa.types.is_string_view(keys.type)):
            raise TypeError(f"murmur2 hashes binary or string keys, not {keys.type}")
        keys = keys.cast(pa.large_binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    _, offsets_buf, data_buf = keys.buffers()
    large = isinstance(keys, pa.LargeBinaryArray | pa.LargeStringArray)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[keys.offset : keys.offset + n + 1].astype(np.int64)
    # only the bytes this array spans (a slice's are part of its parent's buffer)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8)[lo:hi] if hi > lo else _NO_BYTES
    starts = offsets[:-1] - lo
    lengths = offsets[1:] - offsets[:-1]

    h = lengths.astype(np.uint32)
    h ^= np.uint32(MURMUR2_SEED)
    nwords = lengths >> 2
    max_words = int(nwords.max())
    if max_words:
        # the little-endian 4-byte word starting at each byte (unaligned: indexing reads it,
        # np.take would copy the whole view first)
        words = np.ndarray(shape=(len(data) - 3,), dtype="<u4", buffer=data, strides=(1,))
        if (nwords == max_words).all():
            order, hs = None, h
            active = [n] * max_words
            pos = (np.arange(0, 4 * max_words, 4)[:, None] + starts).ravel()
        else:
            # longest first; a stable sort of 16-bit integers is numpy's radix sort
            shortfall = max_words - nwords
            if max_words < 1 << 16:
                shortfall = shortfall.astype(np.uint16)
            order = np.argsort(shortfall, kind="stable")
            hs, ordered_starts = h[order], starts[order]
            # the number of rows with more than w words, for each w
            active = np.searchsorted(-nwords[order], -np.arange(max_words), "left").tolist()
            pos = np.empty(sum(active), dtype=np.int64)
            end = 0
            for w, c in enumerate(active):
                np.add(ordered_starts[:c], 4 * w, out=pos[end : end + c])
                end += c
        # word w of each row that has it, word by word
        k = words[pos]
        k *= _M
        k ^= k >> _R
        k *= _M
        end = 0
        for c in active:
            hw = hs[:c]
            hw *= _M
            hw ^= k[end : end + c]
            end += c
        if order is not None:
            h[order] = hs

    # the last 1-3 bytes of each row, then the final mixes
    rem = lengths & 3
    if rem.any():
        tail = starts + (lengths & ~3)
        last = len(data) - 1
        tail_bytes = data[np.minimum(tail, last)].astype(np.uint32)
        tail_bytes |= data[np.minimum(tail + 1, last)].astype(np.uint32) << np.uint32(8)
        tail_bytes |= data[np.minimum(tail + 2, last)].astype(np.uint32) << np.uint32(16)
        # keep the rem bytes: 0xff, 0xffff or 0xffffff
        tail_bytes &= (np.uint32(1) << (rem.astype(np.uint32) << np.uint32(3))) - np.uint32(1)
        h ^= tail_bytes
        h = np.where(rem > 0, h * _M, h)
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


@dataclass(frozen=True)
class StickyPosition:
    """Where the sticky run of key-less rows stands between two Arrow batches: the partition
    it writes to and the value bytes already sent to it in this run (below ``sticky_bytes``)."""

    partition: int
    bytes: int = 0


class Partitioned(NamedTuple):
    """:func:`partitions_for`'s answer: each row's partition and the sticky position the next
    batch of the same write continues from."""

    partitions: np.ndarray
    next_sticky: StickyPosition


def partitions_for(
    keys: pa.Array | pa.ChunkedArray | None,
    explicit: pa.Array | pa.ChunkedArray | None,
    n_partitions: int,
    value_sizes: np.ndarray,
    sticky_bytes: int,
    first_sticky: int | StickyPosition,
) -> Partitioned:
    """Each row's partition (int32), chosen as Kafka's Java producer with its built-in
    partitioner chooses it (Spark's Kafka sink), and the sticky position to pass as
    ``first_sticky`` for the next batch of the same write.

    Per row, the first rule that applies:

    1. ``explicit`` (the ``partition`` column, int32) is not null: that value, unchecked
       (checking it against the topic's partitions is the caller's);
    2. the key is not null: ``(murmur2(key) & 0x7fffffff) % n_partitions`` (Kafka's
       ``Utils.toPositive``), so the same key always lands on the same partition;
    3. otherwise the row is sticky (KIP-794, without Kafka's random choice of the next
       partition). Taken in order, the sticky rows form runs: a run starts at the partition
       and byte count of ``first_sticky`` (an int means that partition, no bytes yet; the
       partition is taken modulo ``n_partitions``), each row adds its ``value_sizes`` entry to
       the run's bytes, and the row that brings them to ``sticky_bytes`` or more is the run's
       last (as Kafka switches once ``producedBytes >= batch.size``, the record that crosses
       staying where it went); the next run goes to the next partition,
       ``(partition + 1) % n_partitions``, from 0 bytes. Keyed and explicit rows in between
       neither end nor count toward a run (Kafka counts only records it placed itself).

    The returned position is the run the next sticky row would join: the last run's partition
    and bytes while it is below ``sticky_bytes``, else the next partition at 0 bytes (the
    position given, its partition modulo ``n_partitions``, when the batch has no sticky row).
    Passing it to the next call makes a write's batches behave as one batch.

    The runs are found with one ``np.searchsorted`` each over the sticky rows' running byte
    count, so the Python work is a step per run, that is per ``sticky_bytes`` of values (a
    row per step only where each row alone reaches ``sticky_bytes``).

    ``keys`` None means every key is null, ``explicit`` None every partition null.
    ``value_sizes`` (int64 per row) may be each record's encoded size instead of its value's
    for Kafka's exact count (Kafka counts the bytes the record took in its batch).
    """
    if n_partitions < 1:
        raise ValueError(f"n_partitions must be at least 1, not {n_partitions}")
    if sticky_bytes < 1:
        raise ValueError(f"sticky_bytes must be at least 1, not {sticky_bytes}")
    start = (
        first_sticky if isinstance(first_sticky, StickyPosition) else StickyPosition(first_sticky)
    )
    if not 0 <= start.bytes < sticky_bytes:
        raise ValueError(f"a sticky run holds 0 to {sticky_bytes - 1} bytes, not {start.bytes}")
    n = len(value_sizes)
    for name, column in (("keys", keys), ("explicit", explicit)):
        if column is not None and len(column) != n:
            raise ValueError(f"{name} has {len(column)} rows, value_sizes {n}")

    partitions = np.empty(n, dtype=np.int32)
    unset = np.ones(n, dtype=bool)
    if explicit is not None and explicit.null_count < len(explicit):
        if isinstance(explicit, pa.ChunkedArray):
            explicit = explicit.combine_chunks()
        given = explicit.is_valid().to_numpy(zero_copy_only=False)
        partitions[given] = explicit.fill_null(0).to_numpy()[given]
        unset &= ~given
    if keys is not None and keys.null_count < len(keys):
        keyed = unset & keys.is_valid().to_numpy(zero_copy_only=False)
        if keyed.any():
            hashes = murmur2(keys)[keyed] & np.uint32(0x7FFFFFFF)
            partitions[keyed] = (hashes % np.uint32(n_partitions)).astype(np.int32)
            unset &= ~keyed

    sticky_rows = np.flatnonzero(unset)
    partition = start.partition % n_partitions
    if len(sticky_rows) == 0:
        return Partitioned(partitions, StickyPosition(partition, start.bytes))
    sizes = np.asarray(value_sizes, dtype=np.int64)[sticky_rows]
    # bytes of the run so far, as if the carried bytes were a row before the first
    ends = np.cumsum(sizes) + start.bytes
    runs = np.empty(len(sizes), dtype=np.int32)
    first, base, run = 0, 0, 0
    while first < len(sizes):
        # the row that brings this run to sticky_bytes ends it (or the batch does)
        last = int(np.searchsorted(ends, base + sticky_bytes, "left"))
        if last >= len(sizes):
            runs[first:] = run
            next_sticky = StickyPosition((partition + run) % n_partitions, int(ends[-1] - base))
            break
        runs[first : last + 1] = run
        first, base, run = last + 1, int(ends[last]), run + 1
    else:
        next_sticky = StickyPosition((partition + run) % n_partitions, 0)
    partitions[sticky_rows] = (partition + runs.astype(np.int64)) % n_partitions
    return Partitioned(partitions, next_sticky)
