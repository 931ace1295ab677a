"""Idempotent-producer sequence rules, and rebuild from stored batch headers."""

import pytest
from kio.schema.errors import ErrorCode

from stonemq.coordinator.producer_state import ProducerStateManager
from stonemq.protocol.record_batch import BatchHeader
from stonemq.storage.engine import BatchHeaderInfo


class StoredHeaders:
    """The storage collaborator: only batch_headers() is used by the manager."""

    def __init__(self, headers: list[BatchHeaderInfo] | None = None) -> None:
        self.headers = headers or []

    def batch_headers(self, topic: str, partition: int) -> list[BatchHeaderInfo]:
        return self.headers


def header(pid: int, epoch: int, seq: int, count: int) -> BatchHeader:
    return BatchHeader(0, 100, 0, 2, 0, 0, count - 1, 0, 0, pid, epoch, seq, count)


@pytest.fixture
def state() -> ProducerStateManager:
    return ProducerStateManager(StoredHeaders())  # type: ignore[arg-type]


def test_in_order_batches_are_accepted(state: ProducerStateManager) -> None:
    for i, seq in enumerate((0, 3, 6)):
        check = state.check("t", 0, header(1, 0, seq, 3))
        assert check.error == ErrorCode.none and check.duplicate_offset == -1
        state.appended("t", 0, header(1, 0, seq, 3), base_offset=i * 3)


def test_duplicate_is_success_with_original_offset(state: ProducerStateManager) -> None:
    state.appended("t", 0, header(1, 0, 0, 3), base_offset=40)
    state.appended("t", 0, header(1, 0, 3, 3), base_offset=43)
    check = state.check("t", 0, header(1, 0, 0, 3))
    assert check.error == ErrorCode.none and check.duplicate_offset == 40


def test_gap_is_out_of_order(state: ProducerStateManager) -> None:
    state.appended("t", 0, header(1, 0, 0, 3), base_offset=0)
    assert state.check("t", 0, header(1, 0, 5, 1)).error == ErrorCode.out_of_order_sequence_number


def test_old_epoch_is_fenced_and_new_epoch_must_start_at_zero(
    state: ProducerStateManager,
) -> None:
    state.appended("t", 0, header(1, 2, 0, 1), base_offset=0)
    assert state.check("t", 0, header(1, 1, 1, 1)).error == ErrorCode.invalid_producer_epoch
    assert state.check("t", 0, header(1, 3, 4, 1)).error == ErrorCode.out_of_order_sequence_number
    assert state.check("t", 0, header(1, 3, 0, 1)).error == ErrorCode.none


def test_partitions_are_independent(state: ProducerStateManager) -> None:
    state.appended("t", 0, header(1, 0, 0, 5), base_offset=0)
    assert state.check("t", 1, header(1, 0, 0, 1)).error == ErrorCode.none


def test_state_is_rebuilt_from_stored_headers() -> None:
    stored = StoredHeaders(
        [BatchHeaderInfo(10, 12, 7, 0, 0, 0), BatchHeaderInfo(13, 13, 7, 0, 3, 0)]
    )
    rebuilt = ProducerStateManager(stored)  # type: ignore[arg-type]
    assert rebuilt.check("t", 0, header(7, 0, 3, 1)).duplicate_offset == 13
    assert rebuilt.check("t", 0, header(7, 0, 4, 1)).error == ErrorCode.none
    assert rebuilt.check("t", 0, header(7, 0, 6, 1)).error == ErrorCode.out_of_order_sequence_number


def test_forget_undoes_a_failed_append(state: ProducerStateManager) -> None:
    state.appended("t", 0, header(1, 0, 0, 1), base_offset=0)
    state.appended("t", 0, header(1, 0, 1, 1), base_offset=1)
    state.forget("t", 0, 1, 1)
    assert state.check("t", 0, header(1, 0, 1, 1)).error == ErrorCode.none
