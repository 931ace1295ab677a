"""Authorized operations (KIP-430): the bit sets Metadata, DescribeCluster, DescribeGroups and
DescribeTopicPartitions answer when a client asks which operations it may perform.

With no authorizer configured Kafka allows everything, and answers every operation its ACLs
support for the resource type (``AclEntry.supportedOperations``), one bit per ``AclOperation``
code. StoneMQ has no authorizer, so these are always the answers. A client that did not ask
gets ``UNKNOWN_AUTHORIZED_OPERATIONS``, Kafka's "not requested" value.
"""

from __future__ import annotations

UNKNOWN_AUTHORIZED_OPERATIONS = -(2**31)

# Kafka's AclOperation codes
READ = 3
WRITE = 4
CREATE = 5
DELETE = 6
ALTER = 7
DESCRIBE = 8
CLUSTER_ACTION = 9
DESCRIBE_CONFIGS = 10
ALTER_CONFIGS = 11
IDEMPOTENT_WRITE = 12


def bit_set(*operations: int) -> int:
    """Kafka's ``Utils.to32BitField``: bit ``code`` set for each operation."""
    return sum(1 << op for op in set(operations))


TOPIC_AUTHORIZED_OPERATIONS = bit_set(
    READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS
)
GROUP_AUTHORIZED_OPERATIONS = bit_set(READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
CLUSTER_AUTHORIZED_OPERATIONS = bit_set(
    CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE
)


def topic_operations(requested: bool) -> int:
    return TOPIC_AUTHORIZED_OPERATIONS if requested else UNKNOWN_AUTHORIZED_OPERATIONS


def cluster_operations(requested: bool) -> int:
    return CLUSTER_AUTHORIZED_OPERATIONS if requested else UNKNOWN_AUTHORIZED_OPERATIONS


def group_operations(requested: bool) -> int:
    return GROUP_AUTHORIZED_OPERATIONS if requested else UNKNOWN_AUTHORIZED_OPERATIONS
