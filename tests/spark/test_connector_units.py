"""Pure parts of the connector: option parsing, offsets codec, planning arithmetic,
the Arrow -> records-block encoder. No cluster, no SparkSession."""
from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pytest

from rmq_spark.datasource import OptionError
from rmq_spark.datasource._encode import encode_block, normalize_columns
from rmq_spark.datasource._offsets import dumps, from_spark, parse_json, to_spark
from rmq_spark.datasource._options import ReadOptions, WriteOptions
from rmq_spark.datasource._planning import QueueRange, QueueRanges, cap_by_backlog, plan_hot, split_ranges
from storage_service.protocol import records

pytestmark = pytest.mark.unit
BASE = {"endpoints": "127.0.0.1:1", "topic": "t"}


def test_offsets_json_round_trip_is_sorted_text():
    pos = parse_json('{"b": {"10": 5, "2": -2}, "a": {"0": 7}}', "startingOffsets", -2)
    assert pos == {"b": {10: 5, 2: -2}, "a": {0: 7}}
    assert dumps(pos) == '{"a":{"0":7},"b":{"2":-2,"10":5}}'
    assert from_spark(json.loads(json.dumps(to_spark(pos)))) == pos


@pytest.mark.parametrize("text,needle", [
    ("{", "not valid JSON"), ("[]", "non-empty JSON object"), ('{"t": 3}', "non-empty object"),
    ('{"t": {"x": 1}}', "not a non-negative integer"), ('{"t": {"0": -3}}', "-2 (earliest)"),
    ('{"t": {"0": true}}', "is not an offset"),
])
def test_offsets_json_errors(text, needle):
    with pytest.raises(ValueError) as e:
        parse_json(text, "startingOffsets", -2)
    assert needle in str(e.value)


def test_read_options_parse_types_and_defaults():
    o = ReadOptions.from_options({**BASE, "MAXOFFSETSPERTRIGGER": "100", "maxtriggerdelay": "30s",
                                  "failondataloss": "False", "readfrom": "Follower",
                                  "tags": "A || B", "startingoffsets": '{"t": {"1": 5}}'})
    assert (o.max_offsets_per_trigger, o.max_trigger_delay_ms, o.fail_on_data_loss) == (100, 30000, False)
    assert (o.read_from, o.tags, o.starting.kind, o.starting.positions) == ("follower", "A || B", "offsets", {"t": {1: 5}})
    d = ReadOptions.from_options(BASE)
    assert (d.fail_on_data_loss, d.read_from, d.starting, d.max_trigger_delay_ms) == (True, "leader", None, 900000)


@pytest.mark.parametrize("extra,option,needle", [
    ({"bogus": "1"}, "bogus", "valid options are: endpoints, topic"),
    ({"topics": "a,b"}, "topic", "exactly one of topic, topics"),
    ({"startingOffsets": "newest"}, "startingOffsets", "earliest or latest or JSON"),
    ({"endingOffsets": "earliest"}, "endingOffsets", "latest or JSON"),
    ({"startingOffsets": "earliest", "startingTimestamp": "5"}, "startingTimestamp", "only one of"),
    ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "integer >= 1"),
    ({"maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "20"}, "minOffsetsPerTrigger", "must be <="),
    ({"maxTriggerDelay": "soon"}, "maxTriggerDelay", "not a duration"),
    ({"failOnDataLoss": "yes"}, "failOnDataLoss", "true or false"),
    ({"readFrom": "any"}, "readFrom", "leader, follower"),
    ({"tags": "A B"}, "tags", "is not a tag"),
    ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets", "not subscribed"),
    ({"maxBytesPerFetch": str(1 << 30)}, "maxBytesPerFetch", "<= 67108864"),
    ({"localReads": "auto"}, "localReads", "true or false"),
    ({"packRecordsPerTask": "-1"}, "packRecordsPerTask", "integer >= 0"),
    ({"endpoints": "nohostport"}, "endpoints", "not host:port"),
])
def test_read_options_errors_name_option_and_allowed_values(extra, option, needle):
    with pytest.raises(OptionError) as e:
        ReadOptions.from_options({**BASE, **extra})
    assert e.value.option == option and needle in str(e.value), str(e.value)


def test_mode_specific_rules():
    with pytest.raises(OptionError, match="batch query"):
        ReadOptions.from_options({**BASE, "startingOffsets": "latest"}).check_batch()
    with pytest.raises(OptionError, match="a stream has no end"):
        ReadOptions.from_options({**BASE, "endingOffsets": "latest"}).check_streaming()


def test_write_options():
    w = WriteOptions.from_options({"endpoints": "h:1", "topic": "t", "idempotencekey": "job-7",
                                   "checkpointLocation": "/tmp/x"})
    assert (w.topic, w.idempotence_key) == ("t", "job-7")
    with pytest.raises(OptionError, match="unknown write option"):
        WriteOptions.from_options({"endpoints": "h:1", "startingOffsets": "earliest"})


def test_cap_by_backlog_splits_by_backlog_and_never_exceeds_limit():
    start = {"a": 0, "b": 100, "c": 50, "d": 7}
    latest = {"a": 900, "b": 200, "c": 50, "d": 3}
    end = cap_by_backlog(start, latest, 500)
    taken = {k: end[k] - start[k] for k in start}
    assert sum(v for v in taken.values() if v > 0) == 500
    assert taken["a"] == 450 and taken["b"] == 50 and taken["c"] == 0
    assert end["d"] == 3                      # a queue that went back is passed on as is
    assert cap_by_backlog(start, latest, 10_000) == latest


def test_split_ranges_reaches_min_partitions():
    ranges = [QueueRange("t", 0, 0, 1000), QueueRange("t", 1, 0, 10), QueueRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None) == ranges[:2]
    parts = split_ranges(ranges, 6)
    assert len(parts) >= 6
    for q in (0, 1):
        mine = sorted((p.start, p.end) for p in parts if p.queue == q)
        assert mine[0][0] == 0 and all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert mine[-1][1] == ranges[q].end


def test_plan_hot_packs_small_ranges_in_queue_order():
    small = [QueueRange("t", q, 0, 30) for q in range(4)]
    big = QueueRange("t", 4, 0, 500)
    # Small ranges share tasks of at most 100 records, in order; the big one keeps its own.
    assert plan_hot(small + [big, QueueRange("t", 5, 7, 7)], None, 100) == [
        QueueRanges(tuple(small[:3])), big, small[3]]
    assert plan_hot(small, None, 0) == small                  # 0: a task per range
    assert len(plan_hot(small, 8, 100)) >= 8                   # minPartitions: no packing
    assert plan_hot([], None, 100) == []


def test_encode_block_matches_the_service_codec():
    value = pa.array(["a", "bb", "", "dddd"] * 3)
    key = pa.array([b"k", None, b"kk", None] * 3)
    tags = pa.array(["T", None, "", "X"] * 3)
    props = pa.array([{"p": "1"}, None, {}, {"a": "b", "c": None}] * 3, pa.map_(pa.string(), pa.string()))
    born = pa.array([1000, 2000, None, 4000] * 3, pa.timestamp("us", tz="UTC"))
    batch = normalize_columns(value, key, tags, props, born, now_ms=777)
    for part in (batch, batch.slice(3, 5), batch.take(pa.array([5, 1, 9]))):
        rows = part.to_pylist()
        expected = records.encode([r["value"] for r in rows], [r["key"] for r in rows],
                                  [r["tags"] for r in rows],
                                  [{k: v or "" for k, v in r["properties"]} for r in rows],
                                  [r["born"] for r in rows])
        assert encode_block(part) == expected
    assert batch.column("born").to_pylist()[:4] == [1, 2, 777, 4]


# ------------------------------------------------------- Kafka habits (issue 17, item 12)
KAFKA = {"endpoints": "127.0.0.1:1"}


def test_kafka_subscription_names_parse_as_ours():
    """subscribe / subscribePattern / assign: Spark's Kafka source names, any case."""
    sub = ReadOptions.from_options({**KAFKA, "SUBSCRIBE": " a, b "})
    assert (sub.topics, sub.topic_pattern, sub.assign, sub.subscribed_by) == (("a", "b"), None, None, "subscribe")
    assert replace(sub, subscribed_by="topics") == ReadOptions.from_options({**KAFKA, "topics": "a,b"})
    pat = ReadOptions.from_options({**KAFKA, "subscribepattern": "or.*"})
    assert (pat.topics, pat.topic_pattern, pat.subscribes("orders"), pat.subscribes("x")) == ((), "or.*", True, False)
    a = ReadOptions.from_options({**KAFKA, "assign": '{"b": [2], "a": [1, 0, 1]}',
                                  "startingOffsets": '{"a": {"1": 4}}'})
    assert (a.topics, a.assign, a.subscribed_by) == (("b", "a"), {"a": (0, 1), "b": (2,)}, "assign")
    assert a.starting.positions == {"a": {1: 4}}


def test_include_headers_defaults_to_false():
    assert ReadOptions.from_options(BASE).include_headers is False
    assert ReadOptions.from_options({**BASE, "includeheaders": "True"}).include_headers is True


@pytest.mark.parametrize("extra,option,needle", [
    ({"topics": "a", "subscribe": "a"}, "subscribe",
     "is Kafka's name for topics, with the same meaning; give topics or subscribe, not both"),
    ({"topicPattern": "a", "subscribePattern": "a"}, "subscribePattern",
     "give topicPattern or subscribePattern, not both"),
    ({"subscribe": "a", "assign": '{"a": [0]}'}, "subscribe",
     "give exactly one of topic, topics or subscribe (comma list), topicPattern or subscribePattern "
     '(regex), assign (JSON {"topicA": [0, 1], "topicB": [2]}) (got subscribe, assign)'),
    ({"subscribePattern": "a.*", "topics": "a"}, "topics", "(got topics, subscribePattern)"),
    ({}, "topic", 'or subscribePattern (regex), assign (JSON {"topicA": [0, 1], "topicB": [2]}) '
                  "(none given)"),
    ({"subscribe": " , "}, "subscribe", "give a comma-separated list of topic names"),
    ({"subscribePattern": ""}, "subscribePattern", "must not be empty"),
    ({"subscribePattern": "("}, "subscribePattern", "is not a regular expression"),
    ({"assign": "{"}, "assign", 'not valid JSON (Expecting property name'),
    ({"assign": "[0, 1]"}, "assign", "expected a non-empty JSON object of topic -> list of queues"),
    ({"assign": "{}"}, "assign", "expected a non-empty JSON object"),
    ({"assign": '{"a": []}'}, "assign", "topic 'a': expected a non-empty list of queue numbers >= 0"),
    ({"assign": '{"a": [-1]}'}, "assign", "numbers >= 0"),
    ({"assign": '{"a": [true]}'}, "assign", "got [true]"),
    ({"assign": '{"a": {"0": 1}}'}, "assign", "numbers >= 0"),
    ({"assign": '{"a": [0]}', "startingOffsets": '{"a": {"1": 5}}'}, "startingOffsets",
     "topic 'a' queue 1 is not assigned (assign={\"a\":[0]})"),
    ({"assign": '{"a": [0]}', "endingOffsets": '{"b": {"0": 5}}'}, "endingOffsets",
     "topic 'b' is not subscribed (assign="),
    ({"subscribe": "a", "startingOffsets": '{"b": {"0": 5}}'}, "startingOffsets",
     "not subscribed (subscribe=a)"),
    ({"subscribe": "a", "includeHeaders": "1"}, "includeHeaders", "true or false"),
])
def test_kafka_option_errors(extra, option, needle):
    with pytest.raises(OptionError) as e:
        ReadOptions.from_options({**KAFKA, **extra})
    assert e.value.option == option and needle in str(e.value), str(e.value)
