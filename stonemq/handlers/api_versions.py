"""ApiVersions (18): the APIs this broker serves and their version ranges, from the registry.

Kafka's step-down rule: a client that asks with a version the broker does not know gets the
v0 body with UNSUPPORTED_VERSION and the full list, so it can retry with a version both sides
know (kafka-python sends v4 first, kafkajs v2, librdkafka v3, aiokafka v0).
"""

from __future__ import annotations

from typing import Any

from kio.schema.api_versions.v0 import response as v0
from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import REGISTRY, api


def _ranges() -> list[tuple[int, int, int]]:
    return [
        (s.api_key, s.min_version, s.max_version)
        for s in sorted(REGISTRY.values(), key=lambda s: s.api_key)
    ]


def unsupported_version_response() -> Any:
    return v0.ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            v0.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in _ranges()
        ),
    )


@api(18, 0, 4)
async def handle_api_versions(ctx: RequestContext, request: Any) -> Any:
    return ctx.build(
        "ApiVersionsResponse",
        error_code=ErrorCode.none,
        api_keys=tuple(
            ctx.build("ApiVersion", api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in _ranges()
        ),
        throttle_time=0,
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
