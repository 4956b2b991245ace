"""A local cluster for one machine: N node processes on loopback (``rmq-storage local``,
``make demo``, the tests and the benchmarks)."""
from .cluster import LocalCluster
from .ports import ephemeral_port_range, free_port_block

__all__ = ["LocalCluster", "ephemeral_port_range", "free_port_block"]
