"""A real full disk: the broker's data directory on a small tmpfs. Produces that cannot be
written get KAFKA_STORAGE_ERROR, the broker stays up and keeps serving fetches of everything
acknowledged, writes succeed again once space returns, and no corrupt entry is left behind
(``stonemq storage check`` passes and a restart serves the same data).

Needs root (or CAP_SYS_ADMIN) to mount the tmpfs; skipped with that reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .rawclient import RawConnection, build_batch, fetch_batches, produce_raw

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

KAFKA_STORAGE_ERROR = 56
FS_BYTES = 24 << 20


@pytest.fixture
def small_fs(tmp_path: Path):
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path: Path, leave_bytes: int) -> None:
    """Write a filler file until only about ``leave_bytes`` stay free."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    with path.open("wb") as f:
        chunk = b"\0" * (1 << 20)
        remaining = max(free - leave_bytes, 0)
        while remaining > 0:
            f.write(chunk[: min(len(chunk), remaining)])
            remaining -= len(chunk)


def storage_check(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "stonemq", "storage", "check", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_enospc_is_a_storage_error_and_the_broker_recovers(small_fs: Path, broker_factory) -> None:
    data_dir = small_fs / "data"
    broker = broker_factory(
        data_dir=data_dir,
        **{
            "journal.segment.bytes": 1 << 20,
            "log.segment.bytes": 256 * 1024,
            "journal.partitions": 1,
            "queue.checkpoint.interval.ms": 200,
        },
    )
    from .helpers import create_topic

    topic = create_topic(broker.bootstrap, partitions=2)
    filler = small_fs / "filler"
    fill(filler, leave_bytes=3 << 20)

    acked: dict[int, list[bytes]] = {0: [], 1: []}
    errors = 0
    with RawConnection(broker.host, broker.port) as conn:
        for i in range(400):
            p = i % 2
            batch = bytes(build_batch([(b"k%d" % i, os.urandom(60_000))]))
            part = produce_raw(conn, topic, p, batch)
            if part.error_code == 0:
                assert part.base_offset == len(acked[p]), "an offset was skipped or reused"
                acked[p].append(batch)
            else:
                assert part.error_code == KAFKA_STORAGE_ERROR, part.error_code
                errors += 1
                if errors >= 10:
                    break
    assert errors >= 10, "the disk never filled up"
    assert sum(map(len, acked.values())) > 5
    assert broker.alive
    assert "No space left on device" in broker.log()

    def stored_values(p: int, wait: bool = True) -> list[bytes]:
        batches = fetch_batches(broker, topic, p, 0, end=len(acked[p]) if wait else None)
        return [b[61:] for b in batches]  # record bytes of each one-record batch

    for p in (0, 1):  # fetches are served while the disk is full: what is split so far
        stored = stored_values(p, wait=False)
        assert stored == [b[61:] for b in acked[p]][: len(stored)]

    filler.unlink()  # space returns
    deadline = time.monotonic() + 20
    with RawConnection(broker.host, broker.port) as conn:
        while True:
            batch = bytes(build_batch([(b"after", b"space is back")]))
            part = produce_raw(conn, topic, 0, batch)
            if part.error_code == 0:
                assert part.base_offset == len(acked[0])
                acked[0].append(batch)
                break
            assert part.error_code == KAFKA_STORAGE_ERROR
            assert time.monotonic() < deadline, "writes not accepted after space returned"
            time.sleep(0.2)
        for p in (0, 1):
            batch = bytes(build_batch([(b"more", b"x" * 100)]))
            part = produce_raw(conn, topic, p, batch)
            assert part.error_code == 0 and part.base_offset == len(acked[p])
            acked[p].append(batch)
    for p in (0, 1):
        assert stored_values(p) == [b[61:] for b in acked[p]]

    broker.stop()
    check = storage_check(data_dir)
    assert check.returncode == 0, check.stdout + check.stderr
    broker.start()
    for p in (0, 1):
        assert stored_values(p) == [b[61:] for b in acked[p]]
