"""Files wherever an archive, a table or a checkpoint lives: a local path or a URI.

The Python side (the planner, executors' archive reads, the tiering job's
bookkeeping, retention's sweep, ``KeyLookup``, ``rmq get``) reads and writes
through pyarrow's filesystems; Spark reads and writes the same locations
through Hadoop's (``to_spark``). One name works for both:

* a local path (``/data/archive``, ``file:///data/archive``);
* ``s3a://BUCKET/PREFIX`` (also ``s3://``): pyarrow's S3 filesystem, configured
  the way AWS tools are: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN`` or ``AWS_PROFILE``, ``AWS_REGION`` (or
  ``AWS_DEFAULT_REGION``), ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an
  S3-compatible store (path-style addressing then). Tested against a real
  S3-compatible server (moto);
* any other URI pyarrow has a filesystem for (``gs://``, ``hdfs://``,
  ``abfs://``): expected to work, not tested here.

Secrets never leave this module: filesystems are built from the environment
and messages name only the URI.
"""
from __future__ import annotations

import os
import re
import threading
from typing import Iterator
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

__all__ = ["OBJECT_SCHEMES", "file_uri", "StoreError", "masked", "userinfo_refusal", "exists", "is_local", "join", "list_names", "open_input", "read_bytes",
           "read_text", "remove", "resolve", "size", "stamp", "to_spark", "walk_files", "write_bytes",
           "check_writable"]

_S3_SCHEMES = ("s3", "s3a", "s3n")
# Schemes a job location may use besides local paths: S3 (tested), and what pyarrow and
# Hadoop both have filesystems for (expected to work, untested).
OBJECT_SCHEMES = ("s3a", "s3", "s3n", "gs", "hdfs", "abfs", "abfss")
_cache: dict = {}
_cache_lock = threading.Lock()


class StoreError(OSError):
    """A location could not be used: what, where, and what to check."""


# Bucket stores: a bucket name has no ':' or '@', so either before the key means
# credentials (a secret may hold '/', so "before the key" is up to the last '@').
_BUCKET_SCHEMES = ("s3a", "s3", "s3n", "gs")
_USERINFO = re.compile(r"^(s3a|s3n|s3|gs)://(?:[^/@:]*@|[^/@:]*:[^@]*@)")


def masked(uri: str) -> str:
    """``uri`` with any credentials before its bucket replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}://***@", uri)


def userinfo_refusal(uri: str) -> str | None:
    """Why ``uri`` is refused if it carries credentials (``s3a://KEY:SECRET@bucket``:
    they would show in configs, logs and plans), with them masked; else None."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in _BUCKET_SCHEMES:
        return None
    host = rest.split("/", 1)[0]
    if not _USERINFO.match(uri) and ":" not in host and "@" not in host:
        return None
    shown = masked(uri) if _USERINFO.match(uri) else f"{scheme}://***"
    return (f"{shown}: credentials in the URI are not supported (they would show in configs, "
            "logs and plans); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE")


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def _local_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def to_spark(uri: str) -> str:
    """The name Spark's Hadoop filesystems know the location by (``s3://`` -> ``s3a://``)."""
    scheme, sep, rest = uri.partition("://")
    if sep and scheme in ("s3", "s3n"):
        return f"s3a://{rest}"
    return uri


def join(root: str, *parts: str) -> str:
    if is_local(root):
        return os.path.join(_local_path(root), *parts)
    out = root.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def _s3_settings() -> tuple:
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
    # the credentials' identity only (a changed key gets a new filesystem), never kept
    who = (env.get("AWS_ACCESS_KEY_ID", ""), hash(env.get("AWS_SECRET_ACCESS_KEY", "")),
           env.get("AWS_PROFILE", ""))
    return endpoint, region, who


def _s3_filesystem() -> pafs.FileSystem:
    endpoint, region, who = _s3_settings()
    key = ("s3", endpoint, region, who)
    with _cache_lock:
        fs = _cache.get(key)
        if fs is None:
            # no region set: pyarrow's own chain (the profile's, else us-east-1), as S3A's
            kwargs: dict = {"region": region} if region else {}
            if endpoint:
                url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
                kwargs.update(endpoint_override=url.netloc, scheme=url.scheme or "https",
                              force_virtual_addressing=False)
            fs = pafs.S3FileSystem(**kwargs)
            _cache[key] = fs
        return fs


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path on it) for ``uri``."""
    if is_local(uri):
        return pafs.LocalFileSystem(), _local_path(uri)
    scheme, _, rest = uri.partition("://")
    if scheme in _S3_SCHEMES:
        return _s3_filesystem(), rest.rstrip("/")       # names from logs are decoded already
    return pafs.FileSystem.from_uri(uri)       # gs://, hdfs://, abfs://: as pyarrow knows them


def _wrap(uri: str, e: OSError, doing: str) -> OSError:
    """A clear error naming the URI for what the store refused (a missing file stays
    FileNotFoundError)."""
    if isinstance(e, FileNotFoundError):
        return e
    text = str(e)
    if any(w in text for w in ("ACCESS_DENIED", "AccessDenied", "403", "InvalidAccessKeyId",
                               "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch",
                               "SIGNATURE_DOES_NOT_MATCH")):
        return StoreError(f"{uri}: access denied while {doing}; check the credentials "
                          "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and that "
                          f"they may read and write there ({text.splitlines()[0]})")
    if "NoSuchBucket" in text or "NO_SUCH_BUCKET" in text:
        return StoreError(f"{uri}: the bucket does not exist ({text.splitlines()[0]})")
    return StoreError(f"{uri}: {doing} failed: {text.splitlines()[0] if text else type(e).__name__}")


def exists(uri: str) -> bool:
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as e:
        raise _wrap(uri, e, "looking it up") from e


def size(uri: str) -> int | None:
    """Bytes in the file at ``uri``; None when it does not exist."""
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
    except OSError as e:
        raise _wrap(uri, e, "looking it up") from e
    return None if info.type == pafs.FileType.NotFound else info.size


def stamp(uri: str) -> tuple[int, int] | None:
    """(bytes, modified ns) of the file at ``uri``, None if missing: tells a file
    written again apart from the one read before (one HEAD on an object store)."""
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
    except OSError as e:
        raise _wrap(uri, e, "looking it up") from e
    if info.type == pafs.FileType.NotFound:
        return None
    return info.size, info.mtime_ns or 0


def list_names(uri: str) -> list[str] | None:
    """Names directly under the folder ``uri`` (a LIST on an object store); None if none."""
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        if isinstance(e, NotADirectoryError):
            return None
        raise _wrap(uri, e, "listing it") from e
    if not infos and fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    return [i.base_name for i in infos]


def walk_files(uri: str) -> Iterator[tuple[str, int, float]]:
    """(uri, bytes, modified epoch seconds) of every file under ``uri``, recursively."""
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as e:
        raise _wrap(uri, e, "listing it") from e
    for i in infos:
        if i.type == pafs.FileType.File:
            rel = i.path[len(path):].lstrip("/")
            mtime = i.mtime.timestamp() if i.mtime is not None else 0.0
            yield join(uri, rel), i.size or 0, mtime


def open_input(uri: str):
    """A readable binary file; FileNotFoundError when there is none."""
    fs, path = resolve(uri)
    try:
        return fs.open_input_file(path)
    except OSError as e:
        raise _wrap(uri, e, "opening it") from e


def read_bytes(uri: str) -> bytes:
    with open_input(uri) as f:
        return f.read()


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def write_bytes(uri: str, data: bytes) -> None:
    """The whole file at once: on an object store one PUT (readers see all or
    nothing); on a local disk written beside it, synced and renamed over it."""
    if is_local(uri):
        path = _local_path(uri)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    fs, path = resolve(uri)
    try:
        with fs.open_output_stream(path) as out:
            out.write(data)
    except OSError as e:
        raise _wrap(uri, e, "writing it") from e


def remove(uri: str) -> bool:
    """Delete the file at ``uri``; False if it was not there."""
    fs, path = resolve(uri)
    try:
        fs.delete_file(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        raise _wrap(uri, e, "deleting it") from e


def check_writable(uri: str, what: str) -> None:
    """Refuse early, naming ``uri``, a location the job could not write: a missing
    bucket or folder, credentials the store refuses. Writes nothing."""
    if is_local(uri):
        return
    fs, path = resolve(uri)
    bucket = path.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket) if uri.partition("://")[0] in _BUCKET_SCHEMES else None
        if info is not None and info.type == pafs.FileType.NotFound:
            raise StoreError(f"{what} {uri}: bucket {bucket!r} does not exist (or these credentials "
                             "cannot see it); create it first - nothing was written")
        fs.get_file_info(path)              # the credentials may read here
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(f"{what} {uri}: {_wrap(uri, e, 'checking it')} - nothing was written") from e


def file_uri(raw: str) -> str:
    """A logged file URI as this package names it: ``file:`` URIs as local paths,
    others (``s3a://bucket/key``) unquoted."""
    if raw.startswith("file:"):
        return unquote(urlparse(raw).path)
    return unquote(raw)
