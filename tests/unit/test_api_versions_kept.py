"""ApiVersions answers are built and encoded once per version: every request gets the same
bytes a fresh encoding would give, behind its own correlation id."""

from __future__ import annotations

import asyncio

import pytest

from stonemq.handlers import api_versions
from stonemq.handlers.context import RequestContext
from stonemq.protocol.codec import RequestHeader, encode_response


@pytest.mark.parametrize("version", range(5))
def test_a_kept_answer_is_the_fresh_encoding_behind_each_correlation_id(version: int) -> None:
    api_versions._KEPT.clear()

    async def answer(correlation_id: int) -> tuple[object, bytes]:
        ctx = RequestContext(18, version, correlation_id, "c", "h", None)  # type: ignore[arg-type]
        response = await api_versions.handle_api_versions(ctx, None)
        assert ctx.reuse is not None and response is ctx.reuse.response
        header = RequestHeader(18, version, correlation_id, "c")
        return response, b"".join(ctx.reuse.chunks(header))

    first, first_bytes = asyncio.run(answer(7))
    again, again_bytes = asyncio.run(answer(123456))
    assert again is first  # built once
    fresh = api_versions._build(RequestContext(18, version, 0, "c", "h", None))  # type: ignore[arg-type]
    assert first_bytes == encode_response(RequestHeader(18, version, 7, "c"), fresh)
    assert again_bytes == encode_response(RequestHeader(18, version, 123456, "c"), fresh)
