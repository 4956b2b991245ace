import pytest

pytestmark = pytest.mark.integration


def test_produce_fetch_roundtrip(client, topic):
    res = client.produce(topic, [b"a", b"b", b"c"], queue=2)
    assert [(r.queue, r.base_offset, r.count) for r in res] == [(2, 0, 3)]
    got = client.fetch(topic, 2, 0)
    assert [r.value for r in got.records] == [b"a", b"b", b"c"]
    assert [r.offset for r in got.records] == [0, 1, 2]
    assert got.next_offset == 3
