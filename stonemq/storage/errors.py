"""The storage package's exceptions (re-exported by :mod:`stonemq.storage.engine`)."""

from __future__ import annotations


class StorageError(Exception):
    """An I/O failure (ENOSPC, EIO...) on the journal or a queue log: KAFKA_STORAGE_ERROR."""


class CutBackError(OSError):
    """A failed write left a partial record in a file and cutting it back failed too: the
    file's state is unknown (fatal, see ``health.py``)."""


class OffsetOutOfRangeError(Exception):
    """Requested offset is below the log start or above the high watermark."""


class UnknownPartitionError(Exception):
    """(topic, partition) was never registered, or its topic was removed."""
