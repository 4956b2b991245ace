"""A node's HTTP port: the JSON API, /metrics and the status page (``server.py``)."""
