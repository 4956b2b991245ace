"""The Spark source and sink, and the tiering and compaction jobs, against a secured
cluster (issue 22): TLS (``tlsCaFile``) and a bearer token (``token``/``tokenFile``)
of a principal with exactly the ACLs it needs; the token never shows in plans,
streaming progress or the event log."""
from __future__ import annotations

import glob
import json
import os

import pytest

from rmq_spark.client import Client, TlsFiles

from ._helpers import Batches

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def admin(secure):
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token) as c:
        yield c


@pytest.fixture(scope="module")
def app(admin, tmp_path_factory):
    """A principal allowed to produce to and consume the sp- topics, and its token file."""
    p = admin.create_principal("spark-app")
    admin.change_acls(True, [dict(principal="spark-app", resource_type="topic", name="sp-", prefix=True,
                                  operations=["produce", "consume"])])
    path = tmp_path_factory.mktemp("app") / "app.token"
    path.write_text(p["token"] + "\n")
    return p["token"], str(path)


def _event_log_text(spark) -> str:
    d = spark.sparkContext.getConf().get("spark.eventLog.dir").replace("file:", "")
    text = ""
    for f in glob.glob(os.path.join(d, "**"), recursive=True):     # Spark 4: a folder of rolling files
        if not os.path.isfile(f):
            continue
        with open(f, errors="replace") as fh:
            text += fh.read()
    return text


def test_read_write_and_stream_over_tls_with_a_token(spark, secure, admin, app, tmp_path):
    token, token_file = app
    admin.create_topic("sp-tls", queues=2)
    rows = spark.createDataFrame([(f"v{i}", i % 2) for i in range(40)], "value string, queue int")
    (rows.write.format("rocketmq").options(endpoints=secure.endpoints, tlsCaFile=secure.tls.ca,
                                           tokenFile=token_file, topic="sp-tls").mode("append").save())
    opts = {"endpoints": secure.endpoints, "tlsCaFile": secure.tls.ca, "token": token}
    got = spark.read.format("rocketmq").options(**opts, topic="sp-tls").load()
    assert sorted(bytes(r.value).decode() for r in got.select("value").collect()) == \
        sorted(f"v{i}" for i in range(40))

    batches = Batches()
    q = (spark.readStream.format("rocketmq").options(**opts, topic="sp-tls", startingOffsets="earliest")
         .load().writeStream.foreachBatch(batches).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    q.awaitTermination(120)
    assert sorted(bytes(v).decode() for v in batches.all()) == sorted(f"v{i}" for i in range(40))
    # the token is nowhere a user or a log would show it
    shown = [got._jdf.queryExecution().toString(), got._sc._jvm.PythonSQLUtils.explainString(
        got._jdf.queryExecution(), "extended"), json.dumps(q.recentProgress, default=str)]
    assert all(token not in text for text in shown)
    log = _event_log_text(spark)
    assert "sp-tls" in log                          # the log has this query's events ...
    assert token not in log                         # ... but not its token
    assert token.split(".")[2] not in log           # (nor its signature alone)


def test_a_principal_without_the_acl_is_refused_and_nothing_is_written(spark, secure, admin, app):
    token, _ = app
    admin.create_topic("other-topic", queues=1)
    from pyspark.errors import PySparkException
    opts = {"endpoints": secure.endpoints, "tlsCaFile": secure.tls.ca, "token": token}
    with pytest.raises(PySparkException, match="'spark-app' may not describe topic 'other-topic'"):
        spark.read.format("rocketmq").options(**opts, topic="other-topic").load().count()
    rows = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(PySparkException, match="'spark-app' may not describe topic 'other-topic'"):
        rows.write.format("rocketmq").options(**opts, topic="other-topic").mode("append").save()
    assert [o.latest for o in admin.offsets("other-topic")] == [0]
    with pytest.raises(PySparkException, match="UNAUTHENTICATED|needs credentials|Unauthenticated"):
        spark.read.format("rocketmq").options(endpoints=secure.endpoints, tlsCaFile=secure.tls.ca,
                                              topic="sp-tls").load().count()
    # a wrong token: the node's reason and where a valid token comes from, source and sink
    wrong = {"endpoints": secure.endpoints, "tlsCaFile": secure.tls.ca, "token": "not-a-jwt", "topic": "sp-tls"}
    says = "not a token of this cluster.*rmq principal create"
    with pytest.raises(PySparkException, match=says):
        spark.read.format("rocketmq").options(**wrong).load().count()
    with pytest.raises(PySparkException, match=says):
        rows.write.format("rocketmq").options(**wrong).mode("append").save()
    assert [o.latest for o in admin.offsets("other-topic")] == [0]


def test_tls_and_token_options_are_checked_on_the_driver(spark, secure, tmp_path):
    from pyspark.errors import PySparkException
    base = {"endpoints": secure.endpoints, "topic": "sp-tls"}
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    for extra, text in (({"tlsCaFile": str(tmp_path / "missing.pem")}, "tlsCaFile"),
                        ({"tlsCertFile": secure.tls.cert, "tlsKeyFile": secure.tls.key}, "tlsCaFile"),
                        ({"tlsCaFile": secure.tls.ca, "tlsCertFile": secure.tls.cert}, "tlsKeyFile"),
                        ({"token": "t", "tokenFile": str(empty)}, "not both"),
                        ({"tokenFile": str(tmp_path / "missing.token")}, "tokenFile"),
                        ({"tokenFile": str(empty)}, "is empty")):
        with pytest.raises(PySparkException, match=text):
            spark.read.format("rocketmq").options(**base, **extra).load().count()


def test_tiering_and_compaction_jobs_with_a_token(spark, secure, admin, tmp_path):
    from rmq_spark.client import Message
    from rmq_spark.compaction import CompactedTable, compact_topic
    from rmq_spark.tiering import tier_topic
    jobs = admin.create_principal("jobs")
    admin.change_acls(True, [dict(principal="jobs", resource_type="topic", name=t,
                                  operations=["consume", "alter"]) for t in ("tier-tls", "compact-tls")])
    admin.create_topic("tier-tls", queues=2)
    admin.create_topic("compact-tls", queues=2, cleanup_policy="compact")
    for q in range(2):
        admin.produce("tier-tls", [f"t{q}-{i}".encode() for i in range(10)], queue=q)
        admin.produce("compact-tls", [Message(f"v{i}".encode(), key=f"k{q}".encode())
                                      for i in range(3)], queue=q)
    ca = TlsFiles(secure.tls.ca)
    q = tier_topic(spark, secure.endpoints, "tier-tls", archive=str(tmp_path / "archive"), tls=ca,
                   token=jobs["token"])
    assert not q.isActive
    assert spark.read.format("delta").load(str(tmp_path / "archive")).count() == 20
    assert all(i["archived"] == 10 for i in admin.describe_topic("tier-tls")["queue_info"])
    q = compact_topic(spark, secure.endpoints, "compact-tls", table=str(tmp_path / "table"), tls=ca,
                      token=jobs["token"])
    assert not q.isActive
    table = CompactedTable(str(tmp_path / "table"))
    assert table.get(b"k0").value == b"v2" and table.get(b"k1").value == b"v2"
    assert all(i["compacted"] == 3 for i in admin.describe_topic("compact-tls")["queue_info"])


def test_the_real_time_source_and_sink_over_https_with_a_token(spark, secure, admin, app, tmp_path):
    """format("rocketmq-rt") and the JVM sink (rmq_spark.realtime.to_rocketmq) on a secured
    cluster: HTTPS checked against the cluster's CA (tlsCaFile), the principal's token
    (tokenFile, read on the driver), or a client certificate (tlsCertFile, tlsKeyFile). A
    real-time copy gives every message once; without the CA, or with a token that may not
    consume, the query fails saying why."""
    import time

    from rmq_spark.client import Message
    from rmq_spark.realtime import to_rocketmq

    token, token_file = app
    admin.create_topic("sp-rt-src", queues=2)
    admin.create_topic("sp-rt-dst", queues=2)
    for q in (0, 1):
        admin.produce("sp-rt-src", [Message(b"s-%d-%d" % (q, i), key=b"k-%d-%d" % (q, i)) for i in range(10)], queue=q)

    def source(**opts):
        r = spark.readStream.format("rocketmq-rt").option("endpoints", secure.endpoints) \
            .option("topic", "sp-rt-src").option("startingOffsets", "earliest")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()
    rows = source(tlsCaFile=secure.tls.ca, tokenFile=token_file).select("key", "value")
    # the sink shows a client certificate instead of a token: the principal is its CN (admin)
    query = to_rocketmq(rows.writeStream.outputMode("update").trigger(realTime="5 seconds")
                        .option("checkpointLocation", str(tmp_path / "chk")), secure.endpoints, "sp-rt-dst",
                        tls_ca_file=secure.tls.ca, tls_cert_file=secure.tls.cert,
                        tls_key_file=secure.tls.key).start()
    try:
        deadline = time.monotonic() + 120
        while sum(o.latest for o in admin.offsets("sp-rt-dst")) < 20 and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        query.stop()
    copied = sorted(r.value for q in (0, 1) for r in admin.fetch("sp-rt-dst", q, 0).records)
    assert copied == sorted(b"s-%d-%d" % (q, i) for q in (0, 1) for i in range(10))
    by_cert = source(tlsCaFile=secure.tls.ca, tlsCertFile=secure.tls.cert, tlsKeyFile=secure.tls.key) \
        .writeStream.format("memory").queryName("rt_by_cert").trigger(availableNow=True).start()
    by_cert.awaitTermination(120)
    assert by_cert.exception() is None
    assert spark.sql("select count(*) from rt_by_cert").collect()[0][0] == 20
    # no CA: plain HTTP to the nodes' HTTPS ports, refused; no token: not authenticated
    for opts, says in (({"token": token}, "a cluster with TLS takes HTTPS only: give tlsCaFile"),
                       ({"tlsCaFile": secure.tls.ca}, "UNAUTHENTICATED")):
        q = source(**opts).writeStream.format("memory").queryName("rt_refused_" + str(len(opts))) \
            .trigger(availableNow=True).start()
        with pytest.raises(Exception, match=says):
            q.awaitTermination(120)
