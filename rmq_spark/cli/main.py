"""rmq: topics, produce, consume, offsets, cluster status, tiering and compaction,
key-value on compact topics, from the shell.

Endpoints come from --endpoints or the RMQ_ENDPOINTS environment variable
(host:port,host:port,...); a cluster with TLS takes --tls-ca (RMQ_TLS_CA), and
--tls-cert/--tls-key (RMQ_TLS_CERT/RMQ_TLS_KEY) where nodes require a client
certificate, and a cluster with ACLs a bearer token: --token (RMQ_TOKEN) or
--token-file (RMQ_TOKEN_FILE). Exit codes: 0 done, 1 failed, 2 bad input (nothing
changed), 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import os
import sys

from ..client import Client, RmqError, TlsFiles, parse_endpoints
from ..fs import StoreError
from . import _consume, _jobs, _kv, _produce, _security, _status, _topics

__all__ = ["main"]

CONNECT_SECONDS = 3.0

COMMANDS = {"topic": _topics.cmd_topic, "produce": _produce.cmd_produce, "consume": _consume.cmd_consume,
            "offsets": _status.cmd_offsets, "cluster": _status.cmd_cluster, "tier": _jobs.cmd_tier,
            "compact": _jobs.cmd_compact, "get": _jobs.cmd_get, "principal": _security.cmd_principal,
            "acl": _security.cmd_acl, "kv": _kv.cmd_kv}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rmq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default=os.environ.get("RMQ_ENDPOINTS", ""),
                   help="host:port,... of the storage nodes (default: $RMQ_ENDPOINTS)")
    p.add_argument("--tls-ca", default=os.environ.get("RMQ_TLS_CA"),
                   help="PEM: the cluster's CA; calls go over TLS (default: $RMQ_TLS_CA)")
    p.add_argument("--tls-cert", default=os.environ.get("RMQ_TLS_CERT"),
                   help="PEM: a client certificate, for nodes that require one (default: $RMQ_TLS_CERT)")
    p.add_argument("--tls-key", default=os.environ.get("RMQ_TLS_KEY"),
                   help="PEM: its key (default: $RMQ_TLS_KEY)")
    p.add_argument("--token", default=os.environ.get("RMQ_TOKEN"),
                   help="a bearer token (rmq principal create) for a cluster with ACLs (default: $RMQ_TOKEN; "
                        "visible to other users of this machine in ps: prefer --token-file)")
    p.add_argument("--token-file", default=os.environ.get("RMQ_TOKEN_FILE"),
                   help="a file holding the bearer token (default: $RMQ_TOKEN_FILE)")
    sub = p.add_subparsers(dest="cmd", required=True)
    _topics.add_parser(sub)
    _produce.add_parser(sub)
    _consume.add_parser(sub)
    _status.add_parsers(sub)
    _jobs.add_parsers(sub)
    _security.add_parsers(sub)
    _kv.add_parser(sub)
    return p


def _reachable(client: Client, endpoints: list[str]) -> bool:
    """Whether any node answers within CONNECT_SECONDS (a wrong endpoint fails fast);
    a node's refusal (UNAUTHENTICATED, a TLS handshake it refused) is raised."""
    for address in endpoints:
        try:
            client.health(address, timeout=CONNECT_SECONDS / len(endpoints))
            return True
        except RmqError as e:
            if not e.retriable:     # the node answered (a token, a TLS refusal): its reason
                raise
            continue
    return False


def _tls(a) -> TlsFiles | None:
    """The TLS files given (checked readable), or None for plaintext."""
    if not a.tls_ca:
        if a.tls_cert or a.tls_key:
            raise ValueError("--tls-cert/--tls-key need --tls-ca (or RMQ_TLS_CA): the CA the "
                             "nodes' certificates are checked against")
        return None
    import ssl

    from storage_service.protocol.tls import client_context
    tls = TlsFiles(a.tls_ca, a.tls_cert, a.tls_key)
    try:
        client_context(tls)            # the PEMs parse, and a key belongs to its certificate
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"TLS files (--tls-ca {a.tls_ca}, --tls-cert {a.tls_cert}, "
                         f"--tls-key {a.tls_key}): {e}") from None
    return tls


def _token(a) -> str | None:
    if a.token and a.token_file:
        raise ValueError("give --token or --token-file (RMQ_TOKEN or RMQ_TOKEN_FILE), not both")
    if not a.token_file:
        return a.token or None
    try:
        with open(a.token_file) as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(f"--token-file {a.token_file}: {e.strerror or e}") from None
    if not token:
        raise ValueError(f"--token-file {a.token_file} is empty")
    return token


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if not a.endpoints:
        print("rmq: no endpoints: pass --endpoints host:port,... or set RMQ_ENDPOINTS", file=sys.stderr)
        return 2
    try:
        endpoints = parse_endpoints(a.endpoints)
        tls = _tls(a)
        token = _token(a)
    except ValueError as e:
        print(f"rmq: {e}", file=sys.stderr)
        return 2
    try:
        with Client(endpoints, tls=tls, token=token) as client:
            if not _reachable(client, endpoints):
                tls_hint = (" Over TLS: is --tls-ca the cluster's CA, and do the nodes want a client "
                            "certificate (--tls-cert/--tls-key)?" if tls else
                            " If the cluster uses TLS, give --tls-ca (or RMQ_TLS_CA).")
                print(f"rmq: no node answered at {', '.join(endpoints)} within {CONNECT_SECONDS:.0f} s: "
                      "is the cluster running, and are --endpoints / RMQ_ENDPOINTS right?" + tls_hint,
                      file=sys.stderr)
                return 2
            return COMMANDS[a.cmd](client, a)
    except (RmqError, ValueError, StoreError) as e:      # StoreError: an archive or table's store
        print(f"rmq: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nrmq: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (| head): stop quietly, and keep Python from
        # complaining about the closed stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
