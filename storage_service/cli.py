"""rmq-storage: run one storage node, or a whole local cluster."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from .log.dirlock import DirectoryInUse
from .protocol.units import bytes_flag, count_flag, seconds_flag
from .raft.journal import FSYNC_POLICIES

__all__ = ["main"]


def _parse(argv):
    p = argparse.ArgumentParser(prog="rmq-storage", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("node", help="run one node of a cluster (multi-host deployments)")
    n.add_argument("--id", type=int, help="founding node: its index in --nodes")
    n.add_argument("--nodes", help="founding nodes: the gRPC address of each, H:P,H:P,H:P")
    n.add_argument("--listen", help="joining node: its gRPC address HOST:PORT (raft and produce take "
                                    "the next two ports)")
    n.add_argument("--join", help="joining node: nodes of the running cluster, H:P[,H:P]")
    n.add_argument("--groups", type=count_flag(1), default=4, help="data raft groups (default 4)")
    n.add_argument("--replication-factor", type=int, default=3,
                   help="replicas of each data group, on distinct nodes (default 3; at most the nodes)")
    n.add_argument("--data-dir", required=True)
    n.add_argument("--rack", default="",
                   help="this node's rack (or host, zone): each data group's replicas go to distinct racks "
                        "when there are as many racks as replicas, else as evenly as the racks allow "
                        "(default: none; nodes without a rack share one)")
    n.add_argument("--fsync", choices=FSYNC_POLICIES, default="always")
    n.add_argument("--journal-sync-threads", type=count_flag(1, 64), default=1,
                   help="raft journals (one per group) this node may fdatasync at once, each on its "
                        "own thread; a group's syncs never overlap (default 1: one after another)")
    n.add_argument("--max-message-bytes", type=bytes_flag("--max-message-bytes"), default=4 << 20,
                   help="the largest message (bytes, or a size: 4MiB); default 4 MiB")
    n.add_argument("--max-commit-backlog", type=bytes_flag("--max-commit-backlog"), default=64 << 20,
                   help="bytes of produce batches that may wait to be committed per group; past it a "
                        "produce is refused RESOURCE_EXHAUSTED and the client retries (default 64 MiB)")
    n.add_argument("--retention-interval", type=seconds_flag("--retention-interval"), default=5.0,
                   help="time between retention passes (seconds, or a duration: 500ms, 5s); default 5s")
    n.add_argument("--segment-bytes", type=bytes_flag("--segment-bytes"), default=64 << 20,
                   help="a queue's segment file size (bytes, or a size: 64MiB); default 64 MiB")
    n.add_argument("--compaction-entries", type=count_flag(1), default=2000,
                   help="snapshot + compact the raft log after this many entries")
    n.add_argument("--max-open-files", default=0,
                   type=count_flag(0, zero="half the descriptor limit"),
                   help="segment files a node keeps open (default: half its descriptor limit, "
                        "raised to the hard limit); the least used queues' files close past it")
    n.add_argument("--max-queues", type=count_flag(1), default=200_000,
                   help="queues the cluster may hold (default 200,000); a create or growth past "
                        "it is refused with RESOURCE_EXHAUSTED")
    n.add_argument("--repair-after", type=seconds_flag("--repair-after"), default=300.0,
                   help="time a node may be down before its replicas are re-created on other nodes "
                        "(seconds, or a duration: 5m); default 300 s")
    n.add_argument("--max-requests", type=count_flag(1), default=512,
                   help="requests a node runs or queues at once; past it new ones get RESOURCE_EXHAUSTED "
                        "(the client backs off and retries); default 512")
    n.add_argument("--min-free-bytes", type=bytes_flag("--min-free-bytes"), default=64 << 20,
                   help="free space the data directory keeps: below it the node refuses produce "
                        "(RESOURCE_EXHAUSTED, retried by clients), takes no new entries as a follower "
                        "and hands the groups it leads to replicas with room; default 64 MiB")
    n.add_argument("--scrub-interval", type=seconds_flag("--scrub-interval"), default=21_600.0,
                   help="time between passes that read every segment the node holds and repair bit rot "
                        "from peers (seconds, or a duration: 6h); default 6h; 0: off")
    n.add_argument("--scrub-bytes-per-s", type=bytes_flag("--scrub-bytes-per-s"), default=32 << 20,
                   help="what a scrub pass reads per second at most (default 32 MiB)")
    n.add_argument("--max-parked-fetches", type=count_flag(1), default=20_000,
                   help="long-polling fetches (wait_ms) waiting at once; they hold no thread; default 20000")
    n.add_argument("--tls-ca", help="PEM: the CA of the cluster's certificates (with --tls-cert and "
                   "--tls-key: TLS on the gRPC and produce ports and to peers)")
    n.add_argument("--tls-cert", help="PEM: this node's certificate (names its address)")
    n.add_argument("--tls-key", help="PEM: its private key")
    n.add_argument("--tls-client-cert", action="store_true",
                   help="clients must present a certificate signed by --tls-ca (mTLS)")
    n.add_argument("--node-names", default="",
                   help="with TLS: certificate common names (CN) of the cluster's nodes, comma-separated; "
                        "only they may connect to the raft and cluster ports (default: this node's "
                        "certificate's CN)")
    n.add_argument("--authorize", action="store_true",
                   help="require credentials (a bearer token, or a client certificate) on every call and "
                        "enforce the ACLs (rmq acl); needs --token-secret-file or --tls-client-cert")
    n.add_argument("--token-secret-file",
                   help="file of at least 32 random bytes (hex), the same on every node: signs and "
                        "checks bearer tokens (rmq principal create)")
    n.add_argument("--superusers", default="",
                   help="principals (token subjects, certificate CNs) allowed everything, comma-separated")
    n.add_argument("--data-umask", default="077",
                   help="octal umask for what the node writes; the data directory gets 0777 & ~it "
                        "(default 077: only the node's user reads segments; 027 lets its group read "
                        "them, e.g. a Spark worker's user for short-circuit local reads)")
    n.add_argument("--no-http", action="store_true",
                   help="serve no HTTP port (by default gRPC port + 4: the JSON API, /metrics and the "
                        "status page; HTTPS with TLS)")
    n.add_argument("--no-metrics", action="store_true",
                   help="count nothing for /metrics (requests, latencies, produced and fetched bytes)")
    n.add_argument("--metrics-max-queue-series", default=30_000,
                   type=count_flag(0, zero="per-topic series only"),
                   help="export per-queue series while they number at most this many (3 per queue this node "
                        "leads, +1 per consumer group, +2 for a tiered or compacted topic); past it per-topic "
                        "series only (default 30000)")
    n.add_argument("--log-level", default="INFO")
    loc = sub.add_parser("local", help="run a local cluster, one process per node, in the foreground")
    loc.add_argument("--nodes", type=count_flag(1), default=None,
                     help="default 3 (or what --data-dir holds)")
    loc.add_argument("--groups", type=count_flag(1), default=None,
                     help="default 4 (or what --data-dir holds)")
    loc.add_argument("--replication-factor", type=int, default=3,
                     help="replicas of each data group (default 3; 1 on a one-node cluster)")
    loc.add_argument("--data-dir", default="./data")
    loc.add_argument("--port", type=count_flag(0, 65535, zero="OS-assigned"), default=0,
                     help="base port (default: OS-assigned)")
    loc.add_argument("--fsync", choices=FSYNC_POLICIES, default="always")
    loc.add_argument("--racks", type=count_flag(0, zero="no racks"), default=0,
                     help="put node i in rack r{i %% RACKS} (default 0: no racks)")
    loc.add_argument("--secure", action="store_true",
                     help="TLS on every node's ports, credentials and ACLs required: a CA, certificates, "
                          "a token secret and an admin token made under DATA_DIR/security (prints "
                          "tls-ca: PATH and admin-token-file: PATH after endpoints:)")
    return p.parse_args(argv)


def run_node(args) -> int:
    from .protocol.buffers import reuse_big_buffers
    from .app import serve

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    reuse_big_buffers()
    if args.join:
        if not args.listen or args.nodes or args.id is not None:
            print("a joining node takes --listen HOST:PORT --join H:P[,H:P] (not --id/--nodes)", file=sys.stderr)
            return 2
        addresses, args.id = (args.listen,), 0
    elif args.nodes is None or args.id is None or args.listen:
        print("give --id N --nodes H:P,... (a founding node) or --listen HOST:PORT --join H:P[,H:P] "
              "(a node joining a running cluster)", file=sys.stderr)
        return 2
    else:
        addresses = tuple(a.strip() for a in args.nodes.split(",") if a.strip())
    if not 0 <= args.id < len(addresses):
        print(f"--id {args.id} is not an index into --nodes (0..{len(addresses) - 1})", file=sys.stderr)
        return 2
    if args.replication_factor < 1:
        print(f"--replication-factor {args.replication_factor}: give 1 or more", file=sys.stderr)
        return 2
    problem = rack_problem(args.rack)
    if problem:
        print(f"--rack {args.rack!r}: {problem}", file=sys.stderr)
        return 2
    tls_given = [x for x in (args.tls_ca, args.tls_cert, args.tls_key) if x]
    if tls_given and len(tls_given) != 3:
        print("TLS needs all of --tls-ca, --tls-cert and --tls-key", file=sys.stderr)
        return 2
    if args.tls_client_cert and not tls_given:
        print("--tls-client-cert needs --tls-ca, --tls-cert and --tls-key", file=sys.stderr)
        return 2
    if tls_given:
        problem = _tls_problem(args.tls_ca, args.tls_cert, args.tls_key)
        if problem:
            print(f"rmq-storage: TLS: {problem}", file=sys.stderr)
            return 2
    if args.authorize and not tls_given:
        print("--authorize needs TLS (--tls-ca, --tls-cert, --tls-key): nodes know each other by "
              "their certificates, and a plaintext raft port would let anyone pose as a node",
              file=sys.stderr)
        return 2
    if tls_given and not args.join:
        from .protocol.placement import cluster_address, produce_address, raft_address
        mine = cluster_address(addresses[args.id])
        taken = {f(a) for a in addresses for f in (lambda x: x, raft_address, produce_address)}
        if mine in taken:
            print(f"rmq-storage: this node's cluster port {mine} (gRPC port + 3, served with TLS) is "
                  "another of the cluster's ports: give the nodes gRPC ports at least 4 apart",
                  file=sys.stderr)
            return 2
    if args.authorize and not (args.token_secret_file or args.tls_client_cert):
        print("--authorize needs a way to authenticate callers: --token-secret-file (bearer tokens) "
              "and/or --tls-client-cert (client certificates)", file=sys.stderr)
        return 2
    if args.node_names and not tls_given:
        print("--node-names needs TLS (--tls-ca, --tls-cert, --tls-key): nodes are known by their "
              "certificates", file=sys.stderr)
        return 2
    if args.token_secret_file:
        from .security.tokens import TokenKeys
        try:
            TokenKeys.from_file(args.token_secret_file)
        except ValueError as e:
            print(f"rmq-storage: {e}", file=sys.stderr)
            return 2
    try:
        umask = int(args.data_umask, 8)
        if not 0 <= umask <= 0o777 or umask & 0o700:
            raise ValueError
    except ValueError:
        print(f"--data-umask {args.data_umask}: give an octal umask that leaves the node's user "
              "its rights, 000-077 (e.g. 077, 027)", file=sys.stderr)
        return 2
    os.umask(umask)
    args.data_umask = umask
    try:
        node = _make_node(args, addresses)
    except DirectoryInUse as e:
        print(f"rmq-storage: {e}", file=sys.stderr)
        return 2
    except OSError as e:               # the raft port is taken
        print(f"rmq-storage: {e.strerror or e} (each node needs its gRPC port and the ones "
              "after it: raft, produce, cluster, HTTP)", file=sys.stderr)
        return 2
    except RuntimeError as e:          # could not join
        print(f"rmq-storage: {e}", file=sys.stderr)
        return 2
    try:
        server = serve(node)
    except RuntimeError as e:          # gRPC could not bind its port (or the cluster port)
        print(f"rmq-storage: {e} (each node needs its gRPC port and the ones after it: raft, "
              "produce, with TLS the cluster port, and HTTP)", file=sys.stderr)
        node.stop()
        return 2
    stop = _stop_on_signals()
    logging.info("node %d serving on %s", args.id, addresses[args.id])
    stop.wait()
    server.stop(grace=1)
    node.stop()
    return 0


def _tls_problem(ca: str, cert: str, key: str) -> str | None:
    """What is wrong with the TLS files, before the node starts anything (a bad
    file found later would leave a started node that never serves)."""
    import ssl

    from .protocol.tls import TlsFiles, client_context, server_context
    try:
        files = TlsFiles(ca, cert, key)
        files.read()
        server_context(files)          # PEMs parse, and the key belongs to the certificate
        client_context(files)
    except (ValueError, OSError, ssl.SSLError) as e:
        return f"{e} (--tls-ca {ca}, --tls-cert {cert}, --tls-key {key})"
    return None


def _make_node(args, addresses: tuple[str, ...]):
    from .raft.group import RaftTiming
    from .protocol.tls import TlsFiles
    from .server.node import NodeConfig, StorageNode

    return StorageNode(NodeConfig(node_id=args.id, addresses=addresses, groups=args.groups,
                                  data_dir=args.data_dir, fsync=args.fsync, rack=args.rack,
                                  sync_threads=args.journal_sync_threads,
                                  max_message_bytes=args.max_message_bytes,
                                  max_commit_backlog=args.max_commit_backlog,
                                  segment_bytes=args.segment_bytes,
                                  retention_interval=args.retention_interval,
                                  max_open_files=args.max_open_files, max_queues=args.max_queues,
                                  replication=args.replication_factor, repair_after=args.repair_after,
                                  max_requests=args.max_requests, max_parked_fetches=args.max_parked_fetches,
                                  min_free_bytes=args.min_free_bytes, scrub_interval=args.scrub_interval,
                                  scrub_bytes_per_s=args.scrub_bytes_per_s,
                                  join=tuple(a.strip() for a in (args.join or "").split(",") if a.strip()),
                                  timing=RaftTiming(compaction_entries=args.compaction_entries),
                                  tls=TlsFiles(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None,
                                  tls_client_cert=args.tls_client_cert,
                                  node_names=_names(args.node_names), authorize=args.authorize,
                                  token_secret_file=args.token_secret_file,
                                  superusers=_names(args.superusers), data_umask=args.data_umask,
                                  http=not args.no_http, metrics=not args.no_metrics,
                                  metrics_max_queue_series=args.metrics_max_queue_series))


def rack_problem(rack: str) -> str | None:
    """What is wrong with a rack name, or None."""
    from .statemachine.meta import MAX_RACK_CHARS
    if len(rack) > MAX_RACK_CHARS:
        return f"{len(rack)} characters: at most {MAX_RACK_CHARS}"
    if rack != rack.strip() or any(not (c.isalnum() or c in "-_.:/") for c in rack):
        return "letters, digits and - _ . : / only"
    return None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_local(args) -> int:
    from .local import LocalCluster

    try:
        cluster = LocalCluster(nodes=args.nodes, groups=args.groups, data_dir=args.data_dir,
                               port=args.port, fsync=args.fsync,
                               extra_args=["--replication-factor", str(args.replication_factor)],
                               secure=args.secure, racks=args.racks)
    except (ValueError, DirectoryInUse) as e:
        print(f"rmq-storage: {e}", file=sys.stderr)
        return 2
    stop = _stop_on_signals()
    try:
        # Progress goes to stderr: stdout's first line is the endpoints, which scripts read
        # (a slow start, a busy host, printed "waiting for nodes: ..." first).
        cluster.start(say=lambda line: print(line, file=sys.stderr, flush=True))     # 60 s without progress
        print(f"endpoints: {cluster.endpoints}", flush=True)
        if cluster.tls is not None:
            print(f"tls-ca: {cluster.tls.ca}", flush=True)
            print(f"admin-token-file: {cluster.token_file}", flush=True)
            print(f"tls-client-cert: {cluster.tls.cert} (key {cluster.tls.key})", flush=True)
        print(f"http: {','.join(cluster.http_urls)}  (status page, /metrics, /v1 JSON API)", flush=True)
        print(f"logs and data: {cluster.data_dir}  (Ctrl-C stops all nodes)", flush=True)
        opening, said = True, 0.0
        while not stop.wait(0.5):
            if opening and time.monotonic() - said >= 2:     # queues opened in the background
                said = time.monotonic()
                opening = _say_opening(cluster)
            for i, p in enumerate(cluster.procs):
                if p is not None and p.poll() is not None:
                    print(f"node {i} exited with {p.returncode}", flush=True)
                    cluster.procs[i] = None
    finally:
        cluster.stop()
    return 0


def _say_opening(cluster) -> bool:
    """Print "opening queues N/M" while the nodes open their queues; False once all are open."""
    open_, total = 0, 0
    for i in range(cluster.nodes):
        h = cluster.health(i) if cluster.procs[i] is not None else None
        if h is not None:
            open_, total = open_ + h.queues_open, total + h.queues_total
    if open_ < total:
        print(f"opening queues {open_:,}/{total:,} (the nodes serve meanwhile)", flush=True)
        return True
    return False


def main(argv=None) -> int:
    args = _parse(argv)
    return run_node(args) if args.cmd == "node" else run_local(args)


if __name__ == "__main__":
    sys.exit(main())
