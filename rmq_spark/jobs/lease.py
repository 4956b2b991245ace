"""One job of a kind per topic: a lease in the metadata group.

Two tiering jobs with different checkpoints would each append the same
messages to the archive (Delta's idempotent append keys on the checkpoint's
query id), and two compaction jobs would each move the compaction
watermark. So a job takes the topic's lease of its kind (``tier``,
``compact``) before it starts, a
thread of its own renews it every third of the TTL while the query runs, and
the job gives it back when it ends. The owner is the job's checkpoint: a job
restarted on the same checkpoint (after a kill) is the same job and takes its
lease back at once; any other checkpoint waits until the lease lapses, at
most ``TTL_S`` after the last renewal of a job that died.

Time is counted from before each granting request was sent, so the job's
idea of when its lease lapses is never later than the leader's. A job that
cannot renew for 90% of the TTL (cluster unreachable, driver paused) treats
the lease as lost and stops; so does one whose renewal is refused (the lease
lapsed and another job took it). Before a Delta append the job checks the
lease (no RPC while the last grant is recent; a renewal under a new token means
another job held the topic in between, and counts as lost), and every watermark move
carries the lease's fencing token (``token``): the metadata group refuses a
move under a token that is not the topic's current lease, so a job that lost
its lease (paused, cut off) moves no watermark and so deletes no hot data.
A Delta archive's appends carry the token too (``_fence``): one that a paused
job commits after another job took over fails or is skipped by Delta.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from rmq_spark.client import Client
from rmq_spark.client.errors import RmqError
from rmq_spark.units import utc_text

from .errors import JobConfigError

__all__ = ["JobLease", "LeaseLost", "TTL_S", "MIN_TTL_S", "MAX_TTL_S", "check_ttl"]

log = logging.getLogger(__name__)
TTL_S = 30.0
MIN_TTL_S = 3.0      # renewals every second; a shorter lease lapses on a driver's GC pause
MAX_TTL_S = 86_400.0     # the nodes' limit (MAX_LEASE_MS)
FRESH = 0.5          # a grant younger than this share of the TTL needs no RPC to check
GIVE_UP = 0.9        # unrenewed for this share of the TTL: treat the lease as lost


def check_ttl(ttl_s: float, error: type[JobConfigError]) -> float:
    """``ttl_s`` if it is a lease TTL a job may use, else ``error`` naming the range."""
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise error(f"lease TTL {ttl_s:g} s: use {MIN_TTL_S:g}-{MAX_TTL_S:g} s (a job that "
                    f"died holds its topic this long; the job renews every third of it)")
    return ttl_s


class LeaseLost(RmqError):
    """The job's lease lapsed (and maybe another job took the topic): it must not append."""


class JobLease:
    """A job's lease on its topic; a subclass names the kind, the job and its config error."""
    KIND = ""
    JOB = ""                          # "tiering", for messages
    VERB = ""                         # "tiered"
    CONFIG_ERROR: type[JobConfigError] = JobConfigError

    def __init__(self, endpoints: str, topic: str, owner: str, ttl_s: float | None = None,
                 tls=None, token: str | None = None):
        self.topic, self.owner = topic, owner
        self.ttl_s = TTL_S if ttl_s is None else ttl_s
        # Its own client: a lease call must give up well within the TTL.
        step = max(0.05, self.ttl_s / 3)
        self.client = Client(endpoints, timeout=step, attempt_timeout=min(5.0, step), tls=tls,
                             token=token)
        self._granted_at: float | None = None      # monotonic, taken before the request
        self.token = 0                              # the lease's fencing token, once granted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ take/check
    def take(self) -> None:
        """Take the lease or raise the job's config error naming the job that holds it."""
        sent = time.monotonic()
        granted, holder, expires, token = self.client.lease(self.topic, self.KIND, self.owner,
                                                            self._ttl_ms())
        if not granted:
            raise self.CONFIG_ERROR(
                f"topic {self.topic!r} is being {self.VERB} by another job (checkpoint {holder}); "
                f"its lease runs until {utc_text(expires)} and is renewed while it runs. Stop "
                f"that job first, or, if it died, start again once its lease lapses (at most "
                f"{self.ttl_s:g} s after its last renewal); a job restarted on that checkpoint "
                "takes the lease back at once")
        self._granted_at, self.token = sent, token

    def check(self) -> None:
        """Before an append: ``LeaseLost`` unless the lease is surely still this job's."""
        if self._granted_at is not None and self._age() < self.ttl_s * FRESH:
            return
        self._renew()

    def _renew(self) -> None:
        sent = time.monotonic()
        try:
            granted, holder, expires, token = self.client.lease(self.topic, self.KIND, self.owner,
                                                                self._ttl_ms())
        except Exception as e:               # noqa: BLE001 - judged by the lease's age
            if self._granted_at is None or self._age() >= self.ttl_s * GIVE_UP:
                raise LeaseLost(f"{self.JOB} of {self.topic!r} with checkpoint {self.owner}: could "
                                f"not renew the lease for {self.ttl_s * GIVE_UP:g} s ({e}); "
                                "another job may take the topic, so this one stops") from e
            log.warning("%s %s: lease renewal failed (%s); retrying", self.JOB, self.topic, e)
            return
        if not granted:
            raise LeaseLost(f"{self.JOB} of {self.topic!r} with checkpoint {self.owner}: the lease "
                            f"lapsed and the job with checkpoint {holder} holds it (until "
                            f"{utc_text(expires)}); this job stops without appending")
        if self.token and token != self.token:
            # Granted again, under a new token: another job held the topic in between
            # (and let it go). What this job planned from its checkpoint may be archived
            # already; only a restart checks where the archive ends.
            raise LeaseLost(f"{self.JOB} of {self.topic!r} with checkpoint {self.owner}: the lease "
                            f"lapsed and another job held the topic meanwhile (lease token "
                            f"{self.token} -> {token}); this job stops without appending. "
                            "Start it again: it resumes only if the archive did not move past "
                            "its checkpoint")
        self._granted_at, self.token = sent, token

    def _age(self) -> float:
        return time.monotonic() - self._granted_at

    # --------------------------------------------------------------- renewal
    def start_renewing(self, on_lost: Callable[[LeaseLost], None]) -> None:
        """Renew every third of the TTL on a daemon thread until ``release``."""
        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    self._renew()
                except LeaseLost as e:
                    on_lost(e)
                    return
        self._thread = threading.Thread(target=loop, name=f"rmq-{self.KIND}-lease-{self.topic}",
                                        daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and give the lease back (best effort: otherwise it lapses)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            if self._granted_at is not None:
                self.client.lease(self.topic, self.KIND, self.owner, 0)
        except Exception as e:               # noqa: BLE001 - it lapses on its own
            log.warning("%s %s: could not release the lease (%s); it lapses in %g s",
                        self.JOB, self.topic, e, self.ttl_s)
        finally:
            self._granted_at = None
            self.client.close()

    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))
