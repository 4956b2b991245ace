"""TLS settings shared by a node's ports and by clients.

One ``TlsFiles`` (CA, certificate, key: PEM paths) configures a node's gRPC
server, its produce port and its calls to peers, and a client's channels and
produce connections. The CA alone is enough for a client without a
certificate of its own (server authentication only). Certificates must name
the address they are reached at (IP or DNS in the subject alternative names).
"""
from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass

__all__ = ["TlsBuffers", "TlsSocket", "TlsFiles", "common_name", "channel_credentials", "client_context", "server_context", "server_credentials",
           "wants_client_certificate"]


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


def wants_client_certificate(address: str, files: TlsFiles, timeout: float = 2.0) -> bool:
    """Whether the gRPC server at ``address`` closes a TLS connection that has no
    client certificate: gRPC reports that only as "Socket closed". The probe
    completes a TLS 1.3 handshake as the client would (so the CA is right), then
    waits for the server's first HTTP/2 frame: a server that requires a
    certificate closes the connection (or sends an alert) instead."""
    host, _, port = address.rpartition(":")
    ctx = client_context(TlsFiles(files.ca))
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                try:
                    return s.recv(1) == b""
                except ssl.SSLError:            # an alert: certificate required
                    return True
    except (OSError, ValueError):               # no handshake, or no answer in time
        return False


def common_name(cert: dict | None) -> str | None:
    """The subject common name of a certificate as ``SSLSocket.getpeercert()`` gives it."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


class TlsBuffers:
    """TLS of one connection as an ``SSLObject`` over memory buffers: the socket moves
    ciphertext in big reads, this turns it into plaintext and back.

    An ``SSLSocket`` reads one TLS record (16 KiB at most) per call, with two
    ``recv`` syscalls each (header, body) and a poll when it has a timeout: a
    1 MiB produce request cost ~130 syscalls to read. Here one ``recv`` of up to
    256 KiB feeds every record in it. It also lets two threads share a
    connection (one receiving, others sending: the client's produce port),
    which OpenSSL's SSL object allows only if its every use is under one lock,
    as here. Ciphertext must leave in the order ``encrypt`` made it.
    """

    def __init__(self, context: ssl.SSLContext, server_side: bool = False, host: str | None = None):
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=server_side,
                                     server_hostname=None if server_side else host)
        self._lock = threading.Lock()

    def handshake(self, sock: socket.socket) -> None:
        """The handshake over a blocking socket (its timeout bounds each wait)."""
        while not self.step():
            if self._out.pending:
                sock.sendall(self._out.read())
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the peer closed the connection during the TLS handshake")
            self.feed(data)
        if self._out.pending:
            sock.sendall(self._out.read())

    def step(self) -> bool:
        """One handshake step with what has been fed: True once it is done (what it
        wants sent is in ``output()``); ssl.SSLError if the peer is refused."""
        with self._lock:
            try:
                self._obj.do_handshake()
                return True
            except ssl.SSLWantReadError:
                return False

    def feed(self, data) -> None:
        """Ciphertext read from the socket, kept until decrypted or handshaken."""
        with self._lock:
            self._in.write(data)

    def output(self) -> bytes:
        """Ciphertext waiting to be sent."""
        with self._lock:
            return self._out.read()

    def getpeercert(self) -> dict | None:
        return self._obj.getpeercert()

    def encrypt(self, *parts) -> bytes:
        """The records of ``parts`` (and anything TLS had waiting to go out), in order."""
        with self._lock:
            for p in parts:
                if len(p):
                    self._obj.write(p)
            return self._out.read()

    def decrypt(self, data) -> bytes:
        """Plaintext of ``data`` and whatever was buffered before it (b"" until a
        record is whole); ConnectionError once the peer closed the session."""
        out = bytearray()
        self.decrypt_into(data, out)
        return bytes(out)

    def decrypt_into(self, data, out: bytearray) -> int:
        """``decrypt``, appended to ``out``; the bytes appended."""
        n = 0
        with self._lock:
            if len(data):
                self._in.write(data)
            while True:
                try:
                    chunk = self._obj.read(1 << 17)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    raise ConnectionError("the peer closed the TLS session") from None
                if not chunk:
                    break
                out += chunk
                n += len(chunk)
        return n

    def read_into(self, buf) -> int:
        """Plaintext straight into ``buf`` (one record at most); 0 until one is whole."""
        with self._lock:
            try:
                return self._obj.read(len(buf), buf)
            except ssl.SSLWantReadError:
                return 0
            except ssl.SSLZeroReturnError:
                raise ConnectionError("the peer closed the TLS session") from None


class TlsSocket:
    """A blocking socket's TLS (``TlsBuffers``) with the calls a one-thread server
    makes of a socket: ``recv_into``, ``sendall``, ``sendmsg``, ``getpeercert``."""
    RAW = 256 << 10

    def __init__(self, sock: socket.socket, context: ssl.SSLContext):
        self.sock = sock
        self.tls = TlsBuffers(context, server_side=True)
        self.tls.handshake(sock)
        self._raw = bytearray(self.RAW)

    def recv_into(self, buf) -> int:
        """Decrypted straight into ``buf``; what came with the handshake's last read
        (the peer's first bytes) is in TLS's buffer already."""
        if not len(buf):
            return 0
        with memoryview(buf) as view:
            filled = 0
            while True:
                # every whole record TLS holds, one call for the caller (a record is 16 KiB
                # at most; a produce request is up to megabytes)
                while filled < len(view):
                    n = self.tls.read_into(view[filled:])
                    if not n:
                        break
                    filled += n
                if filled:
                    return filled
                got = self.sock.recv_into(self._raw)
                if not got:
                    return 0
                with memoryview(self._raw) as raw:
                    self.tls.feed(raw[:got])

    def sendall(self, data) -> None:
        self.sock.sendall(self.tls.encrypt(data))

    def sendmsg(self, parts) -> int:
        self.sock.sendall(self.tls.encrypt(*parts))
        return sum(len(p) for p in parts)

    def getpeercert(self) -> dict | None:
        return self.tls.getpeercert()

    def settimeout(self, t) -> None:
        self.sock.settimeout(t)

    def getpeername(self):
        return self.sock.getpeername()

    def shutdown(self, how) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
