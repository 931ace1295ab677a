"""A storage engine for tests that drive one in-process (tests/ is on sys.path through the
root conftest): small segments, no fsync policy, the other settings at test sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stonemq.storage.engine import StorageEngine

ENGINE_DEFAULTS: dict[str, Any] = {
    "journal_partitions": 2,
    "journal_segment_bytes": 64 * 1024,
    "flush_policy": "never",
    "flush_interval_ms": 1000,
    "queue_checkpoint_interval_ms": 60_000,
    "max_open_files": 64,
    "splitter_batch_bytes": 1 << 20,
    "queue_cache_retain_bytes": 1 << 20,  # small: reads after the pages were dropped
}


def new_engine(root: Path, **overrides: Any) -> StorageEngine:
    """An engine on ``root/journal`` and ``root/queues``; ``overrides`` replace defaults."""
    settings = {**ENGINE_DEFAULTS, **overrides}
    return StorageEngine(str(root / "journal"), str(root / "queues"), **settings)
