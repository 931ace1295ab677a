"""The manifest and the job's commit protocol: exactly once by offset range, whatever was
killed and rerun (driven in-process: the job's own reader/writer/commit, no JVM)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tier_helpers import archive_in_process, data_segments, expected_records, write_segments

from stonemq.tiering import archive_job
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import AlreadyExistsError, StoreSpec


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    return StoreSpec((tmp_path / "tier").as_uri()).open()


def _archived_offsets(store, topic: str, partition: int) -> list[int]:  # type: ignore[no-untyped-def]
    current = mf.load(store, topic, partition)
    offsets: list[int] = []
    for f in current.files:
        if f.key:
            offsets += pq.read_table(store.path(f.key)).column("offset").to_pylist()
    return offsets


def test_merge_drops_ranges_already_covered() -> None:
    m = mf.Manifest("t", 0, files=(mf.ArchivedFile(0, 9, "a", 10, 1),))
    new = [mf.ArchivedFile(0, 9, "a", 10, 1), mf.ArchivedFile(10, 19, "b", 10, 1)]
    merged, dropped = mf.merge(m, new)
    assert [(f.first, f.last) for f in merged.files] == [(0, 9), (10, 19)]
    assert [(f.first, f.last) for f in dropped] == [(0, 9)]
    assert merged.next_offset == 20


def test_plan_ranges_covers_each_offset_once_even_with_overlapping_segments() -> None:
    segs = [
        mf.SegmentRef("s/0-99", 0, 99),
        mf.SegmentRef("s/0-149", 0, 149),  # re-sealed longer after a crash
        mf.SegmentRef("s/150-199", 150, 199),
    ]
    tasks = mf.plan_ranges("t", 0, 50, segs)
    assert [(t.segment_key, t.first, t.last) for t in tasks] == [
        ("s/0-99", 50, 99),
        ("s/0-149", 100, 149),
        ("s/150-199", 150, 199),
    ]


def test_commit_is_exclusive_per_version(store) -> None:  # type: ignore[no-untyped-def]
    base = mf.load(store, "t", 0)
    mf.commit(store, mf.merge(base, [mf.ArchivedFile(0, 4, None, 0, 0)])[0])
    with pytest.raises(mf.ConcurrentCommitError):
        mf.commit(store, mf.merge(base, [mf.ArchivedFile(0, 9, None, 0, 0)])[0])
    assert mf.load(store, "t", 0).next_offset == 5
    with pytest.raises(AlreadyExistsError):
        store.create_exclusive("x/1", b"a") or store.create_exclusive("x/1", b"b")


def test_racing_commits_leave_one_winner(store) -> None:  # type: ignore[no-untyped-def]
    wins: list[int] = []

    def attempt(last: int) -> None:
        try:
            base = mf.load(store, "t", 0)
            mf.commit(store, mf.merge(base, [mf.ArchivedFile(0, last, None, 0, 0)])[0])
            wins.append(last)
        except mf.ConcurrentCommitError:
            pass

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(5, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    current = mf.load(store, "t", 0)
    assert len(current.files) == 1 and current.files[0].last in wins


def test_full_run_archives_sealed_segments_only(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    segments = data_segments(4, 3, 7)
    write_segments(tmp_path / "queues", "t", 0, segments)
    archive_in_process(store, "t", 0, tmp_path / "queues")
    sealed = expected_records(segments[:3])
    assert _archived_offsets(store, "t", 0) == sorted(sealed)
    current = mf.load(store, "t", 0)
    assert current.next_offset == 3 * (3 * 7 + 1)  # through the last sealed control batch
    assert store.list(mf.segments_dir("t", 0)) == []  # uploaded copies gone once archived
    assert store.list(mf.staging_dir("t", 0)) == []
    archive_in_process(store, "t", 0, tmp_path / "queues")  # idempotent
    assert mf.load(store, "t", 0).version == current.version


@pytest.mark.parametrize("crash_after_moves", [0, 1, 2])
def test_killed_between_files_and_manifest_then_rerun_is_exactly_once(
    store, tmp_path: Path, crash_after_moves: int, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    segments = data_segments(4, 2, 5)
    write_segments(tmp_path / "queues", "t", 0, segments)
    staged = archive_in_process(store, "t", 0, tmp_path / "queues", commit=False)
    # the commit dies after moving some files to their final keys, before the manifest
    for s in staged[:crash_after_moves]:
        store.move(s.staging_key, mf.parquet_key("t", 0, s.first, s.last))
    assert mf.load(store, "t", 0).files == ()
    archive_in_process(store, "t", 0, tmp_path / "queues")  # the rerun
    offsets = _archived_offsets(store, "t", 0)
    assert offsets == sorted(expected_records(segments[:3]))
    listed = {f.key for f in mf.load(store, "t", 0).files}
    on_disk = set(store.list(mf.partition_dir("t", 0)))
    assert on_disk == listed  # no stray file for spark.read.parquet to double count


def test_rerun_after_a_committed_partial_run(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    segments = data_segments(5, 2, 4)
    q = tmp_path / "queues"
    write_segments(q, "t", 0, segments[:3])  # two sealed, one active
    archive_in_process(store, "t", 0, q)
    write_segments(q, "t", 0, segments[3:])  # more sealed later
    staged = archive_in_process(store, "t", 0, q, commit=False)  # killed before commit
    assert staged and store.list(archive_job.mf.staging_dir("t", 0))
    archive_in_process(store, "t", 0, q)
    assert _archived_offsets(store, "t", 0) == sorted(expected_records(segments[:4]))


def test_a_segment_decoded_only_in_part_is_archived_only_that_far(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A batch the archive's validator refuses (here: above the stored limit, as a broker
    with a higher batch.max.uncompressed.bytes than tier run's accepts) ends its segment's
    rows: the manifest covers only the offsets before it, no later segment of the partition
    is committed in that run, and the run fails naming where it stopped. It committed the
    whole range: offsets after the batch were lost once local retention deleted the segment
    (audit36 p6). With the limits fixed, the next run archives the rest exactly once."""
    from stonemq.protocol import record_batch

    segments = data_segments(4, 4, 5)  # batches of 5 records; 21 offsets a segment
    write_segments(tmp_path / "queues", "t", 0, segments)
    expected = expected_records(segments[:3])
    big = next(b for seg in segments for b in seg if b[22] & 7)  # the first compressed one
    base = int.from_bytes(big[:8], "big")
    assert base > 0
    monkeypatch.setattr(record_batch, "_stored_limit", 64)  # smaller than its records
    with pytest.raises(archive_job.ArchiveIncomplete, match=f"t-0 at offset {base}"):
        archive_in_process(store, "t", 0, tmp_path / "queues")
    current = mf.load(store, "t", 0)
    assert current.next_offset == base
    assert _archived_offsets(store, "t", 0) == sorted(o for o in expected if o < base)
    monkeypatch.setattr(record_batch, "_stored_limit", record_batch.MAX_UNCOMPRESSED_BYTES)
    archive_in_process(store, "t", 0, tmp_path / "queues")
    assert _archived_offsets(store, "t", 0) == sorted(expected)


def test_truncate_before_moves_the_cold_log_start() -> None:
    m = mf.Manifest(
        "t", 0, files=(mf.ArchivedFile(0, 9, "a", 10, 1), mf.ArchivedFile(10, 19, "b", 10, 1))
    )
    out, gone = mf.truncate_before(m, 12)
    assert [f.key for f in gone] == ["a"]
    assert out.start_offset == 12 and out.next_offset == 20


def test_the_archive_table_leaves_out_offsets_below_the_log_start(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``read_archive``'s reader (no Spark needed for its partitions and reads): a log start
    that DeleteRecords or cold retention moved inside a file hides the offsets below it,
    as from a Kafka consumer; they were read (audit36 p5)."""
    import json
    from dataclasses import asdict

    segments = data_segments(4, 3, 7)
    write_segments(tmp_path / "queues", "t", 0, segments)
    archive_in_process(store, "t", 0, tmp_path / "queues")
    current = mf.load(store, "t", 0)
    inside = current.files[0].first + 5  # inside the first file, which stays
    moved, gone = mf.truncate_before(current, inside)
    assert not gone
    mf.commit(store, moved)
    reader = archive_job._ArchiveReader({"store": json.dumps(asdict(store.spec))})
    offsets = sorted(
        o
        for part in reader.partitions()
        for batch in reader.read(part)
        for o in batch.column("offset").to_pylist()
    )
    assert offsets == [o for o in sorted(expected_records(segments[:3])) if o >= inside]
