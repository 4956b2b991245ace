"""Authentication and authorization on a real secured cluster (issue 22).

One 3-node ``secure=True`` cluster (TLS, ``--authorize``, a token secret, the
admin's token) for the module: principals made with ``create_principal``, ACLs
through the metadata group, every refusal checked to change nothing (the
produce port's token hello and key-value calls: test_security_ports.py).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from rmq_spark.client import Client, PermissionDenied, TlsFiles, Unauthenticated
from rmq_spark.client.errors import AlreadyExists, FailedPrecondition
from storage_service.local import LocalCluster
from storage_service.proto import rmq_pb2
from storage_service.security.tokens import TokenKeys

from .secured import client_as

pytestmark = pytest.mark.integration

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def cluster(secure):
    return secure                  # (conftest's secured cluster, under this module's name)


@pytest.fixture(scope="module")
def admin(secure_admin):
    secure_admin.create_topic("orders", queues=2)
    secure_admin.produce("orders", [b"first"], queue=0)
    return secure_admin



def _latest(admin, topic="orders") -> list[int]:
    return [o.latest for o in admin.offsets(topic)]


def _keys(cluster) -> TokenKeys:
    return TokenKeys.from_file(os.path.join(cluster.data_dir, "security", "token-secret"))


def test_no_invalid_or_expired_token_is_unauthenticated(cluster, admin):
    bob = admin.create_principal("bob-auth")
    expired = _keys(cluster).mint("bob-auth", bob["version"], ttl_s=60, now=time.time() - 3600)
    forged = TokenKeys(b"another cluster's secret, 32 bytes+").mint("bob-auth", bob["version"])
    before = _latest(admin)
    exp = __import__("jwt").decode(expired, options={"verify_signature": False})["exp"]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
    for token, says in ((None, "needs credentials"), ("not-a-jwt", "not a token of this cluster"),
                        (expired, f"expired at {when}"), (forged, "signature")):
        with client_as(cluster, token) as c:
            with pytest.raises(Unauthenticated, match=says) as raised:
                c.produce("orders", [b"x"], queue=0)
            # every refusal names where a valid token comes from
            assert "admin-token-file:" in str(raised.value) and "rmq principal create" in str(raised.value)
            with pytest.raises(Unauthenticated, match=says):
                c.list_topics()
            with pytest.raises(Unauthenticated, match=says):    # the produce port's path (hello)
                c.produce_batches([("orders", 0, [b"x"])])
    assert _latest(admin) == before
    with client_as(cluster, bob["token"]) as c:            # the valid token is known, but has no ACL
        assert c.whoami()["principal"] == "bob-auth"


def test_without_an_acl_everything_is_denied_and_nothing_changes(cluster, admin):
    carol = admin.create_principal("carol")
    before = _latest(admin)
    with client_as(cluster, carol["token"]) as c:
        assert c.list_topics() == []                 # only what carol may describe
        with pytest.raises(PermissionDenied, match="'carol' may not describe topic 'orders'"):
            c.describe_topic("orders")
        # describe only (a client looks a topic up before it produces or fetches)
        admin.change_acls(True, [dict(principal="carol", resource_type="topic", name="orders",
                                      operations=["describe"])])
        assert [t["name"] for t in c.list_topics()] == ["orders"]
        checks = [
            ("produce", lambda: c.produce("orders", [b"x"], queue=0)),
            ("consume", lambda: c.fetch("orders", 0, 0)),
            ("alter", lambda: c.alter_topic("orders", retention_ms=1000)),
            ("alter", lambda: c.delete_topic("orders")),
            ("alter", lambda: c.create_topic("carols", queues=1)),
            ("consume", lambda: c.commit_offsets("g1", "orders", {0: 1})),
            ("alter", lambda: c.lease("orders", "tier", "carol-job", 10_000)),
            ("alter", lambda: c.set_watermark("orders", "compaction", {0: 1})),
            ("alter", lambda: c.create_principal("eve")),
            ("alter", lambda: c.change_acls(True, [dict(principal="carol", resource_type="cluster",
                                                        name="", operations=["alter"])])),
            ("describe", lambda: c.list_acls()),
        ]
        for op, call in checks:
            with pytest.raises(PermissionDenied) as e:
                call()
            assert "'carol'" in e.value.message and f"may not {op}" in e.value.message, e.value.message
    assert _latest(admin) == before
    assert [t["name"] for t in admin.list_topics()] == ["orders"]
    assert admin.describe_topic("orders")["retention_ms"] != 1000
    assert admin.committed_offsets("g1", "orders") == {}
    assert "eve" not in [p["name"] for p in admin.list_principals()["principals"]]
    assert [e["operations"] for e in admin.list_acls("carol")] == [["describe"]]


def test_an_acl_holds_at_once_on_every_node(cluster, admin):
    dave = admin.create_principal("dave")
    for address in cluster.addresses:               # a token made a moment ago works everywhere
        with client_as(cluster, dave["token"], [address]) as c:
            assert c.whoami(address)["principal"] == "dave"
    admin.change_acls(True, [dict(principal="dave", resource_type="topic", name="ord", prefix=True,
                                  operations=["produce", "consume"]),
                             dict(principal="dave", resource_type="group", name="dave-g",
                                  operations=["consume"])])
    for i, address in enumerate(cluster.addresses):
        with client_as(cluster, dave["token"], [address]) as c:
            assert [t["name"] for t in c.list_topics()] == ["orders"]     # produce implies describe
            r = c.produce("orders", [f"dave-{i}".encode()], queue=1)[0]
            assert f"dave-{i}".encode() in [m.value for m in c.fetch("orders", 1, r.base_offset).records]
            c.commit_offsets("dave-g", "orders", {1: r.base_offset + 1})
            with pytest.raises(PermissionDenied, match="may not alter"):
                c.delete_topic("orders")
            with pytest.raises(PermissionDenied, match="group 'other-g'"):
                c.commit_offsets("other-g", "orders", {1: 0})
    # taken back: denied again, on every node at once
    admin.change_acls(False, [dict(principal="dave", resource_type="topic", name="ord", prefix=True,
                                   operations=["produce"])])
    for address in cluster.addresses:
        with client_as(cluster, dave["token"], [address]) as c:
            with pytest.raises(PermissionDenied, match="may not produce"):
                c.produce("orders", [b"no"], queue=1)
            c.fetch("orders", 1, 0)                  # consume stays


def test_deleted_or_rotated_principals_tokens_stop_working_everywhere(cluster, admin):
    old = admin.create_principal("erin")
    with pytest.raises(AlreadyExists, match="rotate"):
        admin.create_principal("erin")
    new = admin.create_principal("erin", rotate=True)
    assert new["version"] > old["version"]
    for address in cluster.addresses:
        with client_as(cluster, old["token"], [address]) as c:
            with pytest.raises(Unauthenticated, match="replaced by a newer one"):
                c.whoami(address)
        with client_as(cluster, new["token"], [address]) as c:
            assert c.whoami(address)["principal"] == "erin"
    admin.delete_principal("erin")
    for address in cluster.addresses:
        with client_as(cluster, new["token"], [address]) as c:
            with pytest.raises(Unauthenticated, match="was deleted"):
                c.whoami(address)


def test_the_cli_reports_the_nodes_reason_for_a_refused_token(cluster, admin, tmp_path):
    """A wrong, expired or revoked token is the node's UNAUTHENTICATED answer, not 'no
    node answered': the CLI prints the node's reason and where a valid token comes from."""
    gone = admin.create_principal("gone-cli")
    admin.delete_principal("gone-cli")
    expired = _keys(cluster).mint("gone-cli", gone["version"], ttl_s=60, now=time.time() - 3600)
    env = dict(os.environ, RMQ_ENDPOINTS=cluster.endpoints, RMQ_TLS_CA=cluster.tls.ca)
    for token, says in (("not-a-jwt", "not a token of this cluster"), (expired, "expired at"),
                        (gone["token"], "principal 'gone-cli' was deleted")):
        (tmp_path / "t").write_text(token + "\n")
        for how in (["--token", token], ["--token-file", str(tmp_path / "t")]):
            out = subprocess.run([os.path.join(BIN, "rmq"), *how, "topic", "list"], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 1, out.stderr
            assert says in out.stderr and "no node answered" not in out.stderr, out.stderr
            assert "admin-token-file:" in out.stderr and "rmq principal create" in out.stderr, out.stderr


def test_watermarks_need_the_alter_acl_and_the_current_lease(cluster, admin):
    """SetWatermark and Lease: only a principal allowed to run tiering on the topic,
    and an archive watermark only with the tier lease's current token."""
    admin.create_topic("tiered", queues=1, tier="delta:/tmp/rmq-test-archive-never-written")
    admin.produce("tiered", [b"a", b"b", b"c"], queue=0)
    job = admin.create_principal("tier-job")
    admin.change_acls(True, [dict(principal="tier-job", resource_type="topic", name="tiered",
                                  operations=["consume", "alter"])])
    with client_as(cluster, job["token"]) as c:
        with pytest.raises(FailedPrecondition, match="lease_token"):
            c.set_watermark("tiered", "archive", {0: 2})            # no lease token
        granted, _, _, token = c.lease("tiered", "tier", "job-a", 60_000)
        assert granted
        with pytest.raises(FailedPrecondition, match="not the topic's tier lease"):
            c.set_watermark("tiered", "archive", {0: 2}, lease_token=token + 1)     # a stale/wrong one
        assert admin.describe_topic("tiered")["queue_info"][0]["archived"] == -1
        c.set_watermark("tiered", "archive", {0: 2}, lease_token=token)
        assert admin.describe_topic("tiered")["queue_info"][0]["archived"] == 2
        c.lease("tiered", "tier", "job-a", 0)                         # released ...
    # ... and taken by another owner: the old token is stale for good
    granted, _, _, token_b = admin.lease("tiered", "tier", "job-b", 60_000)
    assert granted and token_b != token
    with client_as(cluster, job["token"]) as c:
        with pytest.raises(FailedPrecondition, match="not the topic's tier lease"):
            c.set_watermark("tiered", "archive", {0: 3}, lease_token=token)
    assert admin.describe_topic("tiered")["queue_info"][0]["archived"] == 2


def test_replica_fetch_is_for_nodes_only(cluster, admin):
    """Even a superuser's token may not read raw replica data: that takes a node's
    certificate, on the cluster port."""
    import grpc
    from storage_service.proto import rmq_pb2_grpc
    from storage_service.protocol.tls import channel_credentials
    qdir = None
    for root, dirs, _ in os.walk(cluster.data_dir):
        qdir = next((d for d in dirs if d.startswith("orders")), None)
        if qdir:
            break
    assert qdir, "no queue directory of orders on disk"
    ch = grpc.secure_channel(cluster.addresses[0], channel_credentials(TlsFiles(cluster.tls.ca)))
    try:
        stub = rmq_pb2_grpc.MessageLogStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ReplicaFetch(rmq_pb2.ReplicaFetchRequest(queue_dir=qdir, offset=0, end_offset=1),
                              metadata=(("authorization", f"Bearer {cluster.token}"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "nodes" in e.value.details()
    finally:
        ch.close()


def test_the_cli_makes_principals_and_acls(cluster, admin, tmp_path):
    env = dict(os.environ, RMQ_ENDPOINTS=cluster.endpoints, RMQ_TLS_CA=cluster.tls.ca,
               RMQ_TOKEN_FILE=cluster.token_file)
    rmq = os.path.join(BIN, "rmq")

    def run(*args, **extra):
        return subprocess.run([rmq, *args], env=dict(env, **extra), capture_output=True, text=True, timeout=60)

    made = run("principal", "create", "frank", "--ttl", "1h")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    (tmp_path / "frank.token").write_text(token + "\n")
    me = run("principal", "whoami", RMQ_TOKEN_FILE=str(tmp_path / "frank.token"))
    assert me.returncode == 0 and me.stdout.startswith("frank by token"), me.stdout + me.stderr
    denied = run("topic", "describe", "orders", RMQ_TOKEN_FILE=str(tmp_path / "frank.token"))
    assert denied.returncode == 1 and "may not describe topic 'orders'" in denied.stderr
    added = run("acl", "add", "frank", "--topic", "orders", "--allow", "describe,consume")
    assert added.returncode == 0, added.stderr
    listed = run("acl", "list", "--principal", "frank", "--json")
    assert __import__("json").loads(listed.stdout) == [dict(principal="frank", resource_type="topic",
                                                           name="orders", prefix=False,
                                                           operations=["consume", "describe"])]
    ok = run("topic", "describe", "orders", RMQ_TOKEN_FILE=str(tmp_path / "frank.token"))
    assert ok.returncode == 0, ok.stderr
    removed = run("acl", "remove", "frank", "--topic", "orders", "--allow", "describe,consume")
    assert removed.returncode == 0 and "no longer allowed" in removed.stdout, removed.stderr
    again = run("topic", "describe", "orders", RMQ_TOKEN_FILE=str(tmp_path / "frank.token"))
    assert again.returncode == 1 and "may not describe topic 'orders'" in again.stderr
    bad = run("acl", "add", "frank", "--topic", "orders", "--allow", "write")
    assert bad.returncode == 1 and "allowed produce, consume, describe, alter" in bad.stderr
    both = run("principal", "whoami", RMQ_TOKEN=token)          # token and token file: refused
    assert both.returncode == 2 and "not both" in both.stderr


def test_a_node_refuses_unsafe_security_settings_before_starting(tmp_path, cluster):
    """--authorize without TLS (a plaintext raft port would let anyone pose as a node),
    and a cluster port that is another node's port: exit 2, nothing written."""
    sec = os.path.join(cluster.data_dir, "security")
    tls = ["--tls-ca", f"{sec}/ca.pem", "--tls-cert", f"{sec}/node.pem", "--tls-key", f"{sec}/node-key.pem"]
    data = tmp_path / "node"
    for args, says in (
            (["--nodes", "127.0.0.1:1", "--authorize", "--token-secret-file", f"{sec}/token-secret"],
             "--authorize needs TLS"),
            (["--nodes", "127.0.0.1:1", *tls, "--authorize"], "needs a way to authenticate"),
            (["--nodes", "127.0.0.1:1,127.0.0.1:4", *tls], "cluster port 127.0.0.1:4"),
            (["--nodes", "127.0.0.1:1", *tls, "--token-secret-file", str(tmp_path / "none")], "none"),
            (["--nodes", "127.0.0.1:1", "--data-umask", "700"], "--data-umask 700"),
            (["--nodes", "127.0.0.1:1", "--data-umask", "rw"], "--data-umask rw")):
        out = subprocess.run([sys.executable, "-m", "storage_service.cli", "node", "--id", "0",
                              "--data-dir", str(data), *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
        assert not data.exists()


def test_the_compaction_watermark_needs_the_compact_lease(cluster, admin):
    """One compaction job per topic (the 'compact' lease), and only it moves the
    compaction watermark: a second job is refused, a stale token moves nothing."""
    from rmq_spark.compaction import CompactionConfigError
    from rmq_spark.compaction._job import CompactLease
    admin.create_topic("kv-fenced", queues=1, cleanup_policy="compact")
    with pytest.raises(FailedPrecondition, match="compact lease"):
        admin.set_watermark("kv-fenced", "compaction", {0: 1})
    ca = TlsFiles(cluster.tls.ca)
    a = CompactLease(cluster.endpoints, "kv-fenced", "/ck/a", tls=ca, token=cluster.token)
    b = CompactLease(cluster.endpoints, "kv-fenced", "/ck/b", tls=ca, token=cluster.token)
    a.take()
    with pytest.raises(CompactionConfigError, match="being compacted by another job"):
        b.take()
    admin.set_watermark("kv-fenced", "compaction", {0: 1}, lease_token=a.token)
    a.release()
    b.take()
    with pytest.raises(FailedPrecondition, match="not the topic's compact lease"):
        admin.set_watermark("kv-fenced", "compaction", {0: 5}, lease_token=a.token)
    assert admin.describe_topic("kv-fenced")["queue_info"][0]["compacted"] == 1
    b.release()


def _modes(node_dir: str) -> tuple[int, set[int]]:
    """(the data directory's mode, the modes of its .log segment files)."""
    files = {os.stat(os.path.join(root, f)).st_mode & 0o777
             for root, _, names in os.walk(node_dir) for f in names if f.endswith(".log")}
    return os.stat(node_dir).st_mode & 0o777, files


def test_segment_files_are_the_nodes_alone_unless_configured(cluster, admin, tmp_path):
    """Default (--data-umask 077): the data directory is 0700 and segments 0600, so no
    other user of the host reads them (a Spark worker of another user falls back to
    network reads); --data-umask 027 gives the node's group read access."""
    admin.produce("orders", [b"on disk"], queue=0)
    mode, files = _modes(os.path.join(cluster.data_dir, "node-0"))
    assert mode == 0o700 and files == {0o600}, (oct(mode), [oct(f) for f in files])
    c = LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path / "grp"),
                     extra_args=["--replication-factor", "1", "--data-umask", "027"])
    c.start()
    try:
        with Client(c.endpoints) as client:
            client.create_topic("g", queues=1)
            client.produce("g", [b"x"], queue=0)
        mode, files = _modes(os.path.join(c.data_dir, "node-0"))
        assert mode == 0o750 and files == {0o640}, (oct(mode), [oct(f) for f in files])
    finally:
        c.stop()


def test_the_http_port_is_https_with_the_same_credentials_and_acls(cluster, admin):
    """The HTTP port of a secured node: HTTPS (the cluster's CA), a bearer token as on
    gRPC, the same ACLs under the gRPC method's name; /metrics and the status data
    need describe on the cluster; a refusal changes nothing."""
    import requests
    from storage_service.protocol.placement import http_address

    base = f"https://{http_address(cluster.addresses[1])}"
    ca = cluster.tls.ca
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{base}/v1/topics", timeout=10)             # not trusting the cluster's CA
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://{http_address(cluster.addresses[1])}/v1/topics", timeout=10)   # no plaintext
    r = requests.get(f"{base}/v1/topics", verify=ca, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    r = requests.get(f"{base}/metrics", verify=ca, headers={"Authorization": "Bearer forged.token.x"}, timeout=10)
    assert r.status_code == 401
    dora = admin.create_principal("dora")["token"]
    as_dora = {"Authorization": f"Bearer {dora}"}
    before = _latest(admin)
    r = requests.post(f"{base}/v1/topics/orders/messages", json=[{"value": "x"}], verify=ca, headers=as_dora,
                      timeout=10)
    assert r.status_code == 403, r.text
    assert "'dora' may not produce topic 'orders'" in r.json()["error"]["message"]
    for path in ("/metrics", "/v1/status"):
        r = requests.get(base + path, verify=ca, headers=as_dora, timeout=10)
        assert r.status_code == 403 and "may not describe the cluster" in r.json()["error"]["message"], path
    assert _latest(admin) == before
    admin.change_acls(True, [dict(principal="dora", resource_type="topic", name="orders",
                                  operations=["produce", "consume"]),
                             dict(principal="dora", resource_type="cluster", name="", operations=["describe"])])
    r = requests.post(f"{base}/v1/topics/orders/messages?queue=1", json=[{"value": "from http"}], verify=ca,
                      headers=as_dora, timeout=10, allow_redirects=False)
    if r.status_code == 307:        # a follower: the client sends its credentials on to the leader
        assert r.headers["Location"].startswith("https://")    # (curl: --location-trusted)
        r = requests.post(r.headers["Location"], json=[{"value": "from http"}], verify=ca, headers=as_dora,
                          timeout=10, allow_redirects=False)
    assert r.status_code == 200, r.text
    assert admin.fetch("orders", 1, before[1]).records[0].value == b"from http"
    r = requests.get(f"{base}/metrics", verify=ca, headers=as_dora, timeout=10)
    assert r.status_code == 200 and "rmq_raft_term" in r.text
    assert requests.get(f"{base}/", verify=ca, timeout=10).status_code == 200    # the page asks for a token
    # failed TLS handshakes give their connection slot back (more of them than the port's limit)
    from storage_service.http.server import MAX_CONNECTIONS
    host, port = http_address(cluster.addresses[1]).rsplit(":", 1)
    for _ in range(MAX_CONNECTIONS + 50):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")      # plaintext at a TLS port
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    r = requests.get(f"{base}/metrics", verify=ca, headers=as_dora, timeout=10)
    assert r.status_code == 200
