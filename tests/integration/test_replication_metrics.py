"""Replication under pipelined acks=all produce, and the brokers' replica fetch metrics
(``metrics.listen``, Prometheus text): three real brokers and ZooKeeper.

A follower's fetch that found nothing new waits for the next journal write; a write that
landed while the leader's replica-read thread was reading used to be missed, and the fetch
then slept until the write after it (or its 500 ms long poll): with two acks=all requests in
flight on one connection every request took about 28 ms instead of about 1 ms (the
replication benchmark, bench/replication.py, found it)."""

from __future__ import annotations

import time
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from ports import free_port as _free_port  # tests/ (on sys.path: root conftest)

from bench.replication import parse_metrics

from .rawclient import RawConnection, build_batch, produce_request, schema
from .test_replication import _leaders, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

DEPTH = 2
REQUESTS = 150
RECORD = b"x" * 1024


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode())


def _cluster(broker_factory: Any, zookeeper: Any, ports: list[int], **extra: Any) -> list[Any]:
    """Three brokers at replication factor 3, each with its metrics endpoint on ``ports``."""
    chroot = f"{zookeeper.connect}/stonemq-pipe-{uuid.uuid4().hex[:8]}"
    brokers = [
        broker_factory(
            zookeeper_connect=chroot,
            broker_id=b,
            journal_partitions=1,
            default_replication_factor=3,
            metrics_listen=f"127.0.0.1:{port}",
            start=False,
            **extra,
        )
        for b, port in zip((1, 2, 3), ports, strict=True)
    ]
    for b in brokers:  # placement waits for three live brokers: start them together
        b.spawn()
    for b in brokers:
        b.wait_ready(60)
    return brokers


def test_pipelined_acks_all_is_answered_as_fast_as_the_followers_fetch(
    broker_factory: Any, zookeeper: Any
) -> None:
    ports = [_free_port() for _ in range(3)]
    brokers = _cluster(broker_factory, zookeeper, ports)
    bootstrap = brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("pipe", 1, 3)])["pipe"].result(30)
    _wait(lambda: _leaders(bootstrap, "pipe").get(0, -1) > 0, 30, "a leader")
    leader_id = _leaders(bootstrap, "pipe")[0]
    leader = brokers[leader_id - 1]
    leader_port = ports[leader_id - 1]
    before = _metrics(leader_port)["stonemq_replica_fetch_requests_served_total"]
    response_type = schema("produce", 7, "response").ProduceResponse
    batch = bytes(build_batch([(None, RECORD)]))
    offsets = []
    with RawConnection(leader.host, leader.port, timeout=30) as conn:
        # warm up: the followers fetch and the ISR is whole before timing
        cid = conn.send_request(produce_request("pipe", 0, batch, acks=-1))
        conn.recv_response(response_type, cid)
        warm = _metrics(leader_port)
        started = time.monotonic()
        in_flight = [conn.send_request(produce_request("pipe", 0, batch)) for _ in range(DEPTH)]
        sent = DEPTH
        while in_flight:
            part = conn.recv_response(response_type, in_flight.pop(0)).responses[0]
            (answer,) = part.partition_responses
            assert answer.error_code == 0, answer
            offsets.append(answer.base_offset)
            if sent < REQUESTS:
                in_flight.append(conn.send_request(produce_request("pipe", 0, batch)))
                sent += 1
        per_request_ms = (time.monotonic() - started) / REQUESTS * 1000
    assert offsets == list(range(1, REQUESTS + 1))
    # about 1 ms on an idle 2-core machine; 28 ms with the lost wake-up
    assert per_request_ms < 10, f"{per_request_ms:.1f} ms per acks=all request"
    # every follower fetched every acknowledged batch: the leader counted the requests and
    # sent at least the batches' bytes to each of its two followers
    after = _metrics(leader_port)
    assert after["stonemq_replica_fetch_requests_served_total"] > before
    assert after["stonemq_replica_fetch_bytes_served_total"] >= 2 * (REQUESTS + 1) * len(batch)
    for b, port in zip(brokers, ports, strict=True):
        if b is not leader:
            assert _metrics(port)["stonemq_replica_fetch_requests_sent_total"] > 0
    # followers that keep up are answered from the leader's in-memory tail of its journal,
    # never from the files (replication/tail.py)
    tail = "stonemq_replica_fetch_tail_reads_total"
    files = "stonemq_replica_fetch_file_reads_total"
    assert after[tail] - warm[tail] >= REQUESTS / DEPTH, (warm, after)
    assert after[files] == warm[files], (warm, after)
    # the process collector comes with the endpoint
    assert after["process_cpu_seconds_total"] > 0


def test_acks_all_holding_the_request_budget_does_not_stop_the_followers(
    broker_factory: Any, zookeeper: Any
) -> None:
    """acks=all produces waiting for the ISR hold ``queued.max.request.bytes``; the followers'
    fetches, which alone can move the HW, are still read. They were not: every connection
    stopped reading, and the produces waited out their timeout (REQUEST_TIMED_OUT) while the
    brokers idled."""
    budget = 64 * 1024
    brokers = _cluster(
        broker_factory,
        zookeeper,
        [_free_port() for _ in range(3)],
        queued_max_request_bytes=budget,
    )
    bootstrap = brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("held", 1, 3)])["held"].result(30)
    _wait(lambda: _leaders(bootstrap, "held").get(0, -1) > 0, 30, "a leader")
    leader = brokers[_leaders(bootstrap, "held")[0] - 1]
    response_type = schema("produce", 7, "response").ProduceResponse
    batch = bytes(build_batch([(None, RECORD)] * 40))  # ~41 KiB: two exceed the budget
    requests = 12
    with RawConnection(leader.host, leader.port, timeout=30) as conn:
        cid = conn.send_request(produce_request("held", 0, batch, acks=-1))  # warm-up
        assert conn.recv_response(response_type, cid).responses[0].partition_responses[0]
        started = time.monotonic()
        cids = [conn.send_request(produce_request("held", 0, batch)) for _ in range(requests)]
        errors = []
        for cid in cids:
            (answer,) = conn.recv_response(response_type, cid).responses[0].partition_responses
            errors.append(answer.error_code)
        elapsed = time.monotonic() - started
    assert errors == [0] * requests  # 7 (REQUEST_TIMED_OUT) after the 10 s request timeout
    assert elapsed < 8, f"{elapsed:.1f} s for {requests} pipelined acks=all requests"
