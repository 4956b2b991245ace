"""Bearer tokens: JWTs (HS256) signed with the cluster's token secret.

Why signed tokens, not a token file: a node checks a token with the secret
alone, without a file of every token to distribute to every node and keep
in step, and a token can expire. What a file gives (revoking one token) the
metadata group gives here: a token carries its principal's *version* (the
raft index of the entry that created or last rotated it), and a node takes
it only while the metadata group still records that version, so
``rmq principal delete`` or ``create --rotate`` ends every older token on
every node. A superuser named in the nodes' configuration
(``--superusers``) that the metadata group has no record of takes version-0
tokens: the bootstrap admin token ``rmq-storage local --secure`` writes.

Claims: ``sub`` (principal), ``ver``, ``iat``, ``exp`` (optional), ``iss``
(``rmq-spark``). The secret is a file of at least 32 random bytes (hex),
the same on every node (``--token-secret-file``); anyone who holds it can
make tokens, so it is written 0600.
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass

import jwt

__all__ = ["BadToken", "Claims", "TokenKeys", "expired_message", "make_secret"]

ISSUER = "rmq-spark"
ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32


class BadToken(ValueError):
    """A token that is not valid: malformed, wrongly signed, expired, or revoked."""


def expired_message(exp: float | None) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp)) if exp else "an unknown time"
    return (f"the token expired at {when}: ask an admin for a new one "
            "(rmq principal create NAME --rotate)")


@dataclass(frozen=True)
class Claims:
    principal: str
    version: int
    expires: float | None       # unix seconds


def make_secret(path: str) -> str:
    """Write a new token secret to ``path`` (0600) unless one is there; the path."""
    if not os.path.exists(path):
        from .certs import write_private
        write_private(path, (secrets.token_hex(32) + "\n").encode())
    return path


class TokenKeys:
    """Makes and checks tokens with one secret."""

    def __init__(self, secret: bytes):
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"token secret of {len(secret)} bytes: it needs at least {MIN_SECRET_BYTES}")
        self._secret = secret

    @classmethod
    def from_file(cls, path: str) -> "TokenKeys":
        try:
            with open(path, "rb") as f:
                secret = f.read().strip()
        except OSError as e:
            raise ValueError(f"token secret {path}: {e.strerror or e}") from None
        try:
            return cls(secret)
        except ValueError as e:
            raise ValueError(f"token secret {path}: {e}") from None

    def mint(self, principal: str, version: int, ttl_s: float | None = None,
             now: float | None = None) -> str:
        now = time.time() if now is None else now
        claims = {"sub": principal, "ver": int(version), "iat": int(now), "iss": ISSUER}
        if ttl_s:
            claims["exp"] = int(now + ttl_s)
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)

    def verify(self, token: str) -> Claims:
        try:
            c = jwt.decode(token, self._secret, algorithms=[ALGORITHM], issuer=ISSUER,
                           options={"require": ["sub", "ver", "iat", "iss"]}, leeway=5)
        except jwt.ExpiredSignatureError:
            exp = jwt.decode(token, self._secret, algorithms=[ALGORITHM],
                             options={"verify_exp": False}).get("exp")
            raise BadToken(expired_message(exp)) from None
        except jwt.InvalidSignatureError:
            raise BadToken("the token's signature does not match this cluster's secret") from None
        except jwt.PyJWTError as e:
            raise BadToken(f"not a token of this cluster ({e})") from None
        if not isinstance(c["sub"], str) or not isinstance(c["ver"], int):
            raise BadToken("the token's sub or ver claim has the wrong type")
        return Claims(c["sub"], c["ver"], c.get("exp"))
