"""A node's Prometheus metrics: counted as requests pass (``requests.py``), and
read from the node's state when scraped (``state.py``)."""
from .requests import NodeMetrics

__all__ = ["NodeMetrics"]
