"""Spark's static lookup of Python data sources imports every top-level
``pyspark_*`` module and registers its ``DefaultSource``: this one makes
``format("rocketmq")`` work in any SparkSession, with no register call."""
from rmq_spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
