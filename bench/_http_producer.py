"""A producer over the nodes' HTTP/JSON API (``POST /v1/topics/T/messages``), shaped
like ``Client.produce`` so the produce benchmark drives it with the same loops.

As a non-Python service would call it: one keep-alive HTTP connection per
thread and node (``requests.Session``), each call a JSON body of the batch's
values as base64 (the values are binary), sent to the queue's leader (found
once from ``GET /v1/topics/T``; a moved leader answers 307 and is followed).
"""
from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass

import requests

__all__ = ["HttpProducer"]


@dataclass(frozen=True)
class Acked:
    count: int


class HttpProducer:
    def __init__(self, http_urls: list[str], topic: str, timeout: float = 30.0):
        self.timeout = timeout
        self._local = threading.local()
        d = self._session().get(f"{http_urls[0]}/v1/topics/{topic}", timeout=timeout)
        d.raise_for_status()
        by_grpc = {}
        for q in d.json()["queues"]:
            host, port = q["leader"].rsplit(":", 1)
            by_grpc[q["queue"]] = f"http://{host}:{int(port) + 4}"
        self.leader_url = by_grpc

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def produce(self, topic: str, values: list[bytes], queue: int) -> Acked:
        body = json.dumps({"queue": queue, "messages": [
            {"value": {"base64": base64.b64encode(v).decode("ascii")}} for v in values]})
        r = self._session().post(f"{self.leader_url[queue]}/v1/topics/{topic}/messages", data=body,
                                 headers={"Content-Type": "application/json"}, timeout=self.timeout)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP produce: {r.status_code} {r.text[:300]}")
        return Acked(sum(x["count"] for x in r.json()["results"]))
