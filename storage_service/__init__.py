"""The rmq storage service: a multi-raft replicated message log served over gRPC."""

__all__ = ["__version__"]
__version__ = "0.1.0"
