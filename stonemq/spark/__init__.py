"""StoneMQ for Spark: the ``stonemq`` Python data source (Spark 4's Data Source API), Spark's
Kafka source and sink without a connector jar, reading archived offsets from Parquet.

    from stonemq.spark import register
    register(spark)
    spark.read.format("stonemq").option("kafka.bootstrap.servers", "host:9092")...

Installed with ``stonemq[tier]``, the source is also found by Spark on its own (the
``pyspark_stonemq`` module), so ``register`` is only needed where that lookup is off (or
to turn on Spark's filter pushdown for Python data sources, ``filter_pushdown=True``).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any, filter_pushdown: bool = False) -> None:
    """Register ``format("stonemq")`` with ``spark`` (a SparkSession). ``filter_pushdown``
    also turns on Spark's filter pushdown for Python data sources
    (``spark.sql.python.filterPushdown.enabled``, session-wide), which a read that asks for
    pruning (``stonemq.filterPushdown=true``) needs; see the README for why that is opt-in."""
    from stonemq.spark.source import StoneMQDataSource

    spark.dataSource.register(StoneMQDataSource)
    if filter_pushdown:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
