"""The entry-stall probe (issue 17, "never a stall of other clients"): does one request naming
~100,000 entries hold the event loop while other clients wait?

For each API below, one connection sends a request of ``--entries`` entries while another
connection sends an ApiVersions every 20 ms; the longest wait of a probe sent while the big
request was in flight is what the broker made other clients wait. Also measured, in this
process with the broker's own codec (the same Python code the broker runs), how long decoding
the request and encoding its response take: the parts of the wait that are not the handler.

Run: ``python -m bench.entry_stalls --port 39200 [--entries 100000] [--repeats 3]``; it starts
a broker of its own on that port (data under ``--data-dir``) and stops it at the end.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import io
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import f64, i8, i32, i32Timedelta, i64

PROBE_INTERVAL_S = 0.02
TOPIC = "stall-probe"
PARTITIONS = 4


def _mod(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def _encode(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def frame_of(entity: Any, correlation_id: int) -> bytes:
    """A request frame (length, header v1 or v2, body) for a kio request entity."""
    header = struct.pack(
        ">hhih", entity.__api_key__, entity.__version__, correlation_id, len(b"probe")
    )
    header += b"probe"
    if entity.__flexible__:
        header += b"\0"
    payload = header + _encode(entity)
    return struct.pack(">i", len(payload)) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("closed by the broker")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    return _recv_exact(sock, size)


def decode_response(entity: Any, data: bytes) -> Any:
    """The kio response entity of ``data`` (a response frame's payload) to ``entity``."""
    cls = importlib.import_module(entity.__module__.rpartition(".")[0] + ".response").__dict__[
        type(entity).__name__.replace("Request", "Response")
    ]
    pos = 4 + (1 if cls.__flexible__ else 0)  # correlation id, header v1's tags
    body, _ = entity_reader(cls)(data, pos)
    return body


# -- the requests -------------------------------------------------------------------------------
def _ids(n: int) -> range:
    return range(n)


def offset_fetch(n: int) -> Any:
    m = _mod("offset_fetch", 8)
    topics = (m.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=tuple(map(i32, _ids(n)))),)
    return m.OffsetFetchRequest(
        groups=(m.OffsetFetchRequestGroup(group_id="g", topics=topics),), require_stable=False
    )


def describe_groups(n: int) -> Any:
    m = _mod("describe_groups", 5)
    return m.DescribeGroupsRequest(
        groups=tuple(f"g{i}" for i in _ids(n)), include_authorized_operations=False
    )


def delete_groups(n: int) -> Any:
    m = _mod("delete_groups", 2)
    return m.DeleteGroupsRequest(groups_names=tuple(f"g{i}" for i in _ids(n)))


def incremental_alter_configs(n: int) -> Any:
    m = _mod("incremental_alter_configs", 1)
    return m.IncrementalAlterConfigsRequest(
        resources=tuple(
            m.AlterConfigsResource(
                resource_type=i8(2),
                resource_name=f"nt{i}",
                configs=(
                    m.AlterableConfig(name="retention.ms", config_operation=i8(0), value="1000"),
                ),
            )
            for i in _ids(n)
        ),
        validate_only=True,
    )


def alter_client_quotas(n: int) -> Any:
    m = _mod("alter_client_quotas", 1)
    return m.AlterClientQuotasRequest(
        entries=tuple(
            m.EntryData(
                entity=(m.EntityData(entity_type="client-id", entity_name=f"c{i}"),),
                ops=(m.OpData(key="producer_byte_rate", value=f64(1e6), remove=False),),
            )
            for i in _ids(n)
        ),
        validate_only=True,
    )


def metadata_by_id(n: int) -> Any:
    m = _mod("metadata", 12)
    return m.MetadataRequest(
        topics=tuple(m.MetadataRequestTopic(topic_id=uuid.uuid4(), name=None) for _ in _ids(n)),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def list_offsets_by_time(n: int) -> Any:
    m = _mod("list_offsets", 8)
    parts = tuple(
        m.ListOffsetsPartition(
            partition_index=i32(i % PARTITIONS if i < n // 2 else i),
            current_leader_epoch=i32(-1),
            timestamp=i64(1000),
        )
        for i in _ids(n)
    )
    return m.ListOffsetsRequest(
        replica_id=i32(-1),
        isolation_level=i8(0),
        topics=(m.ListOffsetsTopic(name=TOPIC, partitions=parts),),
    )


def describe_topic_partitions(n: int) -> Any:
    m = _mod("describe_topic_partitions", 0)
    return m.DescribeTopicPartitionsRequest(
        topics=tuple(m.TopicRequest(name=f"nt{i}") for i in _ids(n)),
        response_partition_limit=i32(2000),
        cursor=None,
    )


def describe_producers(n: int) -> Any:
    m = _mod("describe_producers", 0)
    return m.DescribeProducersRequest(
        topics=(m.TopicRequest(name=TOPIC, partition_indexes=tuple(map(i32, _ids(n)))),)
    )


def offset_for_leader_epoch(n: int) -> Any:
    m = _mod("offset_for_leader_epoch", 4)
    parts = tuple(
        m.OffsetForLeaderPartition(
            partition=i32(i), current_leader_epoch=i32(-1), leader_epoch=i32(0)
        )
        for i in _ids(n)
    )
    return m.OffsetForLeaderEpochRequest(
        replica_id=i32(-1), topics=(m.OffsetForLeaderTopic(topic=TOPIC, partitions=parts),)
    )


def elect_leaders(n: int) -> Any:
    m = _mod("elect_leaders", 2)
    return m.ElectLeadersRequest(
        election_type=i8(0),
        topic_partitions=(m.TopicPartitions(topic=TOPIC, partitions=tuple(map(i32, _ids(n)))),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
    )


def fetch(n: int) -> Any:
    m = _mod("fetch", 12)
    parts = tuple(
        m.FetchPartition(
            partition=i32(i),
            current_leader_epoch=i32(-1),
            fetch_offset=i64(0),
            last_fetched_epoch=i32(-1),
            log_start_offset=i64(-1),
            partition_max_bytes=i32(1 << 20),
        )
        for i in _ids(n)
    )
    return m.FetchRequest(
        replica_id=i32(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(0)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 26),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(m.FetchTopic(topic=TOPIC, partitions=parts),),
        forgotten_topics_data=(),
        rack_id="",
    )


def describe_configs_repeated(n: int) -> Any:
    """One topic named many times: 1,000 resources at 100,000 entries (a 24 KB request whose
    answer is about 13 MB)."""
    m = _mod("describe_configs", 4)
    return m.DescribeConfigsRequest(
        resources=tuple(
            m.DescribeConfigsResource(
                resource_type=i8(2), resource_name=TOPIC, configuration_keys=None
            )
            for _ in range(max(1, n // 100))
        ),
        include_synonyms=True,
        include_documentation=True,
    )


REQUESTS: dict[str, Callable[[int], Any]] = {
    "OffsetFetch": offset_fetch,
    "DescribeGroups": describe_groups,
    "DeleteGroups": delete_groups,
    "IncrementalAlterConfigs": incremental_alter_configs,
    "AlterClientQuotas": alter_client_quotas,
    "MetadataById": metadata_by_id,
    "ListOffsetsByTime": list_offsets_by_time,
    "DescribeTopicPartitions": describe_topic_partitions,
    "DescribeProducers": describe_producers,
    "OffsetForLeaderEpoch": offset_for_leader_epoch,
    "ElectLeaders": elect_leaders,
    "DescribeConfigsRepeated": describe_configs_repeated,
    "Fetch": fetch,
}


# -- measuring ----------------------------------------------------------------------------------
class Prober(threading.Thread):
    """ApiVersions every 20 ms on a connection of its own; each probe's send and answer times."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(120)
        self.stop = threading.Event()
        self.probes: list[tuple[float, float]] = []

    def run(self) -> None:
        cid = 0
        while not self.stop.is_set():
            cid += 1
            sent = time.monotonic()
            self.sock.sendall(frame_of(ApiVersionsRequest(), cid))
            recv_frame(self.sock)
            answered = time.monotonic()
            self.probes.append((sent, answered))
            time.sleep(max(0.0, PROBE_INTERVAL_S - (answered - sent)))
        self.sock.close()


def offline_costs(entity: Any, frame: bytes, answer: bytes) -> tuple[float, float]:
    """Seconds the broker's codec takes to decode the request frame and to encode the answer,
    timed here (the same code, outside the broker)."""
    from stonemq.protocol.codec import (
        RequestHeader,
        decode_request,
        encode_response_chunks,
        parse_header_prefix,
    )

    payload = frame[4:]
    began = time.perf_counter()
    header, pos = parse_header_prefix(payload)
    decode_request(header, payload, pos)
    decode_s = time.perf_counter() - began
    response = decode_response(entity, answer)
    began = time.perf_counter()
    encode_response_chunks(RequestHeader(*header), response)
    return decode_s, time.perf_counter() - began


def measure(port: int, name: str, entity: Any, timed_codec: bool) -> dict[str, float]:
    frame = frame_of(entity, 7)
    prober = Prober(port)
    prober.start()
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(300)
        began = time.monotonic()
        sock.sendall(frame)
        answer = recv_frame(sock)
        ended = time.monotonic()
    time.sleep(0.1)
    prober.stop.set()
    prober.join(30)
    waits = [a - s for s, a in prober.probes if s < ended and a > began]
    result = {
        "request_kb": len(frame) / 1024,
        "answer_kb": len(answer) / 1024,
        "took_s": ended - began,
        "probes": len(waits),
        "longest_probe_s": max(waits, default=float("nan")),
    }
    if timed_codec:
        result["decode_s"], result["encode_s"] = offline_costs(entity, frame, answer)
    return result


def start_broker(port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    log = (data_dir.parent / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "stonemq", "serve"),
            *("--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir)),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("broker did not start")


def create_topic(port: int) -> None:
    m = _mod("create_topics", 7)
    request = m.CreateTopicsRequest(
        topics=(
            m.CreatableTopic(
                name=TOPIC,
                num_partitions=i32(PARTITIONS),
                replication_factor=__import__("kio.static.primitive").static.primitive.i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        validate_only=False,
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(frame_of(request, 1))
        recv_frame(sock)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=39200)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("/work/runs/s18/stalls/data"))
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    proc = start_broker(args.port, args.data_dir)
    try:
        create_topic(args.port)
        print(
            f"{'api':26} {'rep':>3} {'req KB':>8} {'ans KB':>8} {'took s':>7} {'probes':>6} "
            f"{'longest probe s':>15} {'decode s':>8} {'encode s':>8}",
            flush=True,
        )
        for name, make in REQUESTS.items():
            if args.only and name not in args.only:
                continue
            entity = make(args.entries)
            for rep in range(args.repeats):
                r = measure(args.port, name, entity, timed_codec=rep == 0)
                nan = float("nan")
                print(
                    f"{name:26} {rep:>3} {r['request_kb']:8.0f} {r['answer_kb']:8.0f} "
                    f"{r['took_s']:7.2f} {r['probes']:6d} {r['longest_probe_s']:15.3f} "
                    f"{r.get('decode_s', nan):8.2f} {r.get('encode_s', nan):8.2f}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
