"""Spark's Kafka source habits (issue 17, item 12): ``subscribe``, ``subscribePattern``,
``assign`` and ``includeHeaders`` on format("rocketmq"), batch and stream."""
from __future__ import annotations

import json

import pytest
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType
from pyspark.sql.utils import AnalysisException

from rmq_spark.client import Message

from ._helpers import produce, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def kafka_reader(spark, endpoints: str, stream: bool = False, **options):
    """A reader with exactly the options given (no ``topic`` added)."""
    r = (spark.readStream if stream else spark.read).format("rocketmq")
    r = r.option("endpoints", endpoints)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("topic", "queue", "offset", "value").collect())


@pytest.fixture
def two_topics(client, topic):
    """``topic`` (4 queues, 40 messages) and ``topic-b`` (2 queues, 10 messages)."""
    other = f"{topic}-b"
    client.create_topic(other, queues=2)
    produce(client, topic, 40)
    produce(client, other, 10, queues=2, prefix="b")
    return topic, other


def test_subscribe_reads_what_topics_reads(spark, endpoints, two_topics):
    names = ",".join(two_topics)
    got = rows(kafka_reader(spark, endpoints, subscribe=names))
    assert got == rows(kafka_reader(spark, endpoints, topics=names))
    assert len(got) == 50 and {r[0] for r in got} == set(two_topics)


def test_subscribe_pattern_reads_what_topic_pattern_reads(spark, endpoints, two_topics):
    pattern = f"{two_topics[0]}(-b)?"
    got = rows(kafka_reader(spark, endpoints, subscribePattern=pattern))
    assert got == rows(kafka_reader(spark, endpoints, topicPattern=pattern))
    assert len(got) == 50


def test_assign_batch_reads_only_the_listed_queues(spark, endpoints, two_topics):
    a, b = two_topics
    assign = json.dumps({a: [1, 3], b: [0]})
    got = rows(kafka_reader(spark, endpoints, assign=assign))
    every = rows(kafka_reader(spark, endpoints, topics=f"{a},{b}"))
    assert got == [r for r in every if (r[0], r[1]) in {(a, 1), (a, 3), (b, 0)}]
    assert len(got) == 25
    # Starting and ending offsets keep their form and name assigned queues.
    df = kafka_reader(spark, endpoints, assign=assign, startingOffsets=json.dumps({a: {"1": 4}}),
                      endingOffsets=json.dumps({a: {"3": 2}}))
    assert sorted((r[0], r[1], r[2]) for r in rows(df)) == (
        [(a, 1, o) for o in range(4, 10)] + [(a, 3, o) for o in range(2)]
        + [(b, 0, o) for o in range(5)])


def test_assign_stream_reads_only_the_listed_queues(spark, client, endpoints, topic, tmp_path):
    produce(client, topic, 40)                      # 10 per queue
    seen: list[tuple] = []

    def sink(df, batch_id):
        seen.extend((r.queue, r.offset) for r in df.select("queue", "offset").collect())

    df = kafka_reader(spark, endpoints, stream=True, assign=json.dumps({topic: [0, 2]}),
                      startingOffsets="earliest")
    q = run_available_now(df, tmp_path / "ck", sink)
    assert sorted(seen) == [(qu, o) for qu in (0, 2) for o in range(10)]
    assert json.loads(q.lastProgress["sources"][0]["endOffset"]) == {topic: {"0": 10, "2": 10}}
    seen.clear()
    produce(client, topic, 8, start=40)             # 2 more per queue
    run_available_now(df, tmp_path / "ck", sink)    # resumes from the checkpoint
    assert sorted(seen) == [(qu, o) for qu in (0, 2) for o in (10, 11)]


@pytest.mark.parametrize("stream", [False, True])
def test_assign_of_a_missing_queue_or_topic_names_it(spark, endpoints, topic, tmp_path, stream):
    cases = [({topic: [1, 7]}, f"option 'assign': topic {topic!r} has no queue 7 (it has 4 "
                               "queues, 0 to 3)"),
             ({topic: [0], "no-such-topic": [0]}, "option 'assign': topic 'no-such-topic' does "
                                                  "not exist")]
    for i, (assign, needle) in enumerate(cases):
        df = kafka_reader(spark, endpoints, stream=stream, assign=json.dumps(assign))
        with pytest.raises(Exception) as e:
            if stream:
                run_available_now(df, tmp_path / f"ck{i}", lambda d, b: d.count())
            else:
                df.count()
        assert needle in str(e.value)


HEADERS = ArrayType(StructType([StructField("key", StringType()),
                                StructField("value", BinaryType())]))


def _produce_with_properties(client, topic: str) -> dict[bytes, dict[str, str]]:
    props = {b"v0": {"a": "1", "b": "é"}, b"v1": {}, b"v2": {"trace": "x-y"}}
    client.produce(topic, [Message(v, properties=p) for v, p in props.items()], queue=0)
    return props


def _headers_by_value(rows_) -> dict[bytes, list | None]:
    return {bytes(r.value): None if r.headers is None else
            sorted((h.key, bytes(h.value)) for h in r.headers) for r in rows_}


def _want_headers(props: dict[bytes, dict[str, str]]) -> dict[bytes, list | None]:
    return {v: sorted((k, s.encode()) for k, s in p.items()) or None for v, p in props.items()}


def test_include_headers_adds_the_kafka_headers_column(spark, client, endpoints, topic):
    props = _produce_with_properties(client, topic)
    df = kafka_reader(spark, endpoints, subscribe=topic, includeHeaders="true")
    names = df.schema.names
    assert names[names.index("properties") + 1] == "headers"
    assert df.schema["headers"].dataType == HEADERS
    got = df.collect()
    assert _headers_by_value(got) == _want_headers(props)
    assert {bytes(r.value): r.properties for r in got} == props
    plain = kafka_reader(spark, endpoints, subscribe=topic)          # default: schema unchanged
    assert "headers" not in plain.schema.names
    assert plain.schema == kafka_reader(spark, endpoints, topic=topic,
                                        includeHeaders="false").schema


def test_include_headers_in_a_stream(spark, client, endpoints, topic, tmp_path):
    props = _produce_with_properties(client, topic)
    got: list = []
    df = kafka_reader(spark, endpoints, stream=True, topic=topic, includeHeaders="true",
                      startingOffsets="earliest")
    assert df.schema["headers"].dataType == HEADERS
    run_available_now(df, tmp_path / "ck", lambda d, b: got.extend(d.collect()))
    assert _headers_by_value(got) == _want_headers(props)


@pytest.mark.parametrize("options,needle", [
    ({"topics": "t", "subscribe": "t"}, "option 'subscribe': is Kafka's name for topics, with "
                                        "the same meaning; give topics or subscribe, not both"),
    ({"topicPattern": "t", "subscribePattern": "t"},
     "option 'subscribePattern': is Kafka's name for topicPattern"),
    ({"subscribe": "t", "assign": '{"t": [0]}'}, "option 'subscribe': give exactly one of topic, "
                                                 "topics or subscribe (comma list), topicPattern "
                                                 "or subscribePattern (regex), assign"),
    ({}, 'assign (JSON {"topicA": [0, 1], "topicB": [2]}) (none given)'),
    ({"assign": '{"t": 0}'}, "option 'assign': topic 't': expected a non-empty list of queue "
                             'numbers >= 0, e.g. {"topicA": [0, 1], "topicB": [2]}; got 0'),
    ({"assign": "t:0"}, "option 'assign': not valid JSON"),
    ({"assign": '{"t": [0]}', "startingOffsets": '{"t": {"1": 0}}'},
     "option 'startingOffsets': topic 't' queue 1 is not assigned"),
    ({"subscribe": "t", "includeHeaders": "yes"}, "option 'includeHeaders': 'yes' is not a "
                                                  "boolean"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_kafka_options_fail_at_load(spark, endpoints, options, needle, stream):
    with pytest.raises(AnalysisException) as e:
        kafka_reader(spark, endpoints, stream=stream, **options)   # load() alone, no action
    assert needle in str(e.value)
