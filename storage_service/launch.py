"""``rmq-storage``'s entry point: the storage node's CLI (``cli.py``), or, where
the server's own packages are not installed (``pip install rmq-spark`` is the client,
the CLI and the Spark connector), a message saying how to get them."""
from __future__ import annotations

import sys

__all__ = ["SERVER_PACKAGES", "main"]

# The packages of `rmq-spark[server]` (setup.py), by import name.
SERVER_PACKAGES = ("pysyncobj", "aiohttp", "prometheus_client", "jwt", "cryptography")


def main(argv=None):
    try:
        from .cli import main as node_main
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        print(f"rmq-storage: the storage service needs the server's packages ({e.name} is not installed): "
              "pip install 'rmq-spark[server]'", file=sys.stderr)
        return 2
    return node_main(argv)
