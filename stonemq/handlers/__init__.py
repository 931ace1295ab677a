"""Kafka API handlers, one module per API family; importing this package registers them all."""

from stonemq.handlers import (  # noqa: F401  (imported for registration)
    admin,
    api_versions,
    client_quotas,
    delete_records,
    describe_producers,
    describe_topic_partitions,
    fetch,
    groups,
    leader_epochs,
    list_offsets,
    log_dirs,
    metadata,
    offsets,
    partitions_admin,
    produce,
    producer_ids,
)
from stonemq.handlers.registry import REGISTRY, ApiSpec, api

__all__ = ["REGISTRY", "ApiSpec", "api"]
