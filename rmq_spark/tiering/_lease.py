"""One tiering job per topic: a lease in the metadata group.

Two tiering jobs with different checkpoints would each append the same
messages to the archive (Delta's idempotent append keys on the checkpoint's
query id). So a job takes the topic's ``tier`` lease before it starts, renews
it while it runs (from the monitor, and before every Delta append), and gives
it back when it ends. The owner is the job's checkpoint: a job restarted on
the same checkpoint (after a kill) is the same job and takes its lease back
at once; any other checkpoint waits until the lease lapses, at most
``TTL_S`` after the last renewal of a job that died.
"""
from __future__ import annotations

import logging
import time

from rmq_spark.cli._format import utc_text
from rmq_spark.client import Client

from .errors import TierConfigError, TieringError

__all__ = ["LeaseLost", "TierLease", "TTL_S"]

log = logging.getLogger(__name__)
KIND = "tier"
TTL_S = 30.0


class LeaseLost(TieringError):
    """The job's lease lapsed and another job took the topic: this job must not append."""


class TierLease:
    def __init__(self, client: Client, topic: str, owner: str, ttl_s: float | None = None):
        self.client, self.topic, self.owner = client, topic, owner
        self.ttl_s = TTL_S if ttl_s is None else ttl_s
        self._renewed: float | None = None          # monotonic time of the last grant

    def take(self) -> None:
        """Take the lease or raise ``TierConfigError`` naming the job that holds it."""
        granted, holder, expires = self.client.lease(self.topic, KIND, self.owner, self._ttl_ms())
        if not granted:
            raise TierConfigError(
                f"topic {self.topic!r} is being tiered by another job (checkpoint {holder}); "
                f"its lease runs until {utc_text(expires)} and is renewed while it runs. Stop that "
                f"job first, or, if it died, start again once its lease lapses (at most "
                f"{self.ttl_s:g} s after its last renewal); a job restarted on that checkpoint "
                "takes the lease back at once")
        self._renewed = time.monotonic()

    def check(self) -> None:
        """Renew now; ``LeaseLost`` if another job holds the topic (before an append)."""
        granted, holder, expires = self.client.lease(self.topic, KIND, self.owner, self._ttl_ms())
        if not granted:
            raise LeaseLost(f"tiering of {self.topic!r} with checkpoint {self.owner}: the lease "
                            f"lapsed and the job with checkpoint {holder} holds it (until "
                            f"{utc_text(expires)}); this job stops without appending")
        self._renewed = time.monotonic()

    def renew_if_due(self) -> None:
        """``check`` at most every third of the TTL (called from the monitor's loop)."""
        if self._renewed is None or time.monotonic() - self._renewed >= self.ttl_s / 3:
            self.check()

    def release(self) -> None:
        """Give the lease back (best effort: an unreachable cluster lets it lapse)."""
        if self._renewed is None:
            return
        try:
            self.client.lease(self.topic, KIND, self.owner, 0)
        except Exception as e:            # noqa: BLE001 - it lapses on its own
            log.warning("tiering %s: could not release the lease (%s); it lapses in %g s",
                        self.topic, e, self.ttl_s)
        self._renewed = None

    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))
