"""The journal entry codec: round trip, torn tails and corruption detection."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.record_batch import crc32c_combine
from stonemq.storage.journal import (
    ENTRY_HEADER_SIZE,
    ENTRY_PREFIX_COVERED_BYTES,
    CorruptEntryError,
    decode_entries,
    encode_entry,
    encode_entry_prefix,
    encode_log_start_entry,
)

entry_fields = st.tuples(
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(1, 2**31 - 1),
    st.binary(max_size=300),
)


@given(st.lists(entry_fields, min_size=1, max_size=5))
def test_round_trip(fields: list[tuple[bytes, int, int, int, bytes]]) -> None:
    buf = b"".join(encode_entry(*f) for f in fields)
    entries, used = decode_entries(memoryview(buf), 1000)
    assert used == len(buf)
    pos = 1000
    for entry, (tid, partition, base, count, batch) in zip(entries, fields, strict=True):
        assert (entry.topic_id, entry.partition, entry.base_offset) == (tid, partition, base)
        assert entry.record_count == count
        assert bytes(entry.batch) == batch
        assert entry.position == pos
        assert entry.size == ENTRY_HEADER_SIZE + len(batch)
        pos = entry.end


@given(entry_fields, st.data())
def test_torn_tail_is_not_an_entry(fields: tuple, data: st.DataObject) -> None:
    buf = encode_entry(*fields)
    cut = data.draw(st.integers(0, len(buf) - 1))
    entries, used = decode_entries(memoryview(buf[:cut]), 0)
    assert entries == [] and used == 0


@given(entry_fields, st.data())
def test_any_flipped_byte_is_detected(fields: tuple, data: st.DataObject) -> None:
    buf = bytearray(encode_entry(*fields))
    i = data.draw(st.integers(0, len(buf) - 1))
    buf[i] ^= data.draw(st.integers(1, 255))
    try:
        entries, _ = decode_entries(memoryview(buf), 0)
    except CorruptEntryError:
        return
    assert entries == []  # a damaged length field makes it look torn, never valid


def test_garbage_raises() -> None:
    with pytest.raises(CorruptEntryError):
        decode_entries(memoryview(b"\x00\x00\x00\x30" + b"\xab" * 100), 0)


@given(
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(1, 2**31 - 1),
    st.binary(min_size=21, max_size=300),
    st.integers(-1, 2**31 - 1),
)
def test_prefix_and_unchanged_batch_make_the_patched_entry(
    topic_id: bytes, partition: int, base: int, count: int, batch: bytes, epoch: int
) -> None:
    """What the produce path writes (a prefix, then the batch as received after its first 21
    bytes: head, magic, CRC field) is byte for byte the entry of the batch with its base
    offset and partition leader epoch patched in (the batch length between them unchanged)."""
    written = encode_entry_prefix(topic_id, partition, base, count, batch, epoch) + batch[21:]
    patched = (
        base.to_bytes(8, "big", signed=True)
        + batch[8:12]
        + epoch.to_bytes(4, "big", signed=True)
        + batch[16:]
    )
    assert written == encode_entry(topic_id, partition, base, count, patched)
    (entry,), used = decode_entries(memoryview(written), 0, verify=True)
    assert used == len(written) and bytes(entry.batch) == patched


@given(
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(1, 2**31 - 1),
    st.binary(min_size=21, max_size=3000),
    st.integers(-1, 2**31 - 1),
)
def test_a_checked_batch_gets_the_same_entry_with_its_crc_derived(
    topic_id: bytes, partition: int, base: int, count: int, raw: bytes, epoch: int
) -> None:
    """For a batch whose CRC field matches its bytes (what the produce validator checked),
    the entry whose CRC is derived from the batch's is byte for byte the one computed over
    the bytes, and it decodes with its CRC verified."""
    batch = raw[:17] + crc32c(raw[21:]).to_bytes(4, "big") + raw[21:]
    assert crc32c_combine is not None  # the C module is built (tests/unit/test_record_batch.py)
    checked = encode_entry_prefix(topic_id, partition, base, count, batch, epoch, True)
    written = checked + batch[ENTRY_PREFIX_COVERED_BYTES:]
    assert (
        written
        == encode_entry_prefix(topic_id, partition, base, count, batch, epoch)
        + batch[ENTRY_PREFIX_COVERED_BYTES:]
    )
    (entry,), used = decode_entries(memoryview(written), 0, verify=True)
    assert used == len(written) and bytes(entry.batch[ENTRY_PREFIX_COVERED_BYTES:]) == batch[21:]


def test_a_batch_whose_crc_field_lies_gets_an_entry_that_fails_its_check() -> None:
    """The derived CRC vouches only for a checked batch: one whose CRC field does not match
    its bytes makes an entry that the journal's own check refuses (never silently valid)."""
    raw = bytes(range(200))
    assert crc32c_combine is not None
    checked = encode_entry_prefix(b"t" * 16, 0, 5, 1, raw, 0, True)
    with pytest.raises(CorruptEntryError):
        decode_entries(memoryview(checked + raw[ENTRY_PREFIX_COVERED_BYTES:]), 0, verify=True)


@given(
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**31 - 1),
)
def test_a_log_start_entry_round_trips_beside_batches(
    topic_id: bytes, partition: int, offset: int, epoch: int
) -> None:
    batch = encode_entry(topic_id, partition, 0, 1, b"b" * 70)
    buf = batch + encode_log_start_entry(topic_id, partition, offset, epoch) + batch
    entries, used = decode_entries(memoryview(buf), 0)
    assert used == len(buf)
    assert [e.is_log_start for e in entries] == [False, True, False]
    mark = entries[1]
    assert (mark.topic_id, mark.partition, mark.base_offset) == (topic_id, partition, offset)
    # laid out as a batch head, so a follower reads the leader epoch where a batch has it
    assert struct.unpack_from(">qii", mark.batch) == (offset, 0, epoch)


@pytest.mark.parametrize(("count", "body"), [(-2, 16), (-1, 15), (-1, 17), (-1, 0), (-(2**31), 16)])
def test_a_negative_record_count_other_than_a_log_start_entry_is_corrupt(
    count: int, body: int
) -> None:
    """Record count -1 is a log-start entry, with its 16 bytes; any other negative count, or
    another length, is garbage even under a valid CRC (never applied as a log start)."""
    good = encode_entry(b"t" * 16, 0, 0, 1, b"x" * 70)
    bad = encode_entry(b"t" * 16, 0, 5, count, b"\0" * body)
    with pytest.raises(CorruptEntryError, match="record count"):
        decode_entries(memoryview(bad), 0, verify=False)
    entries, used = decode_entries(memoryview(good + bad), 0)
    assert len(entries) == 1 and used == len(good)  # the good one before it is kept
