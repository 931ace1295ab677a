"""The storage package's exceptions (re-exported by :mod:`stonemq.storage.engine`)."""

from __future__ import annotations


class StorageError(Exception):
    """An I/O failure (ENOSPC, EIO...) on the journal or a queue log: KAFKA_STORAGE_ERROR."""


class UnknownTopicsError(StorageError):
    """A follower's fetched journal entries name topic partitions this broker does not know
    and does not know to be deleted: nothing of the run is appended until it does (its
    metadata lags its journal), or its splitter would skip those entries as a deleted
    topic's while the leader counted them acknowledged by this replica."""

    def __init__(self, journal: int, topic_ids: set[bytes]) -> None:
        super().__init__(f"journal-{journal}: entries of {len(topic_ids)} unknown topic id(s)")
        self.topic_ids = topic_ids


class CutBackError(OSError):
    """A failed write left a partial record in a file and cutting it back failed too: the
    file's state is unknown (fatal, see ``health.py``)."""


class OffsetOutOfRangeError(Exception):
    """Requested offset is below the log start or above the high watermark."""


class UnknownPartitionError(Exception):
    """(topic, partition) was never registered, or its topic was removed."""


class NotLeaderError(UnknownPartitionError):
    """A replicated broker's own append (a produce, a group coordinator's record) to a journal
    partition it does not lead now: only the leader assigns offsets (cluster.md invariant 2).
    Answered as a partition not hosted here: NOT_LEADER_OR_FOLLOWER."""


class ProducerStateError(Exception):
    """A batch from an idempotent producer that the partition's producer state refuses."""


class InvalidProducerEpochError(ProducerStateError):
    """The producer's epoch is older than the partition's: INVALID_PRODUCER_EPOCH."""


class OutOfOrderSequenceError(ProducerStateError):
    """The batch does not follow the producer's last sequence: OUT_OF_ORDER_SEQUENCE_NUMBER."""


class DuplicateSequenceError(ProducerStateError):
    """The batch repeats one of the producer's last batches: answered as success with the
    offset the original got, once ``written`` (the original's journal write, when it is
    still pending) has succeeded."""

    def __init__(self, base_offset: int, written: object = None, timestamp: int = -1) -> None:
        super().__init__(f"duplicate of the batch at offset {base_offset}")
        self.base_offset = base_offset
        self.written = written
        self.timestamp = timestamp  # the original's max timestamp as stored (-1: unknown)
