"""The HTTP port (storage_service/http): /metrics scraped and parsed with
prometheus_client's parser, the JSON API against a real 3-node cluster, its
errors, its redirects from followers, and the status page in headless chromium."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest
import requests

from rmq_spark.client import Client, Message
from rmq_spark.client._messages import plain_block
from storage_service.proto import rmq_pb2
from storage_service.protocol import framing
from storage_service.protocol.placement import http_address
from tests.conftest import wait_until
from tests.scrape import scrape, total

TIMEOUT = 30
JSON = {"Content-Type": "application/json"}


def url(cluster, i: int, path: str) -> str:
    return f"http://{http_address(cluster.addresses[i])}{path}"


def http(cluster):
    return url(cluster, 0, "")


def leader_index(cluster, client, topic: str, queue: int) -> int:
    leader = client.describe_topic(topic)["queue_info"][queue]["leader"]
    return cluster.addresses.index(leader)


# ---------------------------------------------------------------- /metrics
def test_metrics_parse_and_counters_rise_by_what_was_produced(cluster, client, topic):
    before = {k: total(cluster, k) for k in ("rmq_produce_messages_total", "rmq_produce_bytes_total",
                                              "rmq_fetch_messages_total")}
    produce_calls = total(cluster, "rmq_requests_total", method="Produce", protocol="grpc", code="OK")
    batches = total(cluster, "rmq_requests_total", method="ProduceBatches", protocol="produce_port", code="OK")
    for q in range(2):                       # gRPC Produce (a request to a node not leading fails: not OK)
        client.call("Produce", rmq_pb2.ProduceRequest(topic=topic, queue=q, records=plain_block([b"x" * 100] * 25),
                                                      count=25), group=client.group_of(topic, q))
    for q in range(2, 4):                    # Client.produce: one batch over the produce port
        client.produce(topic, [b"x" * 100] * 25, queue=q)
    got = [r for q in range(4) for r in client.fetch(topic, q, 0, max_messages=1000).records]
    assert len(got) == 100
    after = {k: total(cluster, k) for k in before}
    assert after["rmq_produce_messages_total"] - before["rmq_produce_messages_total"] == 100
    assert after["rmq_produce_bytes_total"] - before["rmq_produce_bytes_total"] >= 100 * 100
    assert after["rmq_fetch_messages_total"] - before["rmq_fetch_messages_total"] >= 100
    assert total(cluster, "rmq_requests_total", method="Produce", protocol="grpc", code="OK") - produce_calls == 2
    # (a batch sent to a node that has just lost the lead is answered OK with a NOT_LEADER
    # outcome, and sent again: at least one request each)
    assert total(cluster, "rmq_requests_total", method="ProduceBatches", protocol="produce_port",
                 code="OK") - batches >= 2
    names = {n for i in range(3) for n, _ in scrape(cluster, i)}
    for expected in ("rmq_request_duration_seconds_bucket", "rmq_raft_term", "rmq_raft_commit_index",
                     "rmq_raft_applied_index", "rmq_raft_leader", "rmq_raft_journal_fsync_seconds_count",
                     "rmq_raft_snapshots_total", "rmq_process_resident_memory_bytes",
                     "rmq_process_open_fds", "rmq_process_cpu_seconds_total", "rmq_topic_bytes",
                     "rmq_thread_cpu_seconds_total", "python_gc_collections_total"):
        assert expected in names, expected
    # CPU by thread role: the raft loop and its syncer are there, by role, on every node
    for i in range(3):
        roles = {dict(lab)["thread"]: v for (n, lab), v in scrape(cluster, i).items()
                 if n == "rmq_thread_cpu_seconds_total"}
        assert {"raft-node", "raft-node-sync", "segment-sync"} <= set(roles), roles
        assert roles["raft-node"] > 0, roles
    # every raft group has exactly one leader among the nodes' views
    leaders = {}
    for i in range(3):
        for (n, lab), v in scrape(cluster, i).items():
            if n == "rmq_raft_leader":
                leaders[dict(lab)["group"]] = leaders.get(dict(lab)["group"], 0) + v
    assert leaders and all(v == 1 for v in leaders.values()), leaders
    # each queue is reported once, by its group's leader
    latest = {dict(lab)["queue"]: v for i in range(3) for (n, lab), v in scrape(cluster, i).items()
              if n == "rmq_queue_latest_offset" and dict(lab)["topic"] == topic}
    assert latest == {"0": 25, "1": 25, "2": 25, "3": 25}


def test_the_lag_metric_equals_rmq_offsets(cluster, client, topic):
    for q in range(4):
        client.produce(topic, [b"m"] * (10 + q), queue=q)
    client.commit_offsets("lagging", topic, {0: 4, 2: 12})
    out = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", cluster.endpoints,
                          "offsets", topic, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    want = {q: v["lag"] for q, v in json.loads(out.stdout)["consumer_groups"]["lagging"].items()}
    assert want == {"0": 6, "1": 11, "2": 0, "3": 13}

    def metric():
        return {dict(lab)["queue"]: v for i in range(3) for (n, lab), v in scrape(cluster, i).items()
                if n == "rmq_consumer_group_lag_messages" and dict(lab)["topic"] == topic
                and dict(lab)["consumer_group"] == "lagging"}
    wait_until(lambda: metric() == want, timeout=10, what=f"lag metric {metric()} == rmq offsets {want}")
    assert total(cluster, "rmq_consumer_group_topic_lag_messages", topic=topic,
                 consumer_group="lagging") == sum(want.values())


# ---------------------------------------------------------------- JSON API
def test_http_produce_and_fetch_round_trip_with_binary_values(cluster, client, topic):
    binary = bytes(range(256))
    msgs = [{"value": "plain text", "key": "k1", "tags": "TagA", "properties": {"p": "v"}},
            {"value": {"base64": base64.b64encode(binary).decode()}, "key": {"base64": "/w=="}},
            {"value": None, "key": "gone"},                     # a tombstone
            {"value": ""}]
    r = requests.post(url(cluster, 0, f"/v1/topics/{topic}/messages"), json={"messages": msgs, "queue": 2},
                      timeout=TIMEOUT)                          # followed to the leader if need be
    assert r.status_code == 200, r.text
    [res] = r.json()["results"]
    assert (res["queue"], res["base_offset"], res["count"]) == (2, 0, 4)
    r = requests.get(url(cluster, 1, f"/v1/topics/{topic}/queues/2/messages?offset=0&max=10"), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    body = r.json()
    got = body["messages"]
    assert [m["offset"] for m in got] == [0, 1, 2, 3]
    assert got[0]["value"] == "plain text" and got[0]["key"] == "k1" and got[0]["tags"] == "TagA"
    assert got[0]["properties"] == {"p": "v"}
    assert base64.b64decode(got[1]["value"]["base64"]) == binary and got[1]["key"] == {"base64": "/w=="}
    assert got[2]["value"] is None and got[2]["key"] == "gone"
    assert got[3]["value"] == ""
    assert body["next_offset"] == 4 and body["latest"] == 4
    # the gRPC client reads the same messages
    recs = client.fetch(topic, 2, 0).records
    assert recs[1].value == binary and recs[2].value is None and recs[0].properties == {"p": "v"}
    # encoding=base64: every value as base64; max and offset page through
    r = requests.get(url(cluster, 0, f"/v1/topics/{topic}/queues/2/messages?offset=1&max=1&encoding=base64"),
                     timeout=TIMEOUT)
    assert [m["offset"] for m in r.json()["messages"]] == [1]
    assert r.json()["next_offset"] >= 2
    # encoding=batches: the stored batches as they are, where to go on in headers
    r = requests.get(url(cluster, 1, f"/v1/topics/{topic}/queues/2/messages?offset=1&encoding=batches"),
                     timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/x-rmq-batches", r.text
    assert (r.headers["X-Rmq-Next-Offset"], r.headers["X-Rmq-Latest"]) == ("4", "4")
    heads = list(framing.iter_batches(r.content))           # CRCs checked
    assert [h.base_offset for h in heads] == [0] and heads[0].count == 4   # from its batch's start
    r = requests.get(url(cluster, 0, f"/v1/topics/{topic}/queues/2/messages?offset=0&encoding=json"),
                     timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["field"] == "encoding"
    assert "auto (text when UTF-8), base64, or batches" in r.json()["error"]["message"]
    # a plain array goes to a queue the service picks (by key hash)
    r = requests.post(url(cluster, 2, f"/v1/topics/{topic}/messages"), json=[{"value": "a", "key": "x"}],
                      timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["results"][0]["count"] == 1


def test_topics_and_consumer_group_offsets_over_http(cluster, client):
    r = requests.post(url(cluster, 1, "/v1/topics"), json={"name": "http-made", "queues": 3,
                                                           "retention_ms": 3_600_000}, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    assert r.json()["queues"] == 3 and r.json()["retention_ms"] == 3_600_000
    assert "http-made" in [t["name"] for t in requests.get(url(cluster, 2, "/v1/topics"),
                                                           timeout=TIMEOUT).json()["topics"]]
    client.produce("http-made", [b"1", b"2", b"3"], queue=1)
    # (describe reads the asked node's own replica of each group: a follower's may be a moment behind)
    d = wait_until(lambda: (lambda d: d if d["queues"][1]["latest"] == 3 else None)(
        requests.get(url(cluster, 0, "/v1/topics/http-made"), timeout=TIMEOUT).json()), timeout=10,
        what="describe to show the produce")
    assert d["config"]["name"] == "http-made"
    assert [(q["queue"], q["latest"]) for q in d["queues"]] == [(0, 0), (1, 3), (2, 0)]
    assert all(q["leader"] for q in d["queues"])
    path = "/v1/consumer-groups/g-http/topics/http-made/offsets"
    r = requests.post(url(cluster, 2, path), json={"offsets": {"1": 2}}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert client.committed_offsets("g-http", "http-made") == {1: 2}
    got = requests.get(url(cluster, 1, path), timeout=TIMEOUT).json()
    assert [(q["queue"], q["committed"], q["lag"]) for q in got["queues"]] == [(0, None, 0), (1, 2, 1),
                                                                               (2, None, 0)]
    r = requests.delete(url(cluster, 0, "/v1/topics/http-made"), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert requests.get(url(cluster, 0, "/v1/topics/http-made"), timeout=TIMEOUT).status_code == 404


@pytest.mark.parametrize("method,path,body,status,code,field", [
    ("POST", "/v1/topics/{t}/messages", b"{not json", 400, "INVALID_ARGUMENT", "body"),
    ("POST", "/v1/topics/{t}/messages", b"", 400, "INVALID_ARGUMENT", "body"),
    ("POST", "/v1/topics/{t}/messages", b'{"value": "x"}', 400, "INVALID_ARGUMENT", "value"),
    ("POST", "/v1/topics/{t}/messages", b'[{"valu": "x"}]', 400, "INVALID_ARGUMENT", "messages[0].valu"),
    ("POST", "/v1/topics/{t}/messages", b'[{"value": 5}]', 400, "INVALID_ARGUMENT", "messages[0].value"),
    ("POST", "/v1/topics/{t}/messages", b'[{"value": {"base64": "@@"}}]', 400, "INVALID_ARGUMENT",
     "messages[0].value.base64"),
    ("POST", "/v1/topics/{t}/messages", b'[{"value": "x", "properties": {"a": 1}}]', 400,
     "INVALID_ARGUMENT", "messages[0].properties"),
    ("POST", "/v1/topics/{t}/messages", b'[]', 400, "INVALID_ARGUMENT", None),
    ("POST", "/v1/topics/{t}/messages", b'{"messages": [{"value": "x"}], "queue": "one"}', 400,
     "INVALID_ARGUMENT", "queue"),
    ("POST", "/v1/topics/{t}/messages", b'{"messages": [{"value": "x"}], "queue": 99}', 400,
     "INVALID_ARGUMENT", None),
    ("POST", "/v1/topics/no-such-topic/messages", b'[{"value": "x"}]', 404, "NOT_FOUND", None),
    ("GET", "/v1/topics/no-such-topic", None, 404, "NOT_FOUND", None),
    ("GET", "/v1/topics/{t}/queues/0/messages", None, 400, "INVALID_ARGUMENT", "offset"),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=abc", None, 400, "INVALID_ARGUMENT", "offset"),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=-1", None, 400, "INVALID_ARGUMENT", None),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=1000", None, 400, "OUT_OF_RANGE", None),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=0&max=0", None, 400, "INVALID_ARGUMENT", "max"),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=0&encoding=hex", None, 400, "INVALID_ARGUMENT",
     "encoding"),
    ("GET", "/v1/topics/{t}/queues/x/messages?offset=0", None, 400, "INVALID_ARGUMENT", "queue"),
    ("GET", "/v1/topics/{t}/queues/9/messages?offset=0", None, 400, "INVALID_ARGUMENT", None),
    ("POST", "/v1/topics", b'{"name": "bad", "queues": "x"}', 400, "INVALID_ARGUMENT", "body"),
    ("POST", "/v1/topics", b'{"name": "bad", "colour": 1}', 400, "INVALID_ARGUMENT", "body"),
    ("POST", "/v1/topics", b'{"name": "bad topic!", "queues": 1}', 400, "INVALID_ARGUMENT", None),
    ("POST", "/v1/topics", b'{"name": "{t}", "queues": 4}', 409, "ALREADY_EXISTS", None),
    ("POST", "/v1/consumer-groups/g/topics/{t}/offsets", b'{"offsets": {"0": "x"}}', 400,
     "INVALID_ARGUMENT", "offsets.0"),
    ("POST", "/v1/consumer-groups/g/topics/{t}/offsets", b'{"offsets": {"0": -1}}', 400,
     "INVALID_ARGUMENT", None),
    ("GET", "/v1/nothing-here", None, 404, "NOT_FOUND", None),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=99999999999999999999", None, 400, "INVALID_ARGUMENT",
     "offset"),
    ("GET", "/v1/topics/{t}/queues/0/messages?offset=0&max_bytes=4294967296", None, 400, "INVALID_ARGUMENT",
     "max_bytes"),
    ("GET", "/v1/topics/{t}/queues/4294967296/messages?offset=0", None, 400, "INVALID_ARGUMENT", "queue"),
    ("POST", "/v1/topics/{t}/messages", b'{"messages": [{"value": "x"}], "queue": 4294967296}', 400,
     "INVALID_ARGUMENT", "queue"),
    ("POST", "/v1/topics", b'{"name": "big", "queues": 4294967296}', 400, "INVALID_ARGUMENT", "body"),
    ("POST", "/v1/consumer-groups/g/topics/{t}/offsets", b'{"offsets": {"0": 9223372036854775808}}', 400,
     "INVALID_ARGUMENT", "offsets.0"),
    ("PUT", "/v1/topics", b"{}", 405, "UNIMPLEMENTED", None),
])
def test_bad_requests_are_4xx_naming_what_was_wrong_and_change_nothing(cluster, client, topic, method, path,
                                                                         body, status, code, field):
    before = {o.queue: o.latest for o in client.offsets(topic)}
    topics = {t["name"] for t in client.list_topics()}
    p = path.replace("{t}", topic)
    r = requests.request(method, url(cluster, 0, p), data=None if body is None else body.replace(
        b"{t}", topic.encode()), headers=JSON, timeout=TIMEOUT)   # redirects followed, as curl -L
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code and err["http_status"] == status and err["message"]
    if field is not None:
        assert err["field"] == field and field.split(".")[-1].split("[")[0] in err["message"]
    assert {o.queue: o.latest for o in client.offsets(topic)} == before
    assert {t["name"] for t in client.list_topics()} == topics
    assert client.committed_offsets("g", topic) == {}


def test_the_api_on_a_follower_redirects_to_the_leader_as_grpc_names_it(cluster, client, topic):
    client.produce(topic, [b"one"], queue=1)
    lead = leader_index(cluster, client, topic, 1)
    follower = (lead + 1) % 3
    path = f"/v1/topics/{topic}/queues/1/messages?offset=0"
    r = requests.get(url(cluster, follower, path), allow_redirects=False, timeout=TIMEOUT)
    assert r.status_code == 307, r.text
    assert r.headers["Location"] == url(cluster, lead, path)
    assert r.json()["error"]["leader"] == cluster.addresses[lead]
    assert requests.get(r.headers["Location"], timeout=TIMEOUT).json()["messages"][0]["value"] == "one"
    # a produce to an explicit queue: redirected with its body (307 keeps method and body)
    r = requests.post(url(cluster, follower, f"/v1/topics/{topic}/messages?queue=1"), json=[{"value": "two"}],
                      allow_redirects=False, timeout=TIMEOUT)
    assert r.status_code == 307 and r.headers["Location"].startswith(url(cluster, lead, "/"))
    assert client.offsets(topic)[1].latest == 1          # nothing written by the follower
    r = requests.post(url(cluster, follower, f"/v1/topics/{topic}/messages?queue=1"), json=[{"value": "two"}],
                      timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["results"][0]["base_offset"] == 1
    assert [x.value for x in client.fetch(topic, 1, 0).records] == [b"one", b"two"]


def test_cluster_status_names_each_nodes_http_port(cluster):
    out = subprocess.run([sys.executable, "-m", "rmq_spark.cli.main", "--endpoints", cluster.endpoints,
                          "cluster", "status", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    assert {n["address"]: n["http"] for n in nodes} == {a: http_address(a) for a in cluster.addresses}
    status = requests.get(url(cluster, 2, "/v1/status"), timeout=TIMEOUT).json()
    assert {n["address"]: n["http"] for n in status["nodes"]} == {a: http_address(a) for a in cluster.addresses}


# ------------------------------------------------------------ status page
def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, ("Debian's chromium and chromium-driver are not installed: `make test` "
                               "installs them (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_the_status_page_shows_leaders_and_lag_in_a_real_browser(cluster, client, topic):
    client.produce(topic, [b"p"] * 7, queue=0)
    client.commit_offsets("page-readers", topic, {0: 2})

    def meta_leader():
        st = client.cluster_status()
        return next((g["leader"] for n in st["nodes"] for g in n["groups"] if g["group"] == 0 and g["leader"]),
                    None)
    browser = _browser()
    try:
        browser.get(url(cluster, 1, "/"))

        def row_of(table: str, first: str):
            """The row whose first cell reads ``first``, as rendered (read in one go: the
            page replaces its rows at each refresh)."""
            rows = browser.execute_script(
                "return [...document.querySelectorAll(arguments[0])].map("
                "tr => [...tr.cells].map(td => td.innerText))", f"#{table} tbody tr")
            return next((cells for cells in rows if cells and cells[0] == first), None)
        # The leader column, as a person reads it. A view is built from every node's
        # status, asked with a 1 s deadline: on a busy machine one refresh may find the
        # leader's node slow (shown unreachable, its groups without a leader); the next
        # refresh, 2 s on, shows it again.
        shown = []

        def leader_shown() -> bool:
            shown.append(((row_of("groups", "0") or [None] * 3)[2], meta_leader()))
            page, actual = shown[-1]
            return actual is not None and page == actual
        wait_until(leader_shown, timeout=30, interval=0.5,
                   what=lambda: f"group 0's leader on the page (page, cluster status: {shown[-1]})")
        row = wait_until(lambda: (lambda r: r if r and "page-readers: 5" in r[5] else None)(
            row_of("topics", topic)), timeout=20, what="the topic's lag on the page")
        assert row[3] == "7"                        # messages
        nodes = wait_until(lambda: (lambda ns: ns if all(n and n[3] == "up" for n in ns) else None)(
            [row_of("nodes", str(i)) for i in range(3)]), timeout=30, interval=0.5, what="every node up")
        assert [n[1] for n in nodes] == cluster.addresses
        assert [n[2] for n in nodes] == [http_address(a) for a in cluster.addresses]
        # it refreshes itself: new lag shows without a reload
        client.produce(topic, [b"p"] * 3, queue=0)
        wait_until(lambda: "page-readers: 8" in (row_of("topics", topic) or [""] * 6)[5], timeout=20,
                   what="the page to refresh the lag")
    finally:
        browser.quit()


# ------------------------------------------------------------ cardinality
def test_per_queue_series_stop_past_the_limit_and_topic_series_remain(cluster, client):
    """The module's nodes run with --metrics-max-queue-series 600 (3 series a queue, more
    with consumer groups): an 800-queue topic puts every leader past it; per-queue
    families go, per-topic ones still count everything."""
    client.create_topic("wide", queues=800)
    for q in range(0, 800, 80):
        client.produce("wide", [b"w"] * 2, queue=q)
    scraped = [scrape(cluster, i) for i in range(3)]
    omitted = sum(m[("rmq_metrics_queues_omitted", ())] for m in scraped)
    assert omitted >= 800
    assert not any(n == "rmq_queue_latest_offset" for m in scraped for n, _ in m)
    assert sum(v for m in scraped for (n, lab), v in m.items()
               if n == "rmq_topic_messages" and dict(lab)["topic"] == "wide") == 20
    client.delete_topic("wide")
    wait_until(lambda: all(scrape(cluster, i)[("rmq_metrics_queues_omitted", ())] == 0 for i in range(3)),
               timeout=20, what="per-queue series back after the wide topic went")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.conftest import start_cluster
    c = start_cluster(tmp_path_factory.mktemp("http"), extra_args=["--metrics-max-queue-series", "600"])
    yield c
    c.stop()


def test_the_grafana_dashboard_queries_metrics_the_nodes_export(cluster, client, tmp_path):
    import re

    client.create_topic("dash-tiered", queues=1, tier=f"delta:{tmp_path / 'archive'}")
    client.create_topic("dash-compact", queues=1, cleanup_policy="compact")
    client.produce("dash-tiered", [b"x"], queue=0)
    client.produce("dash-compact", [Message(b"x", key=b"k")], queue=0)
    client.commit_offsets("dash", "dash-tiered", {0: 0})
    exported = {n for i in range(3) for n, _ in scrape(cluster, i)}
    doc = json.load(open(os.path.join(os.path.dirname(__file__), "..", "docs", "grafana-dashboard.json")))
    used = {m for p in doc["panels"] for t in p["targets"] for m in re.findall(r"\brmq_\w+", t["expr"])}
    assert used and used <= exported, sorted(used - exported)


def test_too_many_connections_or_a_huge_body_are_refused_and_the_node_keeps_serving(cluster):
    import socket

    from storage_service.http.server import MAX_BODY, MAX_CONNECTIONS

    host, port = http_address(cluster.addresses[2]).rsplit(":", 1)
    held = []
    try:
        for _ in range(MAX_CONNECTIONS + 5):
            s = socket.create_connection((host, int(port)), timeout=10)
            held.append(s)
        # the last ones are answered at once, and closed
        s = held[-1]
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in head
        err = json.loads(body)["error"]
        assert err["code"] == "RESOURCE_EXHAUSTED" and f"{MAX_CONNECTIONS} HTTP connections" in err["message"]
    finally:
        for s in held:
            s.close()
    r = wait_until(lambda: (lambda r: r if r.status_code == 200 else None)(
        requests.get(url(cluster, 2, "/v1/topics"), allow_redirects=True, timeout=TIMEOUT)),
        timeout=10, what="the port serving again")
    assert "topics" in r.json()
    r = requests.post(url(cluster, 2, "/v1/topics/any/messages"), data=b"[" + b" " * MAX_BODY + b"]", headers=JSON,
                      timeout=TIMEOUT)
    assert r.status_code == 413 and r.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
    assert f"{MAX_BODY} bytes" in r.json()["error"]["message"]
    assert requests.get(url(cluster, 2, "/metrics"), timeout=TIMEOUT).status_code == 200


def test_an_http_long_poll_waits_for_data_without_a_thread(cluster, client, topic):
    import threading

    lead = leader_index(cluster, client, topic, 3)
    parked_before = total(cluster, "rmq_parked_fetches")
    got = {}

    def poll():
        got["r"] = requests.get(url(cluster, lead, f"/v1/topics/{topic}/queues/3/messages?offset=0&wait_ms=20000"),
                                timeout=TIMEOUT)
    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: total(cluster, "rmq_parked_fetches") > parked_before, timeout=10,
               what="the poll parked (rmq_parked_fetches)")
    client.produce(topic, [b"woke"], queue=3)
    t.join(timeout=15)
    assert not t.is_alive()
    assert [m["value"] for m in got["r"].json()["messages"]] == ["woke"]


def test_http_and_metrics_can_be_off_and_an_old_port_layout_keeps_its_ports(tmp_path):
    """--no-metrics: /metrics answers 404 saying so; --no-http: no port, status says "".
    A cluster laid out 4 ports a node (before the HTTP port) starts as before: a node
    whose gRPC + 4 is the next node's gRPC port serves no HTTP."""
    from storage_service.local import LocalCluster, free_port_block

    with LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path / "off"), extra_args=["--no-metrics"]) as c:
        r = requests.get(f"http://{http_address(c.addresses[0])}/metrics", timeout=TIMEOUT)
        assert r.status_code == 404 and "--no-metrics" in r.json()["error"]["message"]
        assert requests.get(f"http://{http_address(c.addresses[0])}/v1/topics", timeout=TIMEOUT).status_code == 200
    with LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path / "nohttp"), extra_args=["--no-http"]) as c:
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://{http_address(c.addresses[0])}/", timeout=TIMEOUT)
        with Client(c.endpoints) as cl:
            assert [n["http"] for n in cl.cluster_status()["nodes"]] == [""]
    old = tmp_path / "old-layout"
    old.mkdir()
    base = free_port_block(12)
    addresses = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 4}"]
    (old / "cluster.json").write_text(json.dumps({"nodes": 2, "groups": 2, "addresses": addresses,
                                                  "founders": 2}))
    with LocalCluster(data_dir=str(old)) as c:
        assert c.addresses == addresses
        with Client(c.endpoints) as cl:
            http = {n["address"]: n["http"] for n in cl.cluster_status()["nodes"]}
            cl.create_topic("still-works", queues=2)
            cl.produce("still-works", [b"x"], queue=1)
        assert http == {addresses[0]: "", addresses[1]: http_address(addresses[1])}
        assert "HTTP port" in open(os.path.join(str(old), "node-0.log")).read()


def test_a_body_not_sent_as_json_is_refused_415(cluster, client, topic):
    """A browser sends a cross-site text/plain or form POST without asking first: such a
    body is refused, so a web page cannot write to a node its reader can reach."""
    before = [o.latest for o in client.offsets(topic)]
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        r = requests.post(url(cluster, 0, f"/v1/topics/{topic}/messages"), data=b'[{"value": "x"}]',
                          headers={"Content-Type": ctype} if ctype else {}, timeout=TIMEOUT)
        assert r.status_code == 415, (ctype, r.text)
        assert r.json()["error"]["field"] == "Content-Type"
    assert [o.latest for o in client.offsets(topic)] == before


def test_a_fetch_cut_at_max_points_next_offset_after_the_last_message_shown(cluster, client, topic):
    """One produce call is one batch; the node hands whole batches, the API cuts at
    ``max``: following next_offset reads every message once."""
    client.produce(topic, [f"m{i}".encode() for i in range(250)], queue=1)
    seen, offset = [], 0
    while offset < 250:
        r = requests.get(url(cluster, 0, f"/v1/topics/{topic}/queues/1/messages?offset={offset}&max=100"),
                         timeout=TIMEOUT).json()
        assert len(r["messages"]) <= 100
        seen += [m["value"] for m in r["messages"]]
        offset = r["next_offset"]
    assert seen == [f"m{i}" for i in range(250)]


def test_http_produce_with_a_producer_id_and_sequence_is_stored_once(cluster, client, topic):
    """The body's producer_id and sequence make a produce idempotent, as over gRPC (the
    JVM sink of real-time queries writes this way): a retry is answered as a duplicate
    and stored once; bad identities are refused naming the field."""
    body = {"messages": [{"value": "once"}], "queue": 1, "producer_id": "http-p", "sequence": 7}
    first = requests.post(url(cluster, 0, f"/v1/topics/{topic}/messages"), json=body, timeout=TIMEOUT)
    again = requests.post(url(cluster, 1, f"/v1/topics/{topic}/messages"), json=body, timeout=TIMEOUT)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["results"][0]["base_offset"] == again.json()["results"][0]["base_offset"] == 0
    assert again.json()["results"][0].get("duplicate") is True
    assert [r.value for r in client.fetch(topic, 1, 0).records] == [b"once"]
    for bad, field in (({"producer_id": "p", "sequence": 1}, "producer_id"),          # no queue
                       ({"queue": 1, "producer_id": "p", "sequence": -1}, "sequence"),
                       ({"queue": 1, "producer_id": "", "sequence": 1}, "producer_id"),
                       ({"queue": 1, "sequence": 1}, "sequence")):
        r = requests.post(url(cluster, 0, f"/v1/topics/{topic}/messages"),
                          json={"messages": [{"value": "no"}], **bad}, timeout=TIMEOUT)
        assert r.status_code == 400 and field in r.text, (bad, r.text)
    assert [r.value for r in client.fetch(topic, 1, 0).records] == [b"once"]
