"""A tiering job's Delta appends carry its lease token, and Delta refuses a stale one.

The lease (``_lease``) keeps one job per topic, but a job that paused between
its lease check and Delta's commit (GC, SIGSTOP, a partition) would still
append once it resumed, after another job took the topic over: the archive
would hold those messages twice. So every append of a topic's tiering job uses
Delta's idempotent-write identity with one app id per topic,
``rmq-tier-fence/TOPIC``, and a version that starts with the job's lease token:
``token << 32 | batch + 1``. Delta skips a write whose version is not above the
one recorded for the app id, and fails a write whose transaction began before
another commit recorded a version for the same app id
(ConcurrentTransactionException). A job that takes the topic over commits an
empty append at ``token << 32`` (``raise_fence``) before it looks at where the
archive ends. From then on:

* a paused job's append whose transaction began before the fence fails on commit;
* one that begins after it carries a lower token and is skipped: it appends
  nothing, and its watermark move is refused by the metadata group (the token
  is not the topic's lease), so the job stops.

Tokens grow with the raft index that granted them and stay with one owner (a
job restarted on its checkpoint keeps its token), so a replayed batch has the
version it had and Delta skips it as before. One case cannot be told apart: a
checkpoint with a batch planned but not committed whose token changed (another
job held the topic meanwhile): whether that batch reached the archive is not
recorded under the new token, so ``check_resume`` refuses it; a new checkpoint
starts where the archive ends.
"""
from __future__ import annotations

from rmq_spark import fs

from rmq_spark.archive.reader import delta_txn_version

from .errors import TierConfigError

__all__ = ["app_id", "batch_version", "check_resume", "legacy_app_id", "raise_fence", "token_of"]

_SHIFT = 32
_TOKEN_FILE = "rmq_tier_token"      # in the checkpoint: the token its batches were written under


def app_id(topic: str) -> str:
    return f"rmq-tier-fence/{topic}"


def legacy_app_id(topic: str, query_id: str) -> str:
    """The per-checkpoint id of appends before fencing (a replay may still find it)."""
    return f"rmq-tier/{topic}/{query_id}"


def batch_version(token: int, batch_id: int) -> int:
    return (token << _SHIFT) | (batch_id + 1)


def token_of(version: int) -> int:
    return version >> _SHIFT


def raise_fence(path: str, topic: str, token: int, append_empty) -> None:
    """Before a job with ``token`` plans anything: make every older token's append fail
    or be skipped. ``append_empty(version)`` commits an empty append (it creates the
    archive if there is none). A newer token already recorded means this job lost the
    topic before it started."""
    recorded = delta_txn_version(path, app_id(topic))
    if recorded is not None and token_of(recorded) > token:
        raise TierConfigError(
            f"archive {path} of topic {topic!r} is fenced by a newer tiering job (lease token "
            f"{token_of(recorded)}; this job holds {token}): another job took the topic over")
    if recorded is None or token_of(recorded) < token:
        append_empty(token << _SHIFT)


def check_resume(path: str, topic: str, checkpoint: str, token: int, pending: int | None) -> None:
    """Refuse to resume a checkpoint whose planned batch ``pending`` (not committed)
    was planned under another token than ``token``; then record ``token`` for it."""
    marker = fs.join(checkpoint, _TOKEN_FILE)
    try:
        before = int(fs.read_text(marker).strip() or 0)
    except FileNotFoundError:
        before = None
    if pending is not None and before is not None and before != token:
        raise TierConfigError(
            f"checkpoint {checkpoint} planned batch {pending} under lease token {before}, and "
            f"another tiering job held topic {topic!r} since (the token is now {token}): whether "
            f"that batch reached archive {path} cannot be told, so resuming could archive it "
            "twice. Start with a new (empty) checkpoint: it starts where the archive ends")
    if before != token:
        fs.write_bytes(marker, str(token).encode())
