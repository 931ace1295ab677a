"""Spark's automatic lookup of Python data sources: PySpark imports every top-level module
named ``pyspark_*`` and registers its ``DefaultSource``; this one is ``format("stonemq")``."""

from stonemq.spark.source import StoneMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
