"""The Spark sink's partitioner: murmur2 over Arrow columns equals Kafka's ``Utils.murmur2``
(Kafka's own vectors and kafka-python's port), and each row's partition follows Kafka's
built-in partitioner's rules: explicit partition, key hash, sticky runs of key-less rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from stonemq.spark.partitioner import Partitioned, StickyPosition, murmur2, partitions_for

# Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/apache/kafka/common/utils)
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

BINARY_TYPES = [pa.binary(), pa.large_binary(), pa.binary_view()]
STRING_TYPES = [pa.string(), pa.large_string(), pa.string_view()]

keys_lists = st.lists(st.one_of(st.none(), st.binary(max_size=300)), max_size=40)


def expected_hashes(keys: list[bytes | None]) -> list[int | None]:
    return [None if k is None else kafka_python_murmur2(k) for k in keys]


def hashes_of_valid_rows(got: np.ndarray, keys: list) -> list[int | None]:
    return [None if k is None else int(h) for h, k in zip(got, keys, strict=True)]


def test_murmur2_gives_kafkas_own_test_vectors() -> None:
    keys = pa.array(list(KAFKA_VECTORS), pa.binary())
    got = murmur2(keys)
    assert got.dtype == np.uint32
    assert got.view(np.int32).tolist() == list(KAFKA_VECTORS.values())


def test_murmur2_of_kafka_vectors_inside_longer_and_shorter_keys() -> None:
    """The vectors among keys of other word counts, so the rows are reordered by length."""
    vectors = list(KAFKA_VECTORS.items())
    keys = [b"x" * 1000, b""] + [k for k, _ in vectors] + [None, b"y" * 7]
    got = murmur2(pa.array(keys, pa.binary())).view(np.int32)
    assert got[2 : 2 + len(vectors)].tolist() == [v for _, v in vectors]
    assert got[0] == np.uint32(kafka_python_murmur2(b"x" * 1000)).view(np.int32)


def test_kafka_python_murmur2_is_javas() -> None:
    """kafka-python's port, the reference of the property tests, agrees with Kafka's vectors."""
    for key, java in KAFKA_VECTORS.items():
        assert np.uint32(kafka_python_murmur2(key)).view(np.int32) == java


@settings(max_examples=200, deadline=None)
@given(keys=keys_lists, arrow_type=st.sampled_from(BINARY_TYPES), data=st.data())
def test_murmur2_equals_kafka_python_for_binary_keys_and_slices(
    keys: list[bytes | None], arrow_type: pa.DataType, data: st.DataObject
) -> None:
    array = pa.array(keys, arrow_type)
    assert hashes_of_valid_rows(murmur2(array), keys) == expected_hashes(keys)
    start = data.draw(st.integers(0, len(keys)))
    stop = data.draw(st.integers(start, len(keys)))
    part = keys[start:stop]
    sliced = array.slice(start, stop - start)
    assert hashes_of_valid_rows(murmur2(sliced), part) == expected_hashes(part)


@settings(max_examples=100, deadline=None)
@given(
    texts=st.lists(st.one_of(st.none(), st.text(max_size=80)), max_size=30),
    arrow_type=st.sampled_from(STRING_TYPES),
    start=st.integers(0, 5),
)
def test_murmur2_of_strings_hashes_their_utf8_bytes(
    texts: list[str | None], arrow_type: pa.DataType, start: int
) -> None:
    keys = [None if t is None else t.encode() for t in texts]
    array = pa.array(texts, arrow_type).slice(min(start, len(texts)))
    part = keys[min(start, len(keys)) :]
    assert hashes_of_valid_rows(murmur2(array), part) == expected_hashes(part)


@settings(max_examples=50, deadline=None)
@given(chunks=st.lists(keys_lists, max_size=4))
def test_murmur2_of_a_chunked_array_is_its_chunks_in_order(
    chunks: list[list[bytes | None]],
) -> None:
    array = pa.chunked_array([pa.array(c, pa.binary()) for c in chunks], pa.binary())
    keys = [k for c in chunks for k in c]
    assert hashes_of_valid_rows(murmur2(array), keys) == expected_hashes(keys)


def test_murmur2_of_empty_and_all_null_arrays() -> None:
    assert murmur2(pa.array([], pa.binary())).tolist() == []
    assert len(murmur2(pa.array([None, None], pa.binary()))) == 2
    assert murmur2(pa.array([b"", b""], pa.binary())).tolist() == [kafka_python_murmur2(b"")] * 2


def test_murmur2_refuses_keys_that_are_not_bytes() -> None:
    with pytest.raises(TypeError):
        murmur2(pa.array([1, 2], pa.int32()))


# partitions_for


def sticky_reference(
    sizes: list[int], n_partitions: int, sticky_bytes: int, start: StickyPosition
) -> tuple[list[int], StickyPosition]:
    """The documented rule for key-less rows, a row at a time."""
    partition, filled, out = start.partition % n_partitions, start.bytes, []
    for size in sizes:
        out.append(partition)
        filled += size
        if filled >= sticky_bytes:
            partition, filled = (partition + 1) % n_partitions, 0
    return out, StickyPosition(partition, filled)


def test_explicit_partition_wins_over_key_and_stickiness() -> None:
    keys = pa.array([b"foobar", None, b"foobar", None], pa.binary())
    explicit = pa.array([7, 5, None, None], pa.int32())
    got = partitions_for(keys, explicit, 10, np.full(4, 100, np.int64), 1000, 3)
    # toPositive(-790332482) % 10 == 1357151166 % 10 == 6
    assert got.partitions.dtype == np.int32
    assert got.partitions.tolist() == [7, 5, 6, 3]


def test_keyed_rows_take_the_positive_hash_modulo_the_partitions() -> None:
    keys = list(KAFKA_VECTORS)
    for n in (1, 3, 12, 1000):
        got = partitions_for(pa.array(keys, pa.binary()), None, n, np.zeros(6, np.int64), 1, 0)
        assert got.partitions.tolist() == [(v & 0x7FFFFFFF) % n for v in KAFKA_VECTORS.values()]
        assert got.next_sticky == StickyPosition(0, 0)


def test_key_less_rows_go_in_runs_of_sticky_bytes_round_robin() -> None:
    got = partitions_for(None, None, 4, np.full(10, 10, np.int64), 25, 2)
    # the row reaching 25 bytes ends its run: rows 0-2, 3-5, 6-8, then row 9 with 10 bytes
    assert got.partitions.tolist() == [2, 2, 2, 3, 3, 3, 0, 0, 0, 1]
    assert got.next_sticky == StickyPosition(1, 10)


def test_a_row_larger_than_sticky_bytes_is_a_run_of_its_own() -> None:
    sizes = np.array([5, 100, 1, 30, 20], np.int64)
    got = partitions_for(None, None, 3, sizes, 20, 0)
    assert got.partitions.tolist() == [0, 0, 1, 1, 2]
    assert got.next_sticky == StickyPosition(0, 0)


def test_keyed_and_explicit_rows_neither_count_toward_nor_end_a_run() -> None:
    keys = pa.array([None, b"k", None, b"k", None], pa.binary())
    explicit = pa.array([None, None, None, 9, None], pa.int32())
    sizes = np.array([10, 1000, 10, 1000, 10], np.int64)
    got = partitions_for(keys, explicit, 5, sizes, 30, 1)
    keyed = (kafka_python_murmur2(b"k") & 0x7FFFFFFF) % 5
    assert got.partitions.tolist() == [1, keyed, 1, 9, 1]
    assert got.next_sticky == StickyPosition(2, 0)


def test_one_partition_puts_every_row_on_it() -> None:
    keys = pa.array([b"a", None, b"bcdef", None], pa.binary())
    got = partitions_for(keys, None, 1, np.full(4, 50, np.int64), 10, StickyPosition(0, 5))
    assert got.partitions.tolist() == [0, 0, 0, 0]
    assert got.next_sticky == StickyPosition(0, 0)


def test_no_sticky_row_keeps_the_position() -> None:
    keys = pa.array([b"a"], pa.binary())
    got = partitions_for(keys, None, 4, np.array([10], np.int64), 100, StickyPosition(6, 40))
    assert got.next_sticky == StickyPosition(2, 40)


def test_bad_arguments_are_refused() -> None:
    sizes = np.zeros(2, np.int64)
    with pytest.raises(ValueError):
        partitions_for(None, None, 0, sizes, 10, 0)
    with pytest.raises(ValueError):
        partitions_for(None, None, 2, sizes, 0, 0)
    with pytest.raises(ValueError):
        partitions_for(None, None, 2, sizes, 10, StickyPosition(0, 10))
    with pytest.raises(ValueError):
        partitions_for(pa.array([b"a"], pa.binary()), None, 2, sizes, 10, 0)


rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=40)),  # key
        st.one_of(st.none(), st.integers(0, 50)),  # explicit partition
        st.integers(0, 300),  # value size
    ),
    max_size=60,
)


def reference(
    batch: list[tuple[bytes | None, int | None, int]],
    n_partitions: int,
    sticky_bytes: int,
    start: StickyPosition,
) -> tuple[list[int], StickyPosition]:
    sticky = [size for key, part, size in batch if key is None and part is None]
    runs, position = sticky_reference(sticky, n_partitions, sticky_bytes, start)
    out, taken = [], iter(runs)
    for key, part, _ in batch:
        if part is not None:
            out.append(part)
        elif key is not None:
            out.append((kafka_python_murmur2(key) & 0x7FFFFFFF) % n_partitions)
        else:
            out.append(next(taken))
    return out, position


def call(
    batch: list[tuple[bytes | None, int | None, int]],
    n_partitions: int,
    sticky_bytes: int,
    start: int | StickyPosition,
) -> Partitioned:
    keys = pa.array([r[0] for r in batch], pa.binary())
    explicit = pa.array([r[1] for r in batch], pa.int32())
    sizes = np.array([r[2] for r in batch], np.int64)
    return partitions_for(keys, explicit, n_partitions, sizes, sticky_bytes, start)


@settings(max_examples=200, deadline=None)
@given(
    batch=rows,
    n_partitions=st.integers(1, 8),
    sticky_bytes=st.integers(1, 700),
    first=st.integers(0, 20),
    filled=st.integers(0, 699),
)
def test_partitions_follow_the_documented_rules(
    batch: list[tuple[bytes | None, int | None, int]],
    n_partitions: int,
    sticky_bytes: int,
    first: int,
    filled: int,
) -> None:
    start = StickyPosition(first, filled % sticky_bytes)
    got = call(batch, n_partitions, sticky_bytes, start)
    want, position = reference(batch, n_partitions, sticky_bytes, start)
    assert got.partitions.tolist() == want
    assert got.next_sticky == position


@settings(max_examples=200, deadline=None)
@given(
    batch=rows,
    n_partitions=st.integers(1, 8),
    sticky_bytes=st.integers(1, 700),
    first=st.integers(0, 7),
    data=st.data(),
)
def test_batches_continued_from_next_sticky_partition_as_one_batch(
    batch: list[tuple[bytes | None, int | None, int]],
    n_partitions: int,
    sticky_bytes: int,
    first: int,
    data: st.DataObject,
) -> None:
    whole = call(batch, n_partitions, sticky_bytes, first)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(batch)), max_size=4)))
    position: int | StickyPosition = first
    parts = []
    for lo, hi in zip([0, *cuts], [*cuts, len(batch)], strict=True):
        got = call(batch[lo:hi], n_partitions, sticky_bytes, position)
        parts.extend(got.partitions.tolist())
        position = got.next_sticky
    assert parts == whole.partitions.tolist()
    assert position == whole.next_sticky
