#!/usr/bin/env python
"""S3 requests a tiering micro-batch makes, counted by the S3 server itself.

    .venv/bin/python bench/s3_requests.py

A 3-node LocalCluster and moto's S3 server on loopback (``tests/s3server.py``:
every request it answers is a line of its access log). For each archive
format and checkpoint place (on S3 beside the archive, or a local disk): a
topic of 4 queues is tiered once (job start, table creation), then 2,400 more
messages are tiered by one run of 1 micro-batch and by one run of 6
(``max_offsets_per_trigger``). A run's requests minus the one-batch run's,
divided by the extra batches, is what each further batch of a running job
costs. The table goes to stdout; progress to stderr.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile

from spark_read import compile_sources  # also puts the checkout on sys.path

log = logging.getLogger("bench.s3_requests")
QUEUES, PER_QUEUE, BATCHES = 4, 600, 6


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    compile_sources()
    from tests.s3server import S3Server

    with tempfile.TemporaryDirectory(prefix="rmq-bench-s3req-") as root:
        server = S3Server.start(os.path.join(root, "s3"))
        server.export()                       # before Spark starts
        server.create_bucket("bench")
        try:
            rows = measure(root, server)
        finally:
            server.stop()
    head = f"{'archive':<9}{'checkpoint':<12}{'1-batch run':>12}{f'{BATCHES}-batch run':>13}{'per batch':>11}"
    print(head)
    print("-" * len(head))
    for fmt, ck, one, many in rows:
        print(f"{fmt:<9}{ck:<12}{one:>12,}{many:>13,}{(many - one) / (BATCHES - 1):>11.0f}")
    return 0


def measure(root: str, server) -> list[tuple[str, str, int, int]]:
    from rmq_spark.client import Client, Message
    from rmq_spark.spark import session_builder
    from rmq_spark.tiering import tier_topic
    from storage_service.local import LocalCluster

    spark = session_builder("bench-s3-requests", master="local[2]").config("spark.ui.enabled", "false") \
        .getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out = []
    try:
        with LocalCluster(nodes=3, groups=2, data_dir=os.path.join(root, "nodes")) as c, \
                Client(c.endpoints) as client:
            def fill(topic: str) -> None:
                for q in range(QUEUES):
                    client.produce(topic, [Message(b"x" * 100) for _ in range(PER_QUEUE)], queue=q)

            for fmt in ("delta", "parquet"):
                for ck in ("s3", "local"):
                    counts = {}
                    for n in (1, BATCHES):
                        t = f"{fmt}-{ck}-{n}"
                        client.create_topic(t, queues=QUEUES)
                        kw = {"checkpoint": os.path.join(root, "ck-" + t)} if ck == "local" else {}
                        fill(t)
                        tier_topic(spark, c.endpoints, t, archive=f"s3a://bench/{t}", format=fmt, **kw)
                        fill(t)
                        before = server.requests()
                        q = tier_topic(spark, c.endpoints, t,
                                       max_offsets_per_trigger=QUEUES * PER_QUEUE // n, **kw)
                        counts[n] = server.requests() - before
                        log.info("%s: a run of %d batch(es): %d requests", t, len(q.recentProgress),
                                 counts[n])
                    out.append((fmt, "on S3" if ck == "s3" else "local disk", counts[1], counts[BATCHES]))
    finally:
        spark.stop()
    return out


if __name__ == "__main__":
    sys.exit(main())
