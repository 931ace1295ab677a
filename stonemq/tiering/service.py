"""The broker's side of tiering: uploading sealed segments as they seal, cold fetches per
``tier.read.policy``, the cold log start for Fetch and ListOffsets, the manifests' view for
local retention, and the optional archive run every ``tier.interval.ms`` as a separate
process (``stonemq tier run --once``).

Object-store and Parquet work runs in a small thread pool, never on the event loop; the event
loop only reads cached manifests (refreshed in the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stonemq.config import Settings
from stonemq.tiering.cold_store import StoreSpec

if TYPE_CHECKING:
    from stonemq.tiering.cold_reader import ColdReader
    from stonemq.tiering.manifest import Manifest

log = logging.getLogger("stonemq.tiering")

MANIFEST_REFRESH_S = 2.0
UPLOAD_INTERVAL_S = 1.0
COLD_READ_THREADS = 4


class TierService:
    """Owns the :class:`ColdReader` and the archive-run timer of one broker."""

    def __init__(self, settings: Settings, topics: Any) -> None:
        self.settings = settings
        self.topics = topics  # the TopicManager: effective configs
        self.policy = settings.tier_read_policy
        self.spec = StoreSpec.from_settings(settings)
        self._reader: ColdReader | None = None  # made on first use: pyarrow loads then
        self.executor = ThreadPoolExecutor(COLD_READ_THREADS, thread_name_prefix="stonemq-cold")
        self._tasks: list[asyncio.Task[None]] = []
        self._run_proc: asyncio.subprocess.Process | None = None
        self._uploaded: dict[tuple[str, int], int] = {}  # newest sealed base uploaded

    @property
    def reader(self) -> ColdReader:
        if self._reader is None:
            from stonemq.tiering.cold_reader import ColdReader

            self._reader = ColdReader(
                self.spec,
                read_ahead_max_bytes=self.settings.tier_read_ahead_max_bytes,
                cache_expire_ms=self.settings.tier_read_cache_expire_ms,
                manifest_ttl_s=MANIFEST_REFRESH_S / 2,
            )
        return self._reader

    def _cached(self, topic: str, partition: int) -> Manifest | None:
        return self._reader.cached_manifest(topic, partition) if self._reader else None

    # -- which topics ---------------------------------------------------------------------
    def tiered(self, topic: str) -> bool:
        try:
            return bool(self.topics.effective_config(topic).values.get("remote.storage.enable"))
        except Exception:  # unknown topic
            return False

    def _tiered_partitions(self) -> list[tuple[str, int]]:
        out = []
        for record in self.topics.store.list_topics():
            if self.tiered(record.name):
                out.extend((record.name, p) for p in range(record.partitions))
        return out

    # -- offsets --------------------------------------------------------------------------
    def log_start(self, topic: str, partition: int, local_start: int) -> int:
        """The log start a client sees: the cold start when archived data reaches below the
        local start (cached manifest, no I/O)."""
        if self.policy == "disable" or not self.tiered(topic):
            return local_start
        current = self._cached(topic, partition)
        if current is None or not current.files:
            return local_start
        return min(local_start, current.start_offset)

    def archived_next(self, topic: str, partition: int) -> int:
        """First offset not archived (cached manifest; 0 when none): local retention may
        delete only below it."""
        current = self._cached(topic, partition)
        return current.next_offset if current is not None else 0

    # -- local retention ------------------------------------------------------------------
    def local_cutoff(self, queue: Any, now_ms: int) -> int:
        """How far local retention (``local.retention.ms`` / ``local.retention.bytes``; -2
        means ``retention.*``) lets a tiered partition's local log start advance: Kafka's
        whole-segment rules, but never past a segment the manifest does not wholly cover.
        0 for a topic that does not tier. Called on the event loop by storage retention."""
        if not self.tiered(queue.topic) or len(queue.segments) < 2:
            return 0
        values = self.topics.effective_config(queue.topic).values
        local_ms = int(values["local.retention.ms"])
        local_bytes = int(values["local.retention.bytes"])
        if local_ms == -2:
            local_ms = int(values["retention.ms"])
        if local_bytes == -2:
            local_bytes = int(values["retention.bytes"])
        saved = queue.config
        queue.config = dataclasses.replace(
            saved, retention_ms=local_ms, retention_bytes=local_bytes
        )
        try:
            cutoff = int(queue.retention_cutoff(now_ms))
        finally:
            queue.config = saved
        archived = self.archived_next(queue.topic, queue.partition)
        bound = 0  # the end of the last local segment wholly archived
        for seg in queue.segments[1:]:
            if seg.base_offset > archived:
                break
            bound = seg.base_offset
        return min(cutoff, bound)

    # -- fetch ----------------------------------------------------------------------------
    async def cold_reads(
        self, request: Any, storage: Any, budget: int
    ) -> dict[tuple[str, int], tuple[bytes, int]]:
        """Cold data for the partitions of a Fetch that the read policy sends to the cold
        tier: ``{(topic, partition): (records, cold log start)}``."""
        if self.policy == "disable":
            return {}
        out: dict[tuple[str, int], tuple[bytes, int]] = {}
        loop = asyncio.get_running_loop()
        total = 0
        for fetch_topic in request.topics:
            name = fetch_topic.topic
            if not self.tiered(name):
                continue
            for fp in fetch_topic.partitions:
                try:
                    local_start = storage.log_start_offset(name, fp.partition)
                except Exception:
                    continue
                offset = fp.fetch_offset
                if self.policy == "not_in_local" and offset >= local_start:
                    continue
                current = await loop.run_in_executor(
                    self.executor, self.reader.manifest, name, fp.partition
                )
                if not current.files or offset >= current.next_offset:
                    continue
                if offset < current.start_offset:
                    out[(name, fp.partition)] = (b"", current.start_offset)
                    continue
                limit = max(min(fp.partition_max_bytes, budget - total), 1)
                data = await loop.run_in_executor(
                    self.executor, self.reader.read, name, fp.partition, offset, limit
                )
                if data:
                    out[(name, fp.partition)] = (data, current.start_offset)
                    total += len(data)
        return out

    # -- background -----------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._refresh_loop(), name="stonemq-tier-refresh"))
        self._tasks.append(loop.create_task(self._upload_loop(), name="stonemq-tier-upload"))
        if self.settings.tier_interval_ms > 0:
            self._tasks.append(loop.create_task(self._archive_loop(), name="stonemq-tier-run"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        proc = self._run_proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                for topic, partition in self._tiered_partitions():
                    await loop.run_in_executor(
                        self.executor, lambda t=topic, p=partition: self.reader.manifest(t, p)
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("tier: manifest refresh failed: %s", exc)
            await asyncio.sleep(MANIFEST_REFRESH_S)

    async def _upload_loop(self) -> None:
        """Upload sealed segments of tiered partitions as they seal (checked every
        ``UPLOAD_INTERVAL_S``), so an archive job anywhere needs only the cold store."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(UPLOAD_INTERVAL_S)
            for topic, partition in self._tiered_partitions():
                try:
                    await loop.run_in_executor(self.executor, self._upload, topic, partition)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("tier: upload of %s-%d failed: %s", topic, partition, exc)

    def _upload(self, topic: str, partition: int) -> None:
        """Upload what sealed since the last look (a folder listing when nothing did)."""
        from stonemq.tiering.uploader import local_segments, upload_sealed

        queue_dir = str(self.settings.queue_path)
        sealed = [s.base for s in local_segments(queue_dir, topic, partition) if s.sealed]
        if not sealed or self._uploaded.get((topic, partition)) == sealed[-1]:
            return
        upload_sealed(
            self.reader.store, queue_dir, topic, partition, self.archived_next(topic, partition)
        )
        self._uploaded[(topic, partition)] = sealed[-1]

    async def refresh_now(self, topic: str, partition: int) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: self.reader.manifest(topic, partition, fresh=True)
        )

    async def _archive_loop(self) -> None:
        """Run ``stonemq tier run --once`` every ``tier.interval.ms`` (a separate process:
        the JVM and Spark never share the broker's process)."""
        interval_s = self.settings.tier_interval_ms / 1000
        log_path = Path(self.settings.data_dir) / "tier" / "run.log"
        while True:
            await asyncio.sleep(interval_s)
            if not self._tiered_partitions():
                continue
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as out:
                self._run_proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "stonemq",
                    "tier",
                    "run",
                    "--once",
                    "--data-dir",
                    str(self.settings.data_dir),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=settings_env(self.settings),
                )
            code = await self._run_proc.wait()
            if code != 0:
                log.warning("tier: archive run exited %d (see %s)", code, log_path)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process this broker's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[f"STONEMQ_{name.upper()}"] = str(value)
    return env
