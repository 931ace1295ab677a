"""The API registry: which Kafka APIs the broker serves, at which versions, and by whom."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from stonemq.handlers.context import RequestContext

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    api_key: int
    min_version: int
    max_version: int
    handler: Handler


REGISTRY: dict[int, ApiSpec] = {}


def api(api_key: int, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    """Register ``handler`` for ``api_key`` at ``min_version..max_version`` (inclusive).

    The handler gets the decoded kio request of the client's version and returns the kio
    response of that same version (or None for a Produce with acks=0: no response).
    Only registered APIs are advertised in ApiVersions.
    """

    def register(handler: Handler) -> Handler:
        if api_key in REGISTRY:
            raise RuntimeError(f"api key {api_key} registered twice")
        REGISTRY[api_key] = ApiSpec(api_key, min_version, max_version, handler)
        return handler

    return register
