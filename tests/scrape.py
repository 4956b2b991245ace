"""Read a node's /metrics with prometheus_client's own parser."""
from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from storage_service.protocol.placement import http_address

__all__ = ["scrape", "series", "total"]


def scrape(cluster, i: int, timeout: float = 30) -> dict:
    """Node ``i``'s /metrics: {(sample name, ((label, value), ...)): value}."""
    r = requests.get(f"http://{http_address(cluster.addresses[i])}/metrics", timeout=timeout)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(cluster, name: str, **labels) -> list[tuple[dict, float]]:
    """Every node's samples of ``name`` whose labels include ``labels``: [(labels, value)]."""
    want = set(labels.items())
    return [(dict(lab), v) for i in range(len(cluster.addresses)) for (n, lab), v in scrape(cluster, i).items()
            if n == name and want <= set(lab)]


def total(cluster, name: str, **labels) -> float:
    """A sample summed over every node (series matching ``labels``)."""
    return sum(v for _, v in series(cluster, name, **labels))
