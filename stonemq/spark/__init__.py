"""StoneMQ for Spark: the ``stonemq`` Python data source (Spark 4's Data Source API), Spark's
Kafka source and sink without a connector jar, reading archived offsets from Parquet.

    from stonemq.spark import register
    register(spark)
    spark.read.format("stonemq").option("kafka.bootstrap.servers", "host:9092")...

Installed with ``stonemq[tier]``, the source is also found by Spark on its own (the
``pyspark_stonemq`` module), so ``register`` is only needed where that lookup is off; it
also turns on Spark's filter pushdown for Python data sources.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("stonemq")`` with ``spark`` (a SparkSession)."""
    from stonemq.spark.source import StoneMQDataSource

    spark.dataSource.register(StoneMQDataSource)
    # filters on partition, offset and timestamp prune what is read (off in Spark by default)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
