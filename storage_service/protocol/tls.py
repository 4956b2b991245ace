"""TLS settings shared by a node's ports and by clients.

One ``TlsFiles`` (CA, certificate, key: PEM paths) configures a node's gRPC
server, its produce port and its calls to peers, and a client's channels and
produce connections. The CA alone is enough for a client without a
certificate of its own (server authentication only). Certificates must name
the address they are reached at (IP or DNS in the subject alternative names).
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = ["TlsFiles", "common_name", "channel_credentials", "client_context", "server_context", "server_credentials"]


@dataclass(frozen=True)
class TlsFiles:
    ca: str                      # PEM: the CA that signed the nodes' (and clients') certificates
    cert: str | None = None      # PEM: this side's certificate (a node's, or a client's for mTLS)
    key: str | None = None       # PEM: its private key

    def __post_init__(self):
        if (self.cert is None) != (self.key is None):
            raise ValueError("a TLS certificate needs its key and a key its certificate "
                             f"(cert={self.cert!r}, key={self.key!r})")

    def read(self) -> tuple[bytes, bytes | None, bytes | None]:
        def load(path):
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ValueError(f"TLS file {path}: {e.strerror or e}") from None
        return load(self.ca), load(self.cert), load(self.key)


def server_credentials(files: TlsFiles, require_client_cert: bool = False):
    import grpc
    ca, cert, key = files.read()
    if cert is None:
        raise ValueError("a TLS server needs --tls-cert and --tls-key")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=require_client_cert)


def channel_credentials(files: TlsFiles):
    import grpc
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def server_context(files: TlsFiles, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    ctx.load_verify_locations(files.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(files.ca)
    if files.cert:
        ctx.load_cert_chain(files.cert, files.key)
    return ctx


def common_name(cert: dict | None) -> str | None:
    """The subject common name of a certificate as ``SSLSocket.getpeercert()`` gives it."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
