"""The Spark source and sink against a cluster with TLS (issue 22, first part):
``tlsCaFile`` (and a client certificate where nodes require one)."""
from __future__ import annotations

import pytest

from rmq_spark.client import Client
from storage_service.local import LocalCluster

from ._helpers import Batches

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    c = LocalCluster(nodes=3, groups=2, data_dir=str(tmp_path_factory.mktemp("spark-tls")), secure=True,
                     extra_args=["--tls-client-cert"])     # clients need a certificate too (mTLS)
    c.start()
    yield c
    c.stop()


def _tls_options(c) -> dict[str, str]:
    return {"endpoints": c.endpoints, "tlsCaFile": c.tls.ca, "tlsCertFile": c.tls.cert,
            "tlsKeyFile": c.tls.key}


def test_read_write_and_stream_over_tls(spark, secure, tmp_path):
    with Client(secure.endpoints, tls=secure.tls) as c:
        c.create_topic("spark-tls", queues=2)
    opts = _tls_options(secure)
    rows = spark.createDataFrame([(f"v{i}", i % 2) for i in range(40)], "value string, queue int")
    rows.write.format("rocketmq").options(**opts, topic="spark-tls").mode("append").save()

    got = spark.read.format("rocketmq").options(**opts, topic="spark-tls").load()
    assert sorted(bytes(r.value).decode() for r in got.select("value").collect()) == \
        sorted(f"v{i}" for i in range(40))

    batches = Batches()
    q = (spark.readStream.format("rocketmq").options(**opts, topic="spark-tls",
                                                     startingOffsets="earliest").load()
         .writeStream.foreachBatch(batches).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    q.awaitTermination(120)
    assert sorted(bytes(v).decode() for v in batches.all()) == sorted(f"v{i}" for i in range(40))
    # the options are paths, never key material, in the plan
    plan = got._jdf.queryExecution().toString()
    with open(secure.tls.key) as f:
        assert f.read().splitlines()[1] not in plan


def test_tls_options_are_checked_on_the_driver(spark, secure, tmp_path):
    from pyspark.errors import PySparkException
    base = {"endpoints": secure.endpoints, "topic": "spark-tls"}
    for extra, text in (({"tlsCaFile": str(tmp_path / "missing.pem")}, "tlsCaFile"),
                        ({"tlsCertFile": secure.tls.cert, "tlsKeyFile": secure.tls.key}, "tlsCaFile"),
                        ({"tlsCaFile": secure.tls.ca, "tlsCertFile": secure.tls.cert}, "tlsKeyFile")):
        with pytest.raises(PySparkException, match=text):
            spark.read.format("rocketmq").options(**base, **extra).load().count()


def test_tiering_and_compaction_jobs_over_tls(spark, secure, tmp_path):
    from rmq_spark.client import Message
    from rmq_spark.compaction import CompactedTable, compact_topic
    from rmq_spark.tiering import tier_topic
    with Client(secure.endpoints, tls=secure.tls) as c:
        c.create_topic("tier-tls", queues=2)
        c.create_topic("compact-tls", queues=2, cleanup_policy="compact")
        for q in range(2):
            c.produce("tier-tls", [f"t{q}-{i}".encode() for i in range(10)], queue=q)
            c.produce("compact-tls", [Message(f"v{i}".encode(), key=f"k{q}".encode())
                                      for i in range(3)], queue=q)
        q = tier_topic(spark, secure.endpoints, "tier-tls", archive=str(tmp_path / "archive"),
                       tls=secure.tls)
        assert not q.isActive
        assert spark.read.format("delta").load(str(tmp_path / "archive")).count() == 20
        assert all(i["archived"] == 10 for i in c.describe_topic("tier-tls")["queue_info"])
        q = compact_topic(spark, secure.endpoints, "compact-tls", table=str(tmp_path / "table"),
                          tls=secure.tls)
        assert not q.isActive
        table = CompactedTable(str(tmp_path / "table"))
        assert table.get(b"k0").value == b"v2" and table.get(b"k1").value == b"v2"
