"""rmq-spark: Spark source/sink, client and CLI for the rmq message log."""

__all__ = ["__version__"]
__version__ = "0.1.0"
