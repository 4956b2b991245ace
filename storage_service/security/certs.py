"""A small certificate authority for a cluster: the CA, node and client certificates.

``rmq-storage local --secure`` makes one under its data directory
(``ensure_local``): a CA, one certificate every node serves and presents to
its peers (names: the nodes' addresses, ``localhost``), and one client
certificate for the admin. Keys are EC P-256, written 0600. A production
cluster brings its own PEM files (``--tls-ca/--tls-cert/--tls-key``).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Issued", "certificate_common_name", "ensure_local", "issue", "make_ca", "write_private"]

CA_DAYS, LEAF_DAYS = 3650, 825


@dataclass(frozen=True)
class Issued:
    cert: str           # PEM paths
    key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rmq-spark"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: str, data: bytes, private: bool = False) -> None:
    """``data`` to ``path`` atomically; ``private``: mode 0600 from its first byte (a
    leftover temporary file, whatever its mode, is removed, never written into)."""
    tmp = f"{path}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_private(path: str, data: bytes) -> None:
    """A secret (key, token) to ``path``, mode 0600."""
    _write(path, data, private=True)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(folder: str, name: str = "rmq-spark cluster CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    out = Issued(os.path.join(folder, "ca.pem"), os.path.join(folder, "ca-key.pem"))
    _write(out.key, _key_pem(key), private=True)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM))
    return out


def issue(ca: Issued, folder: str, stem: str, common_name: str, hosts: tuple[str, ...] = (),
          days: int = LEAF_DAYS, not_before: dt.datetime | None = None) -> Issued:
    """A certificate for ``common_name`` (the principal a peer sees), valid for the
    IP addresses and DNS names ``hosts``, for servers and clients alike."""
    with open(ca.key, "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), None)
    with open(ca.cert, "rb") as f:
        ca_cert = x509.load_pem_x509_certificate(f.read())
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    b = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                               ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                        critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
                        critical=False))
    if names:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    out = Issued(os.path.join(folder, f"{stem}.pem"), os.path.join(folder, f"{stem}-key.pem"))
    _write(out.key, _key_pem(key), private=True)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM))
    return out


def certificate_common_name(cert_path: str) -> str:
    """The subject CN of the PEM certificate at ``cert_path`` (a node's: peers know it by it)."""
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError(f"{cert_path}: the node certificate has no common name (CN): "
                         "peers recognise nodes by it")
    return str(names[0].value)


def _names_cover(cert_path: str, names: tuple[str, ...]) -> bool:
    """Whether the certificate's subject alternative names include every one of ``names``."""
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    return set(names) <= have


def ensure_local(data_dir: str, hosts: tuple[str, ...]) -> tuple[Issued, Issued, Issued]:
    """(CA, node, admin client) under ``DATA_DIR/security``; made once, kept after."""
    folder = os.path.join(data_dir, "security")
    os.makedirs(folder, exist_ok=True)
    ca = Issued(os.path.join(folder, "ca.pem"), os.path.join(folder, "ca-key.pem"))
    node = Issued(os.path.join(folder, "node.pem"), os.path.join(folder, "node-key.pem"))
    if not (os.path.exists(ca.cert) and os.path.exists(ca.key)):
        if os.path.exists(node.cert):
            raise ValueError(f"{folder}: certificates are there but not the CA (ca.pem and "
                             "ca-key.pem); put them back - a new CA would not be trusted by them")
        ca = make_ca(folder)
    names = tuple(dict.fromkeys((*hosts, "127.0.0.1", "localhost")))
    if not os.path.exists(node.cert) or not _names_cover(node.cert, names):
        node = issue(ca, folder, "node", "node", names)
    admin = Issued(os.path.join(folder, "admin.pem"), os.path.join(folder, "admin-key.pem"))
    if not os.path.exists(admin.cert):
        admin = issue(ca, folder, "admin", "admin")
    return ca, node, admin
