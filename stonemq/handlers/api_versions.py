"""ApiVersions (18): the APIs this broker serves and their version ranges, from the registry.

Kafka's step-down rule: a client that asks with a version the broker does not know gets the
v0 body with UNSUPPORTED_VERSION and the full list, so it can retry with a version both sides
know (kafka-python sends v4 first, kafkajs v2, librdkafka v3, aiokafka v0).

From v3 the answer also carries the broker's feature flags, as a Kafka 4 broker's does
(ApiVersionManager): the features it supports (a range of levels) and the cluster's finalized
level of each. StoneMQ serves the metadata.version of Kafka 4.0 (4.0-IV3, level 25; the
oldest a Kafka 4 broker starts from is 3.3-IV3, level 7), finalized at that level; it never
changes, so its epoch is 0. The features Kafka adds on top are left out, as Kafka leaves out a
feature whose highest level is 0, because StoneMQ does not implement them:
transaction.version (KIP-890 transactions), group.version (the KIP-848 consumer group
protocol), kraft.version and eligible.leader.replicas.version (KRaft quorum and ELR). A client
therefore takes the classic path for each. (Kafka omits a supported feature whose lowest
level is 0 from v3 answers, KAFKA-17492, and never lists a finalized level 0: neither occurs
here, so v3 and v4 carry the same features.)
"""

from __future__ import annotations

from typing import Any

from kio.schema.api_versions.v0 import response as v0
from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import REGISTRY, api
from stonemq.protocol.codec import EncodedOnce

SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {"metadata.version": (7, 25)}
"""Feature name -> (lowest, highest) level this broker supports (none starts at level 0)."""
FINALIZED_FEATURES: dict[str, int] = {"metadata.version": 25}
"""Feature name -> the level finalized for the cluster (none is 0)."""
FINALIZED_FEATURES_EPOCH = 0
FIRST_VERSION_WITH_FEATURES = 3


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


_KEPT: dict[tuple[int, int], EncodedOnce] = {}
"""The answer per (api version, APIs registered): it never changes while the broker runs, so
it is built and encoded once and every request gets it behind its own correlation id (building
and encoding the list of every API took about 0.25 ms of the event loop per request)."""


@api(18, 0, 4)
async def handle_api_versions(ctx: RequestContext, request: Any) -> Any:
    key = (ctx.api_version, len(REGISTRY))
    kept = _KEPT.get(key)
    if kept is None:
        kept = _KEPT[key] = EncodedOnce(_build(ctx))
    ctx.reuse = kept
    return kept.response


def _build(ctx: RequestContext) -> Any:
    features: dict[str, Any] = {}
    if ctx.api_version >= FIRST_VERSION_WITH_FEATURES:
        features = {
            "supported_features": tuple(
                ctx.build("SupportedFeatureKey", name=name, min_version=lo, max_version=hi)
                for name, (lo, hi) in SUPPORTED_FEATURES.items()
            ),
            "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
            "finalized_features": tuple(
                ctx.build(
                    "FinalizedFeatureKey",
                    name=name,
                    min_version_level=level,
                    max_version_level=level,
                )
                for name, level in FINALIZED_FEATURES.items()
            ),
        }
    return ctx.build(
        "ApiVersionsResponse",
        error_code=ErrorCode.none,
        api_keys=tuple(
            ctx.build("ApiVersion", api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in _ranges()
        ),
        throttle_time=0,
        zk_migration_ready=False,
        **features,
    )
