"""Topic configs in the metadata state: defaults, wave-1 compact topics, validation of tier/compacted_table."""
from __future__ import annotations

import json

import pytest

from storage_service.proto import rmq_pb2
from storage_service.protocol.errors import ServiceError
from storage_service.server.validate import check_config
from storage_service.statemachine.commands import AlterTopic, CreateTopic
from storage_service.statemachine.meta import MetaState, normalized

pytestmark = pytest.mark.unit


def test_a_wave1_compact_topic_with_its_table_in_tier_gets_it_as_compacted_table():
    wave1 = {"name": "kv", "queues": 2, "cleanup_policy": "compact", "tier": "delta:/data/kv"}
    cfg = normalized(wave1)
    assert cfg["compacted_table"] == "delta:/data/kv" and cfg["tier"] == ""
    # ... also when it comes back from a snapshot, or from a replayed alter of wave 1
    m = MetaState()
    m.restore(json.dumps({"topics": {"kv": wave1}, "offsets": {}, "watermarks": {}}).encode(), 1, None)
    assert m.topic("kv")["compacted_table"] == "delta:/data/kv" and m.topic("kv")["tier"] == ""
    m2 = MetaState()
    m2.apply(1, CreateTopic({"name": "kv", "queues": 1, "cleanup_policy": "compact"}, 0).encode())
    m2.apply(2, AlterTopic("kv", {"tier": "delta:/data/kv2"}).encode())
    assert (m2.topic("kv")["compacted_table"], m2.topic("kv")["tier"]) == ("delta:/data/kv2", "")


def test_a_delete_topic_keeps_its_tier():
    cfg = normalized({"name": "ev", "queues": 1, "tier": "delta:/a"})
    assert cfg["tier"] == "delta:/a" and cfg["compacted_table"] == ""


@pytest.mark.parametrize("fields,message", [
    (dict(cleanup_policy="compact", tier="delta:/a"), "tier='delta:/a': topic 't' has cleanup policy compact"),
    (dict(cleanup_policy="delete", compacted_table="delta:/a"),
     "compacted_table='delta:/a': topic 't' has cleanup policy delete; only a compact topic"),
    (dict(cleanup_policy="compact", compacted_table="parquet:/a"), "use delta:PATH with an absolute PATH"),
    (dict(cleanup_policy="compact", compacted_table="delta:rel/a"), "use delta:PATH with an absolute PATH"),
])
def test_tier_and_compacted_table_are_refused_where_they_do_not_belong(fields, message):
    with pytest.raises(ServiceError, match=message):
        check_config(rmq_pb2.TopicConfig(name="t", queues=1, **fields))


def test_valid_configs_pass():
    check_config(rmq_pb2.TopicConfig(name="t", queues=1, cleanup_policy="compact", compacted_table="delta:/a"))
    check_config(rmq_pb2.TopicConfig(name="t", queues=1, tier="parquet:/a"))


def test_replayed_wave1_alters_of_a_compact_topics_tier_agree_with_the_snapshot():
    """Replicas that replay a wave-1 journal and replicas that restore a later snapshot agree."""
    replay = MetaState()
    replay.apply(1, CreateTopic({"name": "kv", "queues": 1, "cleanup_policy": "compact"}, 0).encode())
    replay.apply(2, AlterTopic("kv", {"tier": "delta:/A"}).encode())
    replay.apply(3, AlterTopic("kv", {"tier": "delta:/B"}).encode())
    wave1 = {"name": "kv", "queues": 1, "cleanup_policy": "compact", "tier": "delta:/B"}
    restored = MetaState()
    restored.restore(json.dumps({"topics": {"kv": wave1}, "offsets": {}, "watermarks": {}}).encode(), 3, None)
    assert replay.topic("kv")["compacted_table"] == restored.topic("kv")["compacted_table"] == "delta:/B"
    replay.apply(4, AlterTopic("kv", {"tier": ""}).encode())        # wave 1 clearing it
    assert (replay.topic("kv")["compacted_table"], replay.topic("kv")["tier"]) == ("", "")


def _tiered_meta() -> MetaState:
    from storage_service.statemachine.commands import Lease
    m = MetaState()
    m.apply(1, CreateTopic({"name": "t", "queues": 2, "tier": "delta:/a"}, 0).encode())
    return m, Lease


def test_archive_watermarks_move_only_under_the_current_tier_lease():
    from storage_service.statemachine.commands import SetWatermark
    m, Lease = _tiered_meta()
    assert m.apply(2, Lease("t", "tier", "job-a", 30_000, 1000).encode()) == ("ok", (True, "job-a", 31_000, 2))
    assert m.apply(3, Lease("t", "tier", "job-a", 30_000, 2000).encode())[1][3] == 2   # renewed: same token
    assert m.apply(4, SetWatermark("t", "archive", {0: 10}, 2).encode()) == ("ok", None)
    stray = m.apply(5, SetWatermark("t", "archive", {0: 500}, 7).encode())
    assert stray[:2] == ("error", "FAILED_PRECONDITION") and "token 7 is not the topic's tier lease" in stray[2]
    # job-a's lease lapses; job-b takes the topic: job-a (a zombie) moves nothing any more
    assert m.apply(6, Lease("t", "tier", "job-b", 30_000, 40_000).encode())[1] == (True, "job-b", 70_000, 6)
    assert m.apply(7, SetWatermark("t", "archive_earliest", {0: 20}, 2).encode())[0] == "error"
    assert m.apply(8, SetWatermark("t", "archive", {0: 20}, 6).encode()) == ("ok", None)
    assert m.watermark("t", "archive") == {0: 20} and m.watermark("t", "archive_earliest") == {}
    # released: the token stays job-b's (its checkpoint restarted keeps it) until another
    # owner takes the lease; then job-b's token moves nothing. Compaction watermarks are not fenced.
    m.apply(9, Lease("t", "tier", "job-b", 0, 41_000).encode())
    assert m.apply(10, SetWatermark("t", "archive", {0: 30}, 6).encode()) == ("ok", None)
    assert m.apply(11, Lease("t", "tier", "job-c", 30_000, 42_000).encode())[1][3] == 11
    assert m.apply(12, SetWatermark("t", "archive", {0: 40}, 6).encode())[0] == "error"
    assert m.apply(13, SetWatermark("t", "compaction", {0: 3}).encode()) == ("ok", None)


def test_wave1_watermark_entries_replay_unfenced_and_wave1_leases_get_token_zero():
    m, Lease = _tiered_meta()
    assert m.apply(2, ("set_watermark", "t", "archive", {0: 10})) == ("ok", None)     # a wave-1 journal entry
    wave1 = {"topics": {"t": {"name": "t", "queues": 2, "tier": "delta:/a"}}, "offsets": {},
             "watermarks": {}, "leases": {"t": {"tier": ["old-job", 99_000]}}}
    r = MetaState()
    r.restore(json.dumps(wave1).encode(), 5, None)
    assert r.apply(6, Lease("t", "tier", "new-job", 1000, 1000).encode())[1] == (False, "old-job", 99_000, 0)
