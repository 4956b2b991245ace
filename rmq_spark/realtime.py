"""Real-time mode (Spark 4.2's ``trigger(realTime=...)``) with rmq-spark topics (issue 41).

Reading: ``spark.readStream.format("rocketmq-rt")``, the JVM source (jars/src), which
real-time mode accepts. Writing: real-time mode refuses the ``format("rocketmq")``
sink (and ``foreachBatch``); ``to_rocketmq`` attaches the JVM ``ForeachWriter`` we ship
instead, exactly once across task retries and query restarts::

    from rmq_spark.realtime import to_rocketmq
    query = to_rocketmq(df.writeStream.outputMode("update").trigger(realTime="5 seconds")
                          .option("checkpointLocation", path), endpoints, "orders-copy").start()
"""
from __future__ import annotations

__all__ = ["to_rocketmq"]


def to_rocketmq(writer, endpoints: str, topic: str, *, token: str | None = None,
                idempotence_key: str | None = None, tls_ca_file: str | None = None,
                tls_cert_file: str | None = None, tls_key_file: str | None = None):
    """``writer`` (a ``DataStreamWriter``) with its rows going to ``topic``: columns ``value``
    (required), optional ``key``, ``tags``, ``properties``, ``queue``, as the
    ``format("rocketmq")`` sink takes them. Each task writes as producer
    ``{idempotence_key or the query id}-{partition}`` with sequences from the batch id
    and each row's position in its queue, so a replayed batch stores nothing twice.
    On a cluster with TLS, ``tls_ca_file`` is its CA (PEM; the nodes' HTTPS) and
    ``token`` a principal's bearer token with ``produce`` on the topic, or
    ``tls_cert_file`` and ``tls_key_file`` (PEM) a client certificate whose CN is
    that principal (nodes started with ``--tls-client-cert`` take it alone).
    Returns ``writer``, to ``start()``."""
    jvm = writer._spark._sc._jvm
    sink = jvm.io.rmqspark.spark.RocketMQWriter(endpoints, topic, token, idempotence_key, tls_ca_file,
                                                 tls_cert_file, tls_key_file)
    writer._jwrite = writer._jwrite.foreach(sink)
    return writer
