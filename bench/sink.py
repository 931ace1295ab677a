"""Baseline (c), the storage-free broker: StoneMQ with a Produce handler that stores nothing.

``python -m bench.sink serve ...`` takes the same command line as ``stonemq serve``: the same
listener, connection, request decoding, metadata and topic creation, but every Produce is
answered at once with success and offsets counted from the batches' record counts; no
validation, no journal, no splitter work. Run at each partition-scaling step next to the real
broker, it measures what the client and StoneMQ's network and protocol layers reach on this
machine with nothing stored: the most any storage behind them could give, and how much of the
fall from 1 to 10,000 partitions is the client's own.
"""

from __future__ import annotations

import sys
from typing import Any

from kio.schema.errors import ErrorCode

import stonemq.handlers  # noqa: F401  (registers every handler; ours replaces Produce's)
from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import REGISTRY, ApiSpec

_RECORDS_COUNT_AT = 57  # RecordBatch v2: int32 record count after the 57-byte header prefix
_next_offset: dict[tuple[str, int], int] = {}


def _records_in(batch: bytes | None) -> int:
    if not batch or len(batch) < _RECORDS_COUNT_AT + 4:
        return 0
    return int.from_bytes(batch[_RECORDS_COUNT_AT : _RECORDS_COUNT_AT + 4], "big", signed=True)


async def handle_produce(ctx: RequestContext, request: Any) -> Any:
    """Success for every partition, with the offset it would have had; nothing is kept."""
    topics = []
    for topic in request.topic_data:
        partitions = []
        for data in topic.partition_data:
            key = (topic.name, data.index)
            base = _next_offset.get(key, 0)
            _next_offset[key] = base + max(_records_in(data.records), 0)
            partitions.append(
                ctx.build(
                    "PartitionProduceResponse",
                    index=data.index,
                    error_code=ErrorCode.none,
                    base_offset=base,
                    log_append_time=None,
                    log_start_offset=0,
                    record_errors=(),
                    error_message=None,
                )
            )
        topics.append(
            ctx.build(
                "TopicProduceResponse", name=topic.name, partition_responses=tuple(partitions)
            )
        )
    if request.acks == 0:
        return None
    return ctx.build("ProduceResponse", responses=tuple(topics), throttle_time=0)


def main() -> None:
    spec = REGISTRY[0]
    REGISTRY[0] = ApiSpec(0, spec.min_version, spec.max_version, handle_produce)
    from stonemq.cli.serve import main as serve

    # served in this process: the patched Produce handler is in this process's registry
    sys.modules.setdefault("hypothesis", None)  # as ``stonemq serve`` does (cli/__init__)
    sys.exit(serve(sys.argv[2:], in_process=True))


if __name__ == "__main__":
    main()
