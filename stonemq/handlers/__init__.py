"""Kafka API handlers, one module per API family; importing this package registers them all."""

from stonemq.handlers import (  # noqa: F401  (imported for registration)
    admin,
    api_versions,
    delete_records,
    fetch,
    groups,
    list_offsets,
    metadata,
    offsets,
    produce,
    producer_ids,
)
from stonemq.handlers.registry import REGISTRY, ApiSpec, api

__all__ = ["REGISTRY", "ApiSpec", "api"]
