"""The cluster layer: brokers coordinated through ZooKeeper (membership now; the controller,
leadership and journal replication build on it: see docs/architecture.md). Importing this
package loads no ZooKeeper client: a single node never does."""


class ClusterStartError(Exception):
    """This broker cannot join the cluster ``zookeeper.connect`` names."""
