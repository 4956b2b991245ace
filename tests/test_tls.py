"""TLS on the nodes' gRPC and produce ports and between nodes (issue 22).

A real cluster made with ``secure=True`` (``rmq-storage local --secure``): a CA,
a node and an admin certificate, a token secret and the admin's token under its
data directory (``storage_service/security/certs.py``, ``tokens.py``). Clients
here come as the admin (its token); principals and ACLs are ``test_security.py``;
the raft port's TLS is ``test_raft_tls.py``.
"""
from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys

import pytest

from rmq_spark.client import Client, TlsFiles, TlsRefused, Unavailable
from storage_service.local import LocalCluster
from storage_service.proto import rmq_pb2
from storage_service.protocol.placement import produce_address
from storage_service.protocol.produce_frames import HELLO, FrameReader, check_hello, frame_head, hello
from storage_service.protocol.tls import client_context
from storage_service.security.certs import issue, make_ca

from .conftest import wait_until

pytestmark = pytest.mark.integration

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """Files of another CA: a client trusting it, with a certificate it signed."""
    folder = str(tmp_path_factory.mktemp("stranger"))
    ca = make_ca(folder, "some other CA")
    mine = issue(ca, folder, "client", "mallory")
    return TlsFiles(ca.cert, mine.cert, mine.key)


def test_a_tls_client_produces_and_reads_through_every_node(secure):
    ca_only = TlsFiles(secure.tls.ca)
    with Client(secure.endpoints, tls=ca_only, token=secure.token) as c:
        c.create_topic("tls", queues=2)
        for q in range(2):
            c.produce("tls", [f"m{q}-{i}".encode() for i in range(5)], queue=q)
        for a in secure.addresses:                     # any node routes to the leader (peer calls)
            with Client([a], tls=ca_only, token=secure.token) as one:
                assert [r.value for r in one.fetch("tls", 1, 0).records] == [f"m1-{i}".encode()
                                                                          for i in range(5)]
        st = c.cluster_status()                        # the node asks its peers, over TLS
        assert {n["address"] for n in st["nodes"]} == set(secure.addresses)


def test_a_plaintext_client_is_refused(secure):
    with Client(secure.endpoints, timeout=3, attempt_timeout=1) as plain:
        with pytest.raises(Unavailable):
            plain.list_topics()
    # the produce port too: a plaintext hello gets no hello back
    host, port = produce_address(secure.addresses[0]).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(hello())
        try:
            answer = s.recv(HELLO.size)
        except ConnectionResetError:
            answer = b""
        assert len(answer) < HELLO.size or answer[:4] != hello()[:4]


def test_a_client_trusting_another_ca_is_refused(secure, stranger):
    # Not retried as if the node were down: the handshake's own reason, at once.
    assert not TlsRefused.retriable
    with Client(secure.endpoints, timeout=30, attempt_timeout=10, tls=stranger) as c:
        with pytest.raises(TlsRefused, match="certificate of node .* was not accepted .*--tls-ca"):
            c.list_topics()
    out = subprocess.run([os.path.join(BIN, "rmq"), "--tls-ca", stranger.ca, "--token-file", secure.token_file,
                          "topic", "list"], env=dict(os.environ, RMQ_ENDPOINTS=secure.endpoints),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "was not accepted" in out.stderr, out.stderr
    assert "no node answered" not in out.stderr, out.stderr
    host, port = produce_address(secure.addresses[0]).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            client_context(stranger).wrap_socket(raw, server_hostname=host)


def test_the_produce_port_speaks_tls(secure):
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token) as c:
        c.create_topic("tls-port", queues=1)
        leader = next(a for a in secure.addresses
                      if any(g["leader"] == a for n in c.cluster_status()["nodes"] if n["address"] == a
                             for g in n["groups"] if g["group"] == c.group_of("tls-port", 0)))
    host, port = produce_address(leader).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with client_context(TlsFiles(secure.tls.ca)).wrap_socket(raw, server_hostname=host) as s:
            s.sendall(hello(secure.token))
            check_hello(s.recv(HELLO.size))
            from rmq_spark.client._messages import to_block
            req = rmq_pb2.ProduceBatchesRequest(batches=[rmq_pb2.ProduceRequest(
                topic="tls-port", queue=0, records=to_block([b"over tls"]), count=1)])
            body = req.SerializeToString()
            s.sendall(frame_head(1, 1, len(body)) + body)
            frames = FrameReader(1 << 20)
            got = None
            while got is None:
                chunk = s.recv(1 << 16)
                assert chunk, "the node closed the produce connection"
                got = next(iter(frames.feed(chunk)), None)
            assert got.code == 0, bytes(got.body)
            outcome = rmq_pb2.ProduceBatchesResponse.FromString(bytes(got.body)).outcomes[0]
            assert outcome.code == 0, outcome.message
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token) as c:
        assert [r.value for r in c.fetch("tls-port", 0, 0).records] == [b"over tls"]


def test_nodes_requiring_client_certificates(tmp_path):
    c = LocalCluster(nodes=1, groups=1, data_dir=str(tmp_path / "mtls"), secure=True,
                     extra_args=["--tls-client-cert", "--replication-factor", "1"])
    c.start()
    try:
        with Client(c.endpoints, timeout=30, attempt_timeout=10, tls=TlsFiles(c.tls.ca)) as anonymous:
            with pytest.raises(TlsRefused, match="requires a client certificate .*--tls-cert"):
                anonymous.list_topics()
        out = subprocess.run([os.path.join(BIN, "rmq"), "--tls-ca", c.tls.ca, "topic", "list"],
                             env=dict(os.environ, RMQ_ENDPOINTS=c.endpoints),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "requires a client certificate" in out.stderr, out.stderr
        with Client(c.endpoints, tls=c.tls) as admin:           # the admin's certificate
            admin.create_topic("mtls", queues=1)
            assert [t["name"] for t in admin.list_topics()] == ["mtls"]
        # Produce goes over the produce port: refused there the same way, and said so.
        with Client(c.endpoints, timeout=30, attempt_timeout=10, tls=TlsFiles(c.tls.ca)) as anonymous:
            with pytest.raises(TlsRefused, match="requires a client certificate .*--tls-cert"):
                anonymous.produce("mtls", [b"x"], queue=0)
            with pytest.raises(TlsRefused, match="requires a client certificate .*--tls-cert"):
                anonymous.produce_batches([("mtls", 0, [b"y"])])
        with Client(c.endpoints, tls=c.tls) as admin:
            assert admin.fetch("mtls", 0, 0).records == []      # nothing was stored
    finally:
        c.stop()


def test_rmq_storage_local_secure_and_the_cli(tmp_path):
    p = subprocess.Popen([os.path.join(BIN, "rmq-storage"), "local", "--nodes", "1", "--groups", "1",
                          "--replication-factor", "1", "--secure", "--data-dir", str(tmp_path)],
                         stdout=subprocess.PIPE, text=True)
    try:
        lines = [wait_until(lambda: p.stdout.readline(), timeout=60, what="endpoints line")]
        lines += [p.stdout.readline(), p.stdout.readline()]
        assert lines[0].startswith("endpoints: ") and lines[1].startswith("tls-ca: "), lines
        assert lines[2].startswith("admin-token-file: "), lines
        endpoints, ca, token_file = (line.split(": ", 1)[1].strip() for line in lines[:3])
        assert ca == str(tmp_path / "security" / "ca.pem")
        assert token_file == str(tmp_path / "security" / "admin.token")
        for private in ("ca-key.pem", "token-secret", "admin.token"):
            assert oct(os.stat(tmp_path / "security" / private).st_mode & 0o777) == "0o600", private
        env = dict(os.environ, RMQ_ENDPOINTS=endpoints)
        plain = subprocess.run([os.path.join(BIN, "rmq"), "topic", "list"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert plain.returncode == 2 and "no node answered" in plain.stderr
        anonymous = subprocess.run([os.path.join(BIN, "rmq"), "topic", "create", "cli-tls", "--queues", "1"],
                                   env=dict(env, RMQ_TLS_CA=ca), capture_output=True, text=True, timeout=60)
        assert anonymous.returncode == 1 and "needs credentials" in anonymous.stderr, anonymous.stderr
        ok = subprocess.run([os.path.join(BIN, "rmq"), "topic", "create", "cli-tls", "--queues", "1"],
                            env=dict(env, RMQ_TLS_CA=ca, RMQ_TOKEN_FILE=token_file),
                            capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        bad = subprocess.run([os.path.join(BIN, "rmq"), "--tls-ca", str(tmp_path / "none.pem"),
                              "topic", "list"], env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "none.pem" in bad.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    # the same data without --secure: refused, never served in plaintext
    again = subprocess.run([os.path.join(BIN, "rmq-storage"), "local", "--data-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--secure" in again.stderr, again.stderr


def test_a_node_with_unusable_tls_files_stops_before_starting_anything(tmp_path, stranger):
    from storage_service.security.certs import ensure_local
    ca, node, _ = ensure_local(str(tmp_path / "c"), ("127.0.0.1",))
    data = tmp_path / "node"
    for cert, key, text in ((node.cert, stranger.key, "KEY_VALUES_MISMATCH|key values mismatch"),
                            (node.cert, str(tmp_path / "none.pem"), "none.pem")):
        out = subprocess.run([sys.executable, "-m", "storage_service.cli", "node", "--id", "0",
                              "--nodes", "127.0.0.1:1", "--data-dir", str(data), "--tls-ca", ca.cert,
                              "--tls-cert", cert, "--tls-key", key],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "TLS:" in out.stderr, out.stderr
        assert __import__("re").search(text, out.stderr), out.stderr
        assert not data.exists()                       # nothing was started or written


def test_a_tls_client_produces_batches_over_the_produce_port(secure):
    """The client's produce port over TLS (an SSLObject over memory buffers, one reader
    thread and many senders), with the token in its hello: big and small requests from
    several threads at once, every one acknowledged and readable, no fallback to gRPC."""
    import threading
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token) as c:
        c.create_topic("tls-batches", queues=4)
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(20):
                    size = 300_000 if i % 5 == 0 else 100     # some requests span many TLS records
                    c.produce_batches([("tls-batches", q, [f"{t}-{i}-{q}".encode().ljust(size, b".")])
                                       for q in range(4)])
            except BaseException as e:     # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert c._transports and all(t._fallback_until == 0 for t in c._transports.values())
        assert sum(o.latest for o in c.offsets("tls-batches")) == 4 * 20 * 4
        got = set()
        for q in range(4):
            offset = 0
            while offset < 80:
                records = c.fetch("tls-batches", q, offset).records
                got |= {bytes(r.value).rstrip(b".") for r in records}
                offset = records[-1].offset + 1
        assert got == {f"{t}-{i}-{q}".encode() for t in range(4) for i in range(20) for q in range(4)}


def test_a_pipelined_producer_over_tls(secure):
    """``Client.producer`` (and with it ``rmq produce`` and the Spark sink) over TLS: the
    node answers a pipelined connection's requests from a thread of its own, and those
    answers must go out encrypted too (they went out in plaintext: every batch timed out)."""
    with Client(secure.endpoints, tls=TlsFiles(secure.tls.ca), token=secure.token, timeout=20) as c:
        c.create_topic("tls-piped", queues=2)
        with c.producer(max_in_flight=5) as p:
            futures = [p.send("tls-piped", b % 2, [f"{b}".encode()]) for b in range(40)]
            p.flush(timeout=60)
        assert [f.result().base_offset for f in futures] == [b // 2 for b in range(40)]
        assert p.peak_in_flight >= 1
        for q in range(2):
            assert [r.value for r in c.fetch("tls-piped", q, 0).records] == \
                [f"{b}".encode() for b in range(q, 40, 2)]
