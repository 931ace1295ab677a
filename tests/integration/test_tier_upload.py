"""The broker uploads sealed segments of tiered topics to the cold store as they seal (whole
batches, the offset range in the name), and only of tiered topics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stonemq.protocol.record_batch import iter_batches
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import StoreSpec

from .helpers import create_topic, produce, sample_messages, unique_topic, wait_high_watermark

pytestmark = pytest.mark.slow


def test_broker_uploads_sealed_segments_of_tiered_topics(broker) -> None:  # type: ignore[no-untyped-def]
    tiered = create_topic(
        broker.bootstrap,
        unique_topic("up"),
        config={"remote.storage.enable": "true", "internal.segment.bytes": "8192"},
    )
    plain = create_topic(
        broker.bootstrap, unique_topic("plain"), config={"internal.segment.bytes": "8192"}
    )
    msgs = sample_messages(200)
    for topic in (tiered, plain):
        produce(broker.bootstrap, topic, msgs, **{"batch.size": 4096, "linger.ms": 0})
        wait_high_watermark(broker.bootstrap, topic, len(msgs))
    queue = Path(broker.data_dir) / "queues" / f"{tiered}-0"
    sealed = sorted(int(p.stem) for p in queue.glob("*.log"))[:-1]
    assert len(sealed) >= 3
    store = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri()).open()
    deadline = time.monotonic() + 15
    while len(mf.list_segments(store, tiered, 0)) < len(sealed):
        assert time.monotonic() < deadline, "sealed segments not uploaded"
        time.sleep(0.2)
    uploaded = sorted(mf.list_segments(store, tiered, 0), key=lambda s: s.base)
    assert [s.base for s in uploaded] == sealed
    for seg in uploaded:
        data = store.get(seg.key)
        assert data == (queue / f"{seg.base:020d}.log").read_bytes()
        assert max(h.last_offset for _, h in iter_batches(data)) == seg.last
    assert mf.list_segments(store, plain, 0) == []
