"""Errors of the Spark connector, rooted in the client's ``RmqError``.

``OptionError`` is raised on the driver, before anything is read or written,
for an unknown or malformed option or an unusable DataFrame schema.
``DataLossError`` is raised when offsets a query needs were removed by
retention (or the queue went away) and ``failOnDataLoss`` is true.
"""
from __future__ import annotations

from rmq_spark.client.errors import RmqError

__all__ = ["ConnectorError", "OptionError", "DataLossError", "SinkError"]


class ConnectorError(RmqError):
    """Base of the connector's own errors."""


class OptionError(ConnectorError, ValueError):
    """An option or a schema the connector cannot use; names the option and what is allowed."""

    def __init__(self, option: str, message: str):
        super().__init__(f"option {option!r}: {message}" if option else message)
        self.option = option


class DataLossError(ConnectorError):
    """Offsets [start, end) of a queue are gone (retention, deleted topic) before being read."""

    def __init__(self, topic: str, queue: int, start: int, end: int | None, reason: str):
        missing = f"[{start}, {end})" if end is not None else f"from {start} on"
        super().__init__(
            f"data loss: topic {topic!r} queue {queue}: offsets {missing} {reason}. "
            "The query needs them and failOnDataLoss is true; set .option('failOnDataLoss', "
            "'false') to skip missing offsets with a warning instead")
        self.topic, self.queue, self.start, self.end = topic, queue, start, end


class SinkError(ConnectorError, ValueError):
    """A row the sink cannot write (null value, bad queue, unknown topic)."""
