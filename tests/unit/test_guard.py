"""The request bounds guard (stonemq/protocol/guard.py) in front of kio's native reader.

For every (api key, version) StoneMQ advertises: random valid requests pass and decode as kio
alone decodes them; truncated requests and requests with one length corrupted either decode
or raise RequestDecodeError, and never make kio reserve memory beyond the frame (checked in a
child process whose address space is capped, where such a reservation aborts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuzz.layout import lengths
from fuzz.mutators import hostile_length
from fuzz.values import ADVERTISED, encode, produce_plain, request_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader
from kio.static.primitive import Records

from stonemq.protocol import guard
from stonemq.protocol.codec import (
    NATIVE_DECODERS,
    RequestDecodeError,
    decode_request,
    parse_header_prefix,
)

st.register_type_strategy(Records, st.binary(max_size=64))

SETTINGS = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode(api_key: int, version: int, body: bytes) -> Any:
    frame = request_header(api_key, version, 7, None) + body
    header, pos = parse_header_prefix(frame)
    return decode_request(header, frame, pos)


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    api_key, version = draw(st.sampled_from(ADVERTISED))
    return api_key, version, draw(st.from_type(load_request_schema(api_key, version)))


def test_the_abort_reproducer_is_rejected_not_fatal() -> None:
    """kio alone aborted the process on these 20 bytes; run in a child so the old code fails
    this test instead of taking pytest down."""
    code = (
        "from stonemq.protocol.codec import RequestDecodeError, decode_request, "
        "parse_header_prefix\n"
        "from stonemq.protocol.guard import ABORT_REPRODUCER as frame\n"
        "header, pos = parse_header_prefix(frame)\n"
        "try:\n    decode_request(header, frame, pos)\n"
        "except RequestDecodeError as exc:\n    print('rejected:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"rejected: malformed api 3 v12 body: array topics" in done.stdout


def test_every_advertised_request_schema_compiles() -> None:
    for api_key, version in ADVERTISED:
        assert callable(guard.compile_walker(load_request_schema(api_key, version)))


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@SETTINGS
@given(valid_requests())
def test_valid_requests_pass_and_decode_as_kio_decodes_them(case: tuple[int, int, Any]) -> None:
    api_key, version, entity = case
    cls = type(entity)
    body = encode(entity)
    assert guard.check(guard.compile_walker(cls), body, 0) == len(body)
    try:
        alone = entity_reader(cls)(body, 0)[0]
    except Exception as exc:  # kio refuses a few values it can write (a timedelta_i64 past
        # Python's timedelta range): then so does decode_request, for the same reason
        with pytest.raises(RequestDecodeError, match=re.escape(str(exc))):
            decode(api_key, version, body)
        return
    decoded = decode(api_key, version, body)
    if api_key in NATIVE_DECODERS:  # Produce: the broker's own decoder, records as views
        assert produce_plain(version, decoded) == produce_plain(version, alone)
        assert alone == entity
        return
    assert decoded == alone == entity


@functools.cache
def non_nullable_arrays() -> list[tuple[int, int, str]]:
    """Every advertised request's top-level non-nullable arrays (loads every request schema:
    built when a test asks, not when the module is collected)."""
    return [
        (api_key, version, node.name)
        for api_key, version in ADVERTISED
        for node in guard.describe(load_request_schema(api_key, version)).fields
        if isinstance(node, guard.Array) and not node.nullable
    ]


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@SETTINGS
@given(st.data())
def test_null_for_a_non_nullable_array_is_a_decode_error(data: st.DataObject) -> None:
    """kio reads it as None and handlers failed on it; Kafka refuses to parse it."""
    api_key, version, name = data.draw(st.sampled_from(non_nullable_arrays()))
    entity = data.draw(st.from_type(load_request_schema(api_key, version)))
    body = encode(dataclasses.replace(entity, **{name: None}))
    with pytest.raises(RequestDecodeError, match=f"null array for non-nullable field {name}"):
        decode(api_key, version, body)


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@SETTINGS
@given(valid_requests(), st.data())
def test_truncated_requests_decode_or_are_rejected(
    case: tuple[int, int, Any], data: st.DataObject
) -> None:
    api_key, version, entity = case
    body = encode(entity)
    cut = data.draw(st.integers(0, max(len(body) - 1, 0)))
    with contextlib.suppress(RequestDecodeError):
        decode(api_key, version, body[:cut])


@st.composite
def corrupted_requests(draw: st.DrawFn) -> tuple[int, int, bytes]:
    api_key, version, entity = draw(valid_requests())
    body = encode(entity)
    found, end = lengths(type(entity), body)
    assert end == len(body)
    if not found:
        return api_key, version, body
    target = draw(st.sampled_from(found))
    new = hostile_length(draw(st.randoms(use_true_random=False)), target)
    return api_key, version, body[: target.offset] + new + body[target.offset + target.width :]


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@SETTINGS
@given(corrupted_requests())
def test_corrupted_lengths_decode_or_are_rejected(case: tuple[int, int, bytes]) -> None:
    api_key, version, body = case
    with contextlib.suppress(RequestDecodeError):
        decode(api_key, version, body)


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_corrupted_lengths_never_make_kio_reserve_beyond_the_frame() -> None:
    """The corruption property again, in a child whose address space is capped at what it
    uses plus 256 MiB: a reservation sized by an untrusted count fails there, and kio aborts."""
    code = (
        "import resource\n"
        "import test_guard\n"
        "vm = next(int(line.split()[1]) for line in open('/proc/self/status') "
        "if line.startswith('VmSize:')) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))\n"
        "test_guard.test_corrupted_lengths_decode_or_are_rejected()\n"
        "print('ok')\n"
    )
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=300, env=env, cwd=here
    )
    assert done.returncode == 0 and done.stdout.endswith(b"ok\n"), done.stderr.decode()[-3000:]
