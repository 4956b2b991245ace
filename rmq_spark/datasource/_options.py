"""Options, parsed once into frozen dataclasses (``ReadOptions``, ``WriteOptions``).

Spark hands options over with lower-cased keys; errors name the option as the
user wrote it in the docs (camelCase) together with what is allowed. Every
rule is checked with ``if ... raise OptionError``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from rmq_spark.client import TlsFiles, parse_endpoints
from rmq_spark.units import UnitError, parse_duration_ms
from storage_service.protocol.tags import parse_tag_expression

from . import _offsets
from .errors import OptionError

__all__ = ["Bound", "Subscription", "ReadOptions", "WriteOptions", "READ_OPTIONS", "WRITE_OPTIONS"]

# Spark's Kafka source names for this source's options of the same meaning.
KAFKA_ALIASES = {"subscribe": "topics", "subscribePattern": "topicPattern"}
SUBSCRIPTION_OPTIONS = ("topic", "topics", "subscribe", "topicPattern", "subscribePattern",
                        "assign")
READ_OPTIONS = (
    "endpoints", *SUBSCRIPTION_OPTIONS, "includeHeaders", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
    "maxTriggerDelay", "failOnDataLoss", "minPartitions", "packRecordsPerTask",
    "driverReadRecords", "readFrom", "tags", "consumerGroup", "maxBytesPerFetch", "readArchive",
    "localReads", "latestPerKey", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "token", "tokenFile")
WRITE_OPTIONS = ("endpoints", "topic", "idempotenceKey", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "token",
                 "tokenFile")

# Options Spark itself passes on to a sink; they are not ours to check.
_SPARK_OWNED = ("checkpointlocation",)
DEFAULT_FETCH_BYTES = 8 << 20
MAX_FETCH_BYTES = 64 << 20
MIN_FETCH_BYTES = 64 << 10
DEFAULT_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_PACK_RECORDS = 16_384
DEFAULT_DRIVER_READ_RECORDS = 4_096
_ASSIGN_EG = '{"topicA": [0, 1], "topicB": [2]}'


@dataclass(frozen=True)
class Bound:
    """Where a read starts or ends.

    kind is ``earliest`` | ``latest`` | ``offsets`` (``positions`` holds offsets,
    -2 earliest / -1 latest) | ``timestamps`` (``positions`` holds ms per queue) |
    ``timestamp`` (``timestamp`` ms for every queue).
    """
    kind: str
    positions: _offsets.Positions = field(default_factory=dict)
    timestamp: int = 0
    option: str = ""       # the option it came from, for error messages


def _canonical(options: Mapping[str, str], allowed: tuple[str, ...], role: str) -> dict[str, str]:
    by_lower = {name.lower(): name for name in allowed}
    out = {}
    for key, value in options.items():
        if key.lower() in _SPARK_OWNED:
            continue
        name = by_lower.get(key.lower())
        if name is None:
            raise OptionError(key, f"unknown {role} option; valid options are: "
                                   f"{', '.join(allowed)}")
        out[name] = value
    return out


def _int(name: str, value: str, minimum: int, maximum: int | None = None) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = None
    if n is None or n < minimum or (maximum is not None and n > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise OptionError(name, f"{value!r} is not an integer >= {minimum}{upper}")
    return n


def _bool(name: str, value: str) -> bool:
    v = str(value).strip().lower()
    if v not in ("true", "false"):
        raise OptionError(name, f"{value!r} is not a boolean; use true or false")
    return v == "true"


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise OptionError(name, f"{value!r} is not one of: {', '.join(choices)}")
    return v


def _duration_ms(name: str, value: str) -> int:
    """Spark's convention (as Kafka's source): a bare number is milliseconds."""
    try:
        return parse_duration_ms(value, bare_unit="ms", no_limit=False)
    except UnitError as e:
        raise OptionError(name, str(e)) from e


def _json(name: str, value: str, minimum: int) -> _offsets.Positions:
    try:
        return _offsets.parse_json(value, name, minimum)
    except ValueError as e:
        raise OptionError(name, str(e)) from e


def _bound(opts: dict[str, str], prefix: str) -> Bound | None:
    """The one starting (or ending) bound given, from its three spellings."""
    names = [f"{prefix}Offsets", f"{prefix}OffsetsByTimestamp", f"{prefix}Timestamp"]
    given = [n for n in names if n in opts]
    if len(given) > 1:
        raise OptionError(given[1], f"give only one of {', '.join(names)} (got {', '.join(given)})")
    if not given:
        return None
    name, value = given[0], opts[given[0]]
    if name.endswith("OffsetsByTimestamp"):
        return Bound("timestamps", _json(name, value, 0), option=name)
    if name.endswith("Timestamp"):
        return Bound("timestamp", timestamp=_int(name, value, 0), option=name)
    word = str(value).strip().lower()
    words = ("earliest", "latest") if prefix == "starting" else ("latest",)
    if word in words:
        return Bound(word, option=name)
    if not str(value).strip().startswith("{"):
        raise OptionError(name, f"{value!r} is not {' or '.join(words)} or JSON "
                                '{"topic": {"queue": offset}}')
    return Bound("offsets", _json(name, value, -2 if prefix == "starting" else -1), option=name)


@dataclass(frozen=True)
class Subscription:
    """What a read subscribes to, and the option (as the user wrote it) that said so.

    ``assign``: only these queues of these topics (``topics`` are its topics).
    """
    option: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [n for n in SUBSCRIPTION_OPTIONS if n in opts]
    for alias, original in KAFKA_ALIASES.items():
        if alias in given and original in given:
            raise OptionError(alias, f"is Kafka's name for {original}, with the same meaning; "
                                     f"give {original} or {alias}, not both")
    if len(given) != 1:
        what = f"got {', '.join(given)}" if given else "none given"
        raise OptionError(given[0] if given else "topic",
                          "give exactly one of topic, topics or subscribe (comma list), "
                          f"topicPattern or subscribePattern (regex), assign (JSON {_ASSIGN_EG}) "
                          f"({what})")
    name = given[0]
    if name == "assign":
        assign = _assign(name, opts[name])
        return Subscription(name, tuple(assign), assign=assign)
    if name in ("topicPattern", "subscribePattern"):
        return Subscription(name, pattern=_pattern(name, opts[name]))
    topics = tuple(t.strip() for t in opts[name].split(",") if t.strip())
    if not topics or (name == "topic" and len(topics) != 1):
        want = "one topic name" if name == "topic" else "a comma-separated list of topic names"
        raise OptionError(name, f"{opts[name]!r}: give {want}")
    return Subscription(name, topics)


def _pattern(name: str, value: str) -> str:
    if not value.strip():
        raise OptionError(name, "must not be empty; give a regular expression such as 'orders-.*'")
    try:
        re.compile(value)
    except re.error as e:
        raise OptionError(name, f"{value!r} is not a regular expression: {e}") from e
    return value


def _assign(name: str, value: str) -> dict[str, tuple[int, ...]]:
    """``{"topicA": [0, 1], "topicB": [2]}`` -> ``{"topicA": (0, 1), "topicB": (2,)}``."""
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionError(name, f"not valid JSON ({e.msg} at character {e.pos}); expected "
                                f"e.g. {_ASSIGN_EG}") from e
    if not isinstance(raw, dict) or not raw:
        raise OptionError(name, f"expected a non-empty JSON object of topic -> list of queues, "
                                f"e.g. {_ASSIGN_EG}; got {value!r}")
    out = {}
    for topic, queues in raw.items():
        if (not topic.strip() or not isinstance(queues, list) or not queues
                or not all(type(q) is int and q >= 0 for q in queues)):
            raise OptionError(name, f"topic {topic!r}: expected a non-empty list of queue "
                                    f"numbers >= 0, e.g. {_ASSIGN_EG}; got {json.dumps(queues)}")
        out[topic] = tuple(sorted(set(queues)))
    return out


def _endpoints(opts: dict[str, str]) -> str:
    if "endpoints" not in opts:
        raise OptionError("endpoints", "required: the storage nodes as host:port[,host:port...]")
    try:
        return ",".join(parse_endpoints(opts["endpoints"]))
    except ValueError as e:
        raise OptionError("endpoints", str(e)) from e


def _tls(opts: dict[str, str]) -> TlsFiles | None:
    """TLS files (``tlsCaFile``, and ``tlsCertFile`` + ``tlsKeyFile`` where nodes require
    a client certificate), checked readable here, on the driver; executors read the
    same paths (the files must be there too)."""
    ca, cert, key = (opts.get(n) for n in ("tlsCaFile", "tlsCertFile", "tlsKeyFile"))
    if not ca:
        if cert or key:
            raise OptionError("tlsCaFile", "required with tlsCertFile/tlsKeyFile: the CA the "
                                           "nodes' certificates are checked against")
        return None
    if bool(cert) != bool(key):
        raise OptionError("tlsCertFile" if key else "tlsKeyFile",
                          "tlsCertFile and tlsKeyFile go together (a certificate and its key)")
    absolute = (lambda p: os.path.abspath(p) if p else None)    # executors may run elsewhere
    tls = TlsFiles(absolute(ca), absolute(cert), absolute(key))
    try:
        tls.read()
    except ValueError as e:
        bad = next((n for n in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")
                    if opts.get(n) and opts[n] in str(e)), "tlsCaFile")
        raise OptionError(bad, str(e)) from None
    return tls


def _token(opts: dict[str, str]) -> str | None:
    """The bearer token: ``token``, or read here on the driver from ``tokenFile`` (the
    executors get the token itself, so the file need not be on them). The option named
    ``token`` is redacted by Spark (``spark.redaction.regex``) in plans, the UI and event
    logs; the dataclasses holding it leave it out of their repr."""
    if opts.get("token") and opts.get("tokenFile"):
        raise OptionError("tokenFile", "give token or tokenFile, not both")
    if opts.get("tokenFile"):
        path = os.path.abspath(opts["tokenFile"])
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as e:
            raise OptionError("tokenFile", f"{path}: {e.strerror or e}") from None
        if not token:
            raise OptionError("tokenFile", f"{path} is empty")
        return token
    if "token" in opts:
        return _nonempty("token", opts["token"])
    return None


@dataclass(frozen=True)
class ReadOptions:
    """Reader options; see ``RocketMQDataSource`` for the reference of each."""
    endpoints: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None   # only these queues of ``topics``
    subscribed_by: str = "topic"                        # the option, for error messages
    include_headers: bool = False
    starting: Bound | None = None
    ending: Bound | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_TRIGGER_DELAY_MS
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    pack_records: int = DEFAULT_PACK_RECORDS
    driver_read_records: int = DEFAULT_DRIVER_READ_RECORDS
    read_from: str = "leader"
    tags: str = ""
    consumer_group: str | None = None
    max_bytes_per_fetch: int = DEFAULT_FETCH_BYTES
    read_archive: bool = True
    local_reads: bool = True
    latest_per_key: bool = False                        # one row per live key (batch, compact topics)
    tls: TlsFiles | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ReadOptions":
        opts = _canonical(options, READ_OPTIONS, "read")
        sub = _subscription(opts)
        parsers: dict[str, tuple[str, Callable[[str, str], object]]] = {
            "maxOffsetsPerTrigger": ("max_offsets_per_trigger", lambda n, v: _int(n, v, 1)),
            "minOffsetsPerTrigger": ("min_offsets_per_trigger", lambda n, v: _int(n, v, 1)),
            "maxTriggerDelay": ("max_trigger_delay_ms", _duration_ms),
            "failOnDataLoss": ("fail_on_data_loss", _bool),
            "minPartitions": ("min_partitions", lambda n, v: _int(n, v, 1)),
            "packRecordsPerTask": ("pack_records", lambda n, v: _int(n, v, 0)),
            "driverReadRecords": ("driver_read_records", lambda n, v: _int(n, v, 0)),
            "readFrom": ("read_from", lambda n, v: _choice(n, v, ("leader", "follower"))),
            "tags": ("tags", _tags),
            "consumerGroup": ("consumer_group", _nonempty),
            "readArchive": ("read_archive", _bool),
            "localReads": ("local_reads", _bool),
            "latestPerKey": ("latest_per_key", _bool),
            "includeHeaders": ("include_headers", _bool),
            "maxBytesPerFetch": ("max_bytes_per_fetch",
                                 lambda n, v: _int(n, v, MIN_FETCH_BYTES, MAX_FETCH_BYTES)),
        }
        values = {attr: parse(name, opts[name]) for name, (attr, parse) in parsers.items()
                  if name in opts}
        result = cls(endpoints=_endpoints(opts), topics=sub.topics, topic_pattern=sub.pattern,
                     assign=sub.assign, subscribed_by=sub.option, starting=_bound(opts, "starting"),
                     ending=_bound(opts, "ending"), tls=_tls(opts), token=_token(opts), **values)
        result._check()
        return result

    def _check(self) -> None:
        lo, hi = self.min_offsets_per_trigger, self.max_offsets_per_trigger
        if lo is not None and hi is not None and lo > hi:
            raise OptionError("minOffsetsPerTrigger",
                              f"{lo} is above maxOffsetsPerTrigger={hi}; it must be <= it")
        for bound in (self.starting, self.ending):
            for topic, queues in (bound.positions if bound else {}).items():
                self._check_subscribed(bound.option, topic, queues)

    def _check_subscribed(self, option: str, topic: str, queues: Mapping[int, int]) -> None:
        if not self.subscribes(topic):
            raise OptionError(option, f"topic {topic!r} is not subscribed "
                              f"({self._subscription_text()})")
        extra = sorted(set(queues) - set(self.assign[topic])) if self.assign else []
        if extra:
            raise OptionError(option, f"topic {topic!r} queue {extra[0]} is not assigned "
                              f"({self._subscription_text()})")

    def subscribes(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics

    def _subscription_text(self) -> str:
        if self.topic_pattern is not None:
            return f"{self.subscribed_by}={self.topic_pattern!r}"
        if self.assign is not None:
            return f"assign={json.dumps(self.assign, separators=(',', ':'))}"
        return f"{self.subscribed_by}={','.join(self.topics)}"

    def check_batch(self) -> None:
        """Rules that only hold for spark.read."""
        if self.starting is not None and self.starting.kind == "latest":
            raise OptionError("startingOffsets", "latest is not allowed in a batch query (it "
                              "would read nothing); use earliest, JSON offsets or a timestamp")
        if self.starting is not None and self.starting.kind == "offsets":
            for topic, queues in self.starting.positions.items():
                for q, off in queues.items():
                    if off == _offsets.LATEST:
                        raise OptionError("startingOffsets", f"topic {topic!r} queue {q}: -1 "
                                          "(latest) is not allowed in a batch query")

    def check_streaming(self) -> None:
        """Rules that only hold for spark.readStream."""
        if self.ending is not None:
            raise OptionError("endingOffsets", "ending offsets and timestamps are for batch "
                              "queries (spark.read) only; a stream has no end")


def _tags(name: str, value: str) -> str:
    try:
        parse_tag_expression(value)
    except ValueError as e:
        raise OptionError(name, str(e)) from e
    return "" if value.strip() == "*" else value.strip()


def _nonempty(name: str, value: str) -> str:
    if not str(value).strip():
        raise OptionError(name, "must not be empty")
    return str(value).strip()


@dataclass(frozen=True)
class WriteOptions:
    """Writer options; see ``RocketMQDataSource`` for the reference of each."""
    endpoints: str
    topic: str | None = None
    idempotence_key: str | None = None
    tls: TlsFiles | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "WriteOptions":
        opts = _canonical(options, WRITE_OPTIONS, "write")
        topic = _nonempty("topic", opts["topic"]) if "topic" in opts else None
        if topic is not None and "," in topic:
            raise OptionError("topic", f"{topic!r}: a sink writes to one topic option; use a "
                              "'topic' column to write rows to several topics")
        key = opts.get("idempotenceKey")
        key = _nonempty("idempotenceKey", key) if key is not None else None
        return cls(endpoints=_endpoints(opts), topic=topic, idempotence_key=key, tls=_tls(opts),
                   token=_token(opts))
