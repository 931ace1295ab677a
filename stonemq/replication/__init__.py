"""Journal-partition replication: the replica manager (leadership, HW, delayed produce, ISR)
and the follower's fetchers. Used only by cluster brokers (``zookeeper.connect``)."""
