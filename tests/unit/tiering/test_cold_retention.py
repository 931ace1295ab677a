"""Cold retention, topic deletion, topic ids, timestamp search and the uploader's fsync, on a
real file:// cold store with real segments (the archive job's reader/writer/commit run in
process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tier_helpers import archive_in_process, data_segments, write_segments

from stonemq.tiering import manifest as mf
from stonemq.tiering import status, uploader
from stonemq.tiering.cold_reader import ColdReader
from stonemq.tiering.cold_store import ColdStore, StoreSpec

TS0 = 1_700_000_000_000  # record i has timestamp TS0 + i (tier_helpers.record)
PER_SEGMENT = 3 * 7 + 1  # three batches of 7 records and a control batch


@pytest.fixture
def store(tmp_path: Path) -> ColdStore:
    return StoreSpec((tmp_path / "tier").as_uri()).open()


@pytest.fixture
def archived(store: ColdStore, tmp_path: Path) -> mf.Manifest:
    write_segments(tmp_path / "queues", "t", 0, data_segments(5, 3, 7))  # 4 sealed
    archive_in_process(store, "t", 0, tmp_path / "queues")
    current = mf.load(store, "t", 0)
    assert len(current.files) == 4
    return current


def _topic(retention_ms: int = -1, retention_bytes: int = -1) -> status.TieredTopic:
    return status.TieredTopic("t", 1, retention_ms, retention_bytes)


def test_retention_ms_drops_whole_expired_files_manifest_first(
    store: ColdStore, archived: mf.Manifest
) -> None:
    # now - retention puts the cutoff inside the second file: only the first is wholly older
    now = TS0 + PER_SEGMENT + 5 + 1000
    done = status.apply_cold_retention(store, _topic(retention_ms=1000), 0, 0, now)
    assert done.files_deleted == 1
    current = mf.load(store, "t", 0)
    assert current.start_offset == PER_SEGMENT == done.log_start
    assert current.files == archived.files[1:]
    assert not store.exists(archived.files[0].key or "")
    assert all(store.exists(f.key or "") for f in current.files)
    # nothing more expires at the same time: no new manifest version
    again = status.apply_cold_retention(store, _topic(retention_ms=1000), 0, 0, now)
    assert again.files_deleted == 0 and mf.load(store, "t", 0).version == current.version


def test_retention_bytes_counts_cold_and_local_bytes(
    store: ColdStore, archived: mf.Manifest
) -> None:
    # the log bytes of each file's range, as Kafka counts a remote segment's size; counted
    # in Parquet bytes (several times smaller for message-like data) the log kept 6.7-7.4x
    # retention.bytes (audit36 p7)
    sizes = [len(b"".join(seg)) for seg in data_segments(5, 3, 7)[:4]]
    assert [f.log_bytes for f in archived.files] == sizes
    local = 1000
    # keep the newest two files plus the local bytes
    limit = sizes[2] + sizes[3] + local
    done = status.apply_cold_retention(store, _topic(retention_bytes=limit), 0, local, TS0)
    assert done.files_deleted == 2
    assert mf.load(store, "t", 0).start_offset == 2 * PER_SEGMENT


def test_a_crash_between_commit_and_deletes_leaves_strays_the_next_pass_removes(
    store: ColdStore, archived: mf.Manifest
) -> None:
    trimmed, gone = mf.truncate_before(archived, 2 * PER_SEGMENT)
    mf.commit(store, trimmed)  # ... and the process died before deleting ``gone``
    assert all(store.exists(f.key or "") for f in gone)
    done = status.apply_cold_retention(store, _topic(), 0, 0, TS0)
    assert done.strays_deleted == 2 and done.files_deleted == 0
    assert not any(store.exists(f.key or "") for f in gone)
    assert {f.key for f in mf.load(store, "t", 0).files} == set(
        store.list(mf.partition_dir("t", 0))
    )


def test_local_start_past_the_archive_moves_the_cold_start_so_it_is_never_archived(
    store: ColdStore, tmp_path: Path
) -> None:
    queues = tmp_path / "queues"
    write_segments(queues, "t", 0, data_segments(5, 3, 7))
    current = mf.load(store, "t", 0)
    uploader.upload_sealed(store, str(queues), "t", 0, current.next_offset)
    assert len(mf.list_segments(store, "t", 0)) == 4
    # retention.ms deleted the first two local segments before any archive run
    done = status.apply_cold_retention(store, _topic(), 0, 0, TS0, local_start=2 * PER_SEGMENT)
    assert done.segments_deleted == 2 and done.log_start == 2 * PER_SEGMENT
    archive_in_process(store, "t", 0, queues)
    after = mf.load(store, "t", 0)
    assert after.files[0].first == 2 * PER_SEGMENT
    assert after.next_offset == 4 * PER_SEGMENT


def test_a_manifest_of_another_topic_id_counts_as_empty(
    store: ColdStore, archived: mf.Manifest, tmp_path: Path
) -> None:
    tagged = mf.commit(store, mf.load(store, "t", 0, "old-id"))
    assert tagged.topic_id == "old-id" and tagged.files == archived.files
    assert mf.load(store, "t", 0, "old-id").files == archived.files
    fresh = mf.load(store, "t", 0, "new-id")
    assert fresh.files == () and fresh.version == tagged.version
    reader = ColdReader(store.spec, topic_id_of={"t": "new-id"}.get)
    assert reader.read("t", 0, 0, 1 << 20) == b""


def test_delete_topic_data_removes_everything_and_its_tombstone(
    store: ColdStore, archived: mf.Manifest, tmp_path: Path
) -> None:
    uploader.upload_sealed(store, str(tmp_path / "queues"), "t", 0, 0)
    store.put_atomic(f"{mf.staging_dir('t', 0)}/x.parquet", b"x")
    store.put_atomic(mf.tombstone_key("t"), b'{"topic": "t", "topic_id": "id"}')
    assert status.pending_deletes(store) == {"t": "id"}
    status.delete_topic_data(store, "t", "id")
    for prefix in mf.topic_dirs("t"):
        assert store.list(prefix) == [] and store.list_dirs(prefix) == [], prefix
    assert status.pending_deletes(store) == {}
    assert mf.load(store, "t", 0).files == ()


def test_offset_for_timestamp_reads_the_archive(store: ColdStore, archived: mf.Manifest) -> None:
    reader = ColdReader(store.spec)
    assert reader.offset_for_timestamp("t", 0, 0) == (0, TS0)
    assert reader.offset_for_timestamp("t", 0, TS0 + 30) == (30, TS0 + 30)
    # offset 21 is a control record: the next data record answers
    assert reader.offset_for_timestamp("t", 0, TS0 + 21) == (22, TS0 + 22)
    last = archived.next_offset - 2  # the last data record archived
    assert reader.offset_for_timestamp("t", 0, TS0 + last) == (last, TS0 + last)
    assert reader.offset_for_timestamp("t", 0, TS0 + last + 1) is None
    # only files starting below ``below`` are searched
    assert reader.offset_for_timestamp("t", 0, TS0 + 30, below=PER_SEGMENT) is None


def test_uploader_fsyncs_each_segment_before_uploading_it(
    store: ColdStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_segments(tmp_path / "queues", "t", 0, data_segments(3, 2, 5))
    events: list[tuple[str, str]] = []
    real_fsync, real_put = os.fsync, store.put_atomic

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def put_atomic(key: str, chunks):  # type: ignore[no-untyped-def]
        if key.startswith("segments/"):
            events.append(("put", key))
        return real_put(key, chunks)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(store, "put_atomic", put_atomic)
    report = uploader.upload_sealed(store, str(tmp_path / "queues"), "t", 0, 0)
    assert report.uploaded == 2
    order = [e for e in events if e[0] == "put" or e[1] in {str(p) for p in paths}]
    assert [e[0] for e in order] == ["fsync", "put", "fsync", "put"]
    assert order[0][1] == str(paths[0]) and order[2][1] == str(paths[1])
