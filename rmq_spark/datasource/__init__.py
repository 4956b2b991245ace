"""The ``rocketmq`` Spark data source (batch + streaming reader and writer).

``format("rocketmq")`` works without registration once the package is
installed (the top-level module ``pyspark_rocketmq`` exposes it to Spark's
static lookup); ``rmq_spark.register(spark)`` registers it explicitly.
Needs the ``spark`` extra (pyspark).
"""
from ._source import RocketMQDataSource
from .errors import ConnectorError, DataLossError, OptionError, SinkError

__all__ = ["RocketMQDataSource", "ConnectorError", "OptionError", "DataLossError", "SinkError"]
