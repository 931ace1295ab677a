"""kafkajs 2.2.4: admin and producer (its consumer needs groups, which come later).

Records kafkajs wrote are read back with confluent-kafka and compared exactly.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import Msg, assert_same, consume, create_topic, unique_topic

JS_DIR = Path(__file__).resolve().parents[1] / "js"
SCRIPT = JS_DIR / "kafkajs_ops.js"

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("node") is None, reason="node not installed"),
    pytest.mark.skipif(
        not (JS_DIR / "node_modules" / "kafkajs").is_dir(),
        reason="kafkajs not installed (scripts/install-test-deps.sh)",
    ),
]


def run_js(broker, *steps: dict) -> list:
    spec = {"brokers": [broker.bootstrap], "steps": list(steps)}
    proc = subprocess.run(
        ["node", str(SCRIPT), json.dumps(spec)],
        capture_output=True,
        timeout=60,
        cwd=JS_DIR,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"},
    )
    assert proc.returncode == 0, (
        f"kafkajs exited {proc.returncode}\nstderr:\n{proc.stderr.decode(errors='replace')}"
    )
    results = json.loads(proc.stdout)
    assert [r["op"] for r in results] == [s["op"] for s in steps]
    return [r["result"] for r in results]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def js_message(m: Msg, partition: int = 0) -> dict:
    return {
        "key": b64(m.key),
        "value": b64(m.value),
        "headers": [[k, b64(v)] for k, v in m.headers],
        "timestamp": m.timestamp,
        "partition": partition,
    }


def js_sample(n: int, tag: str) -> list[Msg]:
    base = int(time.time() * 1000) - 7_200_000
    out = []
    for i in range(n):
        key = None if i % 4 == 3 else f"{tag}-k{i}".encode()
        value = None if i % 5 == 2 else f"{tag}-v{i}-".encode() + os.urandom(16) * (i % 7 + 1)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 2 == 0:
            headers = (("trace", f"t{i}".encode()), ("trace", b"dup"), ("bin", bytes(range(256))))
        out.append(Msg(key, value, headers, base + 13 * i))
    return out


def test_admin_create_list_metadata_delete(module_broker):
    t1, t2 = unique_topic("js-a"), unique_topic("js-b")
    created, again, listed, md = run_js(
        module_broker,
        {
            "op": "createTopics",
            "topics": [
                {"topic": t1, "numPartitions": 3},
                {"topic": t2, "numPartitions": 1, "configs": {"retention.ms": "3600000"}},
            ],
        },
        {"op": "createTopics", "topics": [{"topic": t1, "numPartitions": 3}]},
        {"op": "listTopics"},
        {"op": "fetchTopicMetadata", "topics": [t1, t2]},
    )
    assert created is True
    assert again is False  # kafkajs: false when the topic already exists
    assert t1 in listed and t2 in listed
    by_name = {t["name"]: t for t in md}
    assert [p["partitionId"] for p in by_name[t1]["partitions"]] == [0, 1, 2]
    assert [p["partitionId"] for p in by_name[t2]["partitions"]] == [0]
    for t in md:
        for p in t["partitions"]:
            assert p["errorCode"] == 0
            assert p["leader"] >= 0
            assert p["replicas"] == [p["leader"]] and p["isr"] == [p["leader"]]

    deleted, listed_after = run_js(
        module_broker, {"op": "deleteTopics", "topics": [t1]}, {"op": "listTopics"}
    )
    assert deleted is True
    assert t1 not in listed_after and t2 in listed_after


def test_admin_invalid_topic_name(module_broker):
    (result,) = run_js(
        module_broker,
        {"op": "createTopics", "topics": [{"topic": "bad/name"}], "expectError": True},
    )
    assert result["error"] is True, result
    # kafkajs wraps per-topic errors; the broker's INVALID_TOPIC_EXCEPTION must show through
    types = [result["type"]] + [e["type"] for e in result.get("errors", [])]
    assert "INVALID_TOPIC_EXCEPTION" in types, result


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_produce_round_trip(module_broker, compression):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = js_sample(40, f"js-{compression}")
    (results,) = run_js(
        module_broker,
        {
            "op": "produce",
            "topic": topic,
            "compression": compression,
            "chunk": 10,
            "messages": [js_message(m) for m in msgs],
        },
    )
    assert [(r["partition"], r["errorCode"]) for r in results] == [(0, 0)] * 4
    assert [int(r["baseOffset"]) for r in results] == [0, 10, 20, 30]
    assert_same(consume(b, topic, 40), msgs)


def test_idempotent_producer_and_offsets(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, partitions=2)
    msgs = js_sample(12, "js-idem")
    results, offsets, by_ts = run_js(
        module_broker,
        {
            "op": "produce",
            "topic": topic,
            "idempotent": True,
            "compression": "gzip",
            "chunk": 4,
            "messages": [js_message(m, partition=1) for m in msgs],
        },
        {"op": "fetchTopicOffsets", "topic": topic, "waitHigh": {"1": 12}},
        {"op": "fetchTopicOffsetsByTimestamp", "topic": topic, "timestamp": msgs[5].timestamp},
    )
    assert [int(r["baseOffset"]) for r in results] == [0, 4, 8]
    marks = {o["partition"]: (int(o["low"]), int(o["high"])) for o in offsets}
    assert marks == {0: (0, 0), 1: (0, 12)}
    by_ts = {o["partition"]: int(o["offset"]) for o in by_ts}
    assert by_ts[1] == 5
    assert_same(consume(b, topic, 12, partition=1), msgs)


def test_auto_create_on_produce(module_broker):
    topic = unique_topic("js-auto")
    msgs = js_sample(3, "js-auto")
    (results,) = run_js(
        module_broker,
        {"op": "produce", "topic": topic, "messages": [js_message(m) for m in msgs]},
    )
    assert [int(r["baseOffset"]) for r in results] == [0]
    assert_same(consume(module_broker.bootstrap, topic, 3), msgs)


def test_describe_cluster(module_broker):
    (cluster,) = run_js(module_broker, {"op": "describeCluster"})
    (broker_md,) = cluster["brokers"]
    assert (broker_md["host"], broker_md["port"]) == ("127.0.0.1", module_broker.port)
    assert cluster["controller"] == broker_md["nodeId"]
    assert cluster["clusterId"]
