"""Idempotent-producer state: per (partition, producer id) the epoch and the last batches'
sequence ranges, checked on every produce and rebuilt from the stored data after a restart.

Kafka's rules (ProducerStateManager): an older epoch is fenced (INVALID_PRODUCER_EPOCH); a
newer epoch must start at sequence 0; within an epoch a batch whose sequence range equals one
of the last five appended batches is a duplicate, answered as success with the offset it got
the first time; any other batch must start right after the last sequence
(OUT_OF_ORDER_SEQUENCE_NUMBER otherwise). A producer the partition has never seen is
accepted at any sequence, as Kafka does after its state expired.

The state is never read from a checkpoint alone: on first use of a partition after a
start it is replayed from the batch headers stored in the partition's queue log, which
recovery has brought level with the journal.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stonemq.protocol.record_batch import BatchHeader

if TYPE_CHECKING:
    from stonemq.storage.engine import StorageEngine

BATCHES_KEPT = 5
SEQUENCE_MODULUS = 1 << 31


@dataclass(slots=True)
class _BatchSeq:
    first_sequence: int
    last_sequence: int
    base_offset: int


class _ProducerEntry:
    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: collections.deque[_BatchSeq] = collections.deque(maxlen=BATCHES_KEPT)

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    """Outcome of :meth:`ProducerStateManager.check`."""

    error: ErrorCode
    duplicate_offset: int = -1  # base offset of the original batch when a duplicate


ACCEPT = SequenceCheck(ErrorCode.none)


class ProducerStateManager:
    """Producer entries for every partition that has seen an idempotent producer."""

    def __init__(self, storage: StorageEngine) -> None:
        self._storage = storage
        self._partitions: dict[tuple[str, int], dict[int, _ProducerEntry]] = {}

    def _producers(self, topic: str, partition: int) -> dict[int, _ProducerEntry]:
        key = (topic, partition)
        producers = self._partitions.get(key)
        if producers is None:
            producers = {}
            for info in self._storage.batch_headers(topic, partition):
                if info.base_sequence < 0:
                    continue
                last_sequence = (
                    info.base_sequence + (info.last_offset - info.base_offset)
                ) % SEQUENCE_MODULUS
                _record(
                    producers,
                    info.producer_id,
                    info.producer_epoch,
                    info.base_sequence,
                    last_sequence,
                    info.base_offset,
                )
            self._partitions[key] = producers
        return producers

    def check(self, topic: str, partition: int, header: BatchHeader) -> SequenceCheck:
        """Validate ``header``'s producer id, epoch and sequence against the partition state."""
        if header.producer_id < 0 or header.base_sequence < 0:
            return ACCEPT
        entry = self._producers(topic, partition).get(header.producer_id)
        if entry is None:
            return ACCEPT
        if header.producer_epoch < entry.epoch:
            return SequenceCheck(ErrorCode.invalid_producer_epoch)
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                return SequenceCheck(ErrorCode.out_of_order_sequence_number)
            return ACCEPT
        for batch in entry.batches:
            if (
                batch.first_sequence == header.base_sequence
                and batch.last_sequence == header.last_sequence
            ):
                return SequenceCheck(ErrorCode.none, duplicate_offset=batch.base_offset)
        if header.base_sequence != (entry.last_sequence + 1) % SEQUENCE_MODULUS:
            return SequenceCheck(ErrorCode.out_of_order_sequence_number)
        return ACCEPT

    def appended(self, topic: str, partition: int, header: BatchHeader, base_offset: int) -> None:
        """Record a batch that was accepted and given ``base_offset``."""
        if header.producer_id < 0 or header.base_sequence < 0:
            return
        _record(
            self._producers(topic, partition),
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_sequence,
            base_offset,
        )

    def forget(self, topic: str, partition: int, producer_id: int, base_offset: int) -> None:
        """Undo :meth:`appended` for a batch whose journal write failed."""
        entry = self._partitions.get((topic, partition), {}).get(producer_id)
        if entry is not None and entry.batches and entry.batches[-1].base_offset == base_offset:
            entry.batches.pop()

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self._partitions if k[0] == topic]:
            del self._partitions[key]


def _record(
    producers: dict[int, _ProducerEntry],
    producer_id: int,
    epoch: int,
    first_sequence: int,
    last_sequence: int,
    base_offset: int,
) -> None:
    entry = producers.get(producer_id)
    if entry is None or epoch > entry.epoch:
        entry = producers[producer_id] = _ProducerEntry(epoch)
    elif epoch < entry.epoch:
        return
    entry.batches.append(_BatchSeq(first_sequence, last_sequence, base_offset))
