"""kcat (Debian's build on librdkafka 2.0) producing and consuming by partition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from .helpers import CODECS, Msg, assert_same, consume, create_topic, produce

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        shutil.which("kcat") is None, reason="kcat not installed (scripts/install-test-deps.sh)"
    ),
]

FMT = r"%o|%K|%k|%S|%s|%h|%T\n"


def kcat(*args: str, stdin: bytes | None = None, timeout: float = 60) -> bytes:
    proc = subprocess.run(
        ["kcat", "-X", "socket.timeout.ms=10000", *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"kcat {' '.join(args)} exited {proc.returncode}\nstderr:\n"
        + proc.stderr.decode(errors="replace")
    )
    return proc.stdout


def kcat_consume_lines(bootstrap: str, topic: str, *extra: str) -> list[list[str]]:
    out = kcat("-b", bootstrap, "-C", "-t", topic, "-p", "0", "-e", "-Z", "-f", FMT, *extra)
    return [line.split("|") for line in out.decode().splitlines()]


@pytest.mark.parametrize("codec", ["none", *CODECS])
def test_kcat_round_trip(module_broker, codec):
    b = module_broker.bootstrap
    topic = create_topic(b)
    rows = [
        ("alpha", "first value"),
        ("beta", ""),  # -Z: empty value is sent as NULL (a tombstone)
        ("", "no key"),  # -Z: empty key is sent as NULL
        ("gamma", "x" * 3000),
        ("delta", "unicode \u00e9\u00e8 \u2603"),
    ]
    stdin = "".join(f"{k}:{v}\n" for k, v in rows).encode()
    before = int(time.time() * 1000)
    kcat(
        "-b", b, "-P", "-t", topic, "-p", "0", "-K:", "-Z",
        "-H", "trace=abc-123", "-H", "kind=kcat",
        "-z", codec,
        stdin=stdin,
    )  # fmt: skip
    after = int(time.time() * 1000)

    lines = kcat_consume_lines(b, topic, "-o", "beginning")
    assert len(lines) == len(rows), lines
    for i, ((key, value), line) in enumerate(zip(rows, lines, strict=True)):
        offset, klen, k, vlen, v, headers, ts = line
        assert int(offset) == i
        if key:
            assert (int(klen), k) == (len(key.encode()), key)
        else:
            assert (int(klen), k) == (-1, "NULL")
        if value:
            assert (int(vlen), v) == (len(value.encode()), value)
        else:
            assert (int(vlen), v) == (-1, "NULL")
        assert headers == "trace=abc-123,kind=kcat"
        assert before - 1000 <= int(ts) <= after + 1000, (before, ts, after)

    # the same records, exactly, through another client
    expected = [
        Msg(
            k.encode() or None,
            v.encode() or None,
            (("trace", b"abc-123"), ("kind", b"kcat")),
            int(line[6]),
        )
        for (k, v), line in zip(rows, lines, strict=True)
    ]
    assert_same(consume(b, topic, len(rows)), expected)


def test_kcat_reads_what_confluent_wrote(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    base = int(time.time() * 1000) - 100_000
    msgs = [
        Msg(b"k0", b"v0", (("a", b"1"),), base),
        Msg(b"k1", None, (), base + 1),
        Msg(None, b"v2", (("a", b"2"), ("b", b"3")), base + 2),
    ]
    produce(b, topic, msgs, acks="all", **{"compression.type": "lz4"})
    lines = kcat_consume_lines(b, topic, "-o", "beginning")
    assert lines == [
        ["0", "2", "k0", "2", "v0", "a=1", str(base)],
        ["1", "2", "k1", "-1", "NULL", "", str(base + 1)],
        ["2", "-1", "NULL", "2", "v2", "a=2,b=3", str(base + 2)],
    ]
    # by absolute offset and from a timestamp (ListOffsets by time)
    assert [line[0] for line in kcat_consume_lines(b, topic, "-o", "1")] == ["1", "2"]
    assert [line[0] for line in kcat_consume_lines(b, topic, "-o", f"s@{base + 1}")] == ["1", "2"]
    assert [line[0] for line in kcat_consume_lines(b, topic, "-o", "-1")] == ["2"]


@pytest.mark.slow
def test_kcat_one_million_byte_message(module_broker, tmp_path):
    b = module_broker.bootstrap
    topic = create_topic(b)
    payload = os.urandom(1_000_000)
    f = tmp_path / "big.bin"
    f.write_bytes(payload)
    kcat("-b", b, "-P", "-t", topic, "-p", "0", "-z", "zstd", "-X", "message.max.bytes=2000000",
         str(f))  # fmt: skip
    out = kcat("-b", b, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-c", "1",
               "-f", "%s")  # fmt: skip
    assert len(out) == len(payload)
    assert out == payload


def test_kcat_metadata(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, partitions=3)
    md = json.loads(kcat("-b", b, "-L", "-J", "-t", topic))
    (broker_md,) = md["brokers"]
    assert broker_md["name"] == f"127.0.0.1:{module_broker.port}"
    (tmd,) = md["topics"]
    assert tmd["topic"] == topic
    assert sorted(p["partition"] for p in tmd["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == broker_md["id"] for p in tmd["partitions"])
