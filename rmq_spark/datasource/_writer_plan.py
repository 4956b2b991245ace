"""The sink's view of the DataFrame: which columns it writes, checked on the driver.

``SinkPlan.from_schema`` runs before any task starts, so a wrong column
type fails the write before anything is sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.types import (BinaryType, ByteType, IntegerType, LongType, MapType, ShortType,
                               StringType, StructType, TimestampNTZType, TimestampType)

from rmq_spark.client import Client, NotFound, TlsFiles

from ._encode import normalize_columns
from ._options import WriteOptions
from .errors import OptionError

__all__ = ["SinkPlan"]

_BYTES = (BinaryType, StringType)
_ALLOWED = {
    "value": (_BYTES, "binary or string"),
    "key": (_BYTES, "binary or string"),
    "tags": ((StringType,), "string"),
    "properties": ((MapType,), "map<string,string>"),
    "born_timestamp": ((TimestampType, TimestampNTZType), "timestamp"),
    "topic": ((StringType,), "string"),
    "queue": ((IntegerType, LongType, ShortType, ByteType), "int"),
}
_IGNORED = ("offset", "timestamp", "msg_id")   # assigned by the service on write


def _check_column(name: str, dtype) -> None:
    types, text = _ALLOWED[name]
    ok = isinstance(dtype, types)
    if ok and name == "properties":
        ok = isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType)
    if not ok:
        raise OptionError("schema", f"column {name!r} is {dtype.simpleString()}; the rocketmq "
                          f"sink needs {text} (cast it first)")


def _check_topic_exists(opts: WriteOptions) -> None:
    with Client(opts.endpoints, tls=opts.tls, token=opts.token) as client:
        try:
            client.describe_topic(opts.topic)
        except NotFound as e:
            raise OptionError("topic", f"topic {opts.topic!r} does not exist; create it first "
                              f"(rmq topic create {opts.topic})") from e


@dataclass(frozen=True)
class SinkPlan:
    endpoints: str
    topic: str | None            # the 'topic' option: overrides a topic column
    columns: tuple[str, ...]     # written columns present in the DataFrame
    tls: TlsFiles | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_schema(cls, schema: StructType, opts: WriteOptions) -> "SinkPlan":
        names = [f.name for f in schema.fields]
        unknown = [n for n in names if n not in _ALLOWED and n not in _IGNORED]
        if unknown:
            raise OptionError("schema", f"column {unknown[0]!r} is not written by the rocketmq "
                              f"sink; select only {', '.join(_ALLOWED)} (value is required)")
        if "value" not in names:
            raise OptionError("schema", "the rocketmq sink needs a 'value' column "
                              "(binary or string)")
        for f in schema.fields:
            if f.name in _ALLOWED:
                _check_column(f.name, f.dataType)
        if opts.topic is None and "topic" not in names:
            raise OptionError("topic", "give the topic: .option('topic', name) or a 'topic' "
                              "column")
        if opts.topic is not None:
            _check_topic_exists(opts)
        return cls(opts.endpoints, opts.topic, tuple(n for n in names if n in _ALLOWED), opts.tls,
                   opts.token)

    def _col(self, batch: pa.RecordBatch, name: str) -> pa.Array | None:
        return batch.column(name) if name in self.columns else None

    def normalized(self, batch: pa.RecordBatch, now_ms: int) -> pa.RecordBatch:
        # A null value cell is a tombstone (Kafka's delete marker); the column itself is required.
        return normalize_columns(batch.column("value"), self._col(batch, "key"), self._col(batch, "tags"),
                                 self._col(batch, "properties"),
                                 self._col(batch, "born_timestamp"), now_ms)

    def topic_column(self, batch: pa.RecordBatch) -> pa.Array | None:
        return None if self.topic is not None else batch.column("topic")

    def queue_column(self, batch: pa.RecordBatch) -> pa.Array | None:
        return self._col(batch, "queue")
