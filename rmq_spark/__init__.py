"""rmq-spark: Spark source/sink, client and CLI for the rmq message log."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["__version__", "register"]
__version__ = "0.1.0"


def register(spark: "SparkSession") -> None:
    """Register the ``rocketmq`` data source with ``spark`` explicitly.

    Not needed when the package is installed (Spark finds ``pyspark_rocketmq``
    by itself); useful when it is only on the driver's ``sys.path``.
    """
    try:
        from .datasource import RocketMQDataSource
    except ImportError as e:
        raise ImportError("rmq_spark.register needs pyspark: pip install 'rmq-spark[spark]'") from e
    spark.dataSource.register(RocketMQDataSource)
