"""Key-value semantics in the data state machine (issue 40: statemachine/kv.py, kv_index.py).

Conditions are decided at apply from the queue's log, so replicas applying the same
entries decide alike; the key index is derived data, rebuilt from the log when it is
missing, damaged, behind or ahead."""
from __future__ import annotations

import os

import pytest

from storage_service.protocol import records
from storage_service.statemachine.commands import ProduceItem
from storage_service.statemachine.data import DataState, queue_dir
from storage_service.statemachine.kv import EXPIRES_PROPERTY, KV_CONFLICT
from storage_service.statemachine.kv_index import prefix_end

pytestmark = pytest.mark.unit

Q = queue_dir("cfg", "inc1", 0)


class Writer:
    """Applies single-message produce items as raft entries, numbering them."""

    def __init__(self, *states: DataState):
        self.states = states
        self.index = 0

    def put(self, key: bytes, value: bytes | None, condition=None, ts: int = 1000, expires: int = 0,
            qname: str = Q):
        self.index += 1
        props = [{EXPIRES_PROPERTY: str(expires)}] if expires else None
        block = records.encode([value], [key], properties=props)
        item = ProduceItem(qname, "", 0, ts, 1, block, False, condition).encode()
        results = [st.apply(self.index, ("produce", [item]))[0] for st in self.states]
        assert all(r == results[0] for r in results), results      # replicas decide alike
        return results[0]


@pytest.fixture
def state(tmp_path):
    s = DataState(str(tmp_path / "a"), fsync=False)
    yield s
    s.close()


def rev(result) -> int:
    assert result[0] != KV_CONFLICT, result
    return result[0]


def test_conditions_decide_from_the_log_and_revisions_are_offsets(state):
    w = Writer(state)
    r1 = rev(w.put(b"k", b"v1", ("absent",)))
    assert w.put(b"k", b"again", ("absent",)) == (KV_CONFLICT, r1)
    assert w.put(b"k", b"v2", ("revision", r1 + 7)) == (KV_CONFLICT, r1)
    r2 = rev(w.put(b"k", b"v2", ("revision", r1)))
    assert r2 > r1
    assert state.kv.get(Q, b"k", now_ms=2000).value == b"v2"
    assert state.kv.get(Q, b"k", now_ms=2000, revision=r1).value == b"v1"
    # a delete is a tombstone under the same conditions; a deleted key is absent
    assert w.put(b"k", None, ("revision", r1)) == (KV_CONFLICT, r2)
    r3 = rev(w.put(b"k", None, ("revision", r2)))
    assert state.kv.get(Q, b"k", now_ms=2000) is None
    assert w.put(b"k", b"v3", ("revision", r3)) == (KV_CONFLICT, -1)    # no live value to match
    r4 = rev(w.put(b"k", b"v3", ("absent",)))
    assert [(e.revision, e.value) for e in state.kv.history(Q, b"k")] == \
        [(r1, b"v1"), (r2, b"v2"), (r3, None), (r4, b"v3")]


def test_a_conflict_stores_nothing(state):
    w = Writer(state)
    rev(w.put(b"a", b"1", ("absent",)))
    before = state.queue(Q).next_offset
    assert w.put(b"a", b"2", ("absent",))[0] == KV_CONFLICT
    assert state.queue(Q).next_offset == before


def test_two_replicas_agree_and_plain_keyed_produces_count_as_puts(tmp_path):
    a, b = DataState(str(tmp_path / "a"), fsync=False), DataState(str(tmp_path / "b"), fsync=False)
    try:
        w = Writer(a, b)
        w.put(b"x", b"plain")                      # no condition: a put all the same
        assert w.put(b"x", b"y", ("absent",))[0] == KV_CONFLICT
        for i in range(20):
            w.put(f"k{i % 4}".encode(), f"{i}".encode(), ("absent",) if i < 4 else None)
        assert a.kv.keys(Q, b"k", None, 100, 0) == b.kv.keys(Q, b"k", None, 100, 0)
        assert [k for k, _ in a.kv.keys(Q, b"", None, 100, 0)[0]] == [b"k0", b"k1", b"k2", b"k3", b"x"]
        assert a.kv.keys(Q, b"", None, 100, 0)[1] == a.queue(Q).next_offset      # the end it reflects
    finally:
        a.close()
        b.close()


def test_ttl_expiry_is_judged_by_the_entrys_store_time(state):
    w = Writer(state)
    r = rev(w.put(b"t", b"short", ("absent",), ts=1000, expires=1500))
    assert state.kv.get(Q, b"t", now_ms=1400).value == b"short"
    assert state.kv.get(Q, b"t", now_ms=1500) is None
    assert w.put(b"t", b"no", ("absent",), ts=1400) == (KV_CONFLICT, r)
    assert rev(w.put(b"t", b"yes", ("absent",), ts=1600)) > r
    assert state.kv.keys(Q, b"", None, 10, 1600)[0] == [(b"t", r + 1)]


def test_keys_by_prefix_are_paged_in_key_order(state):
    w = Writer(state)
    for name in [b"app/b", b"app/a", b"apq", b"app/c", b"ap", b"app\xff"]:
        w.put(name, b"v")
    first = state.kv.keys(Q, b"app/", None, 2, 0)[0]
    assert [k for k, _ in first] == [b"app/a", b"app/b"]
    assert [k for k, _ in state.kv.keys(Q, b"app/", first[-1][0], 2, 0)[0]] == [b"app/c"]
    assert prefix_end(b"a\xff\xff") == b"b" and prefix_end(b"\xff") is None


def test_the_index_is_rebuilt_from_the_log_when_missing_damaged_or_behind(tmp_path):
    root = str(tmp_path / "a")
    st = DataState(root, fsync=False)
    w = Writer(st)
    revs = [rev(w.put(f"k{i}".encode(), f"v{i}".encode(), ("absent",))) for i in range(5)]
    st.close()
    # behind: keyed messages applied while the index was closed (another process's apply)
    st = DataState(root, fsync=False)
    w.states = (st,)
    later = rev(w.put(b"k0", b"v0b"))           # no condition: the index is not even opened
    st.close()
    with open(os.path.join(root, "kv-index.sqlite3"), "r+b") as f:
        f.write(b"garbage" * 100)               # damaged
    for f in ("kv-index.sqlite3-wal", "kv-index.sqlite3-shm"):
        if os.path.exists(os.path.join(root, f)):
            os.unlink(os.path.join(root, f))
    st = DataState(root, fsync=False)
    try:
        w.states = (st,)
        assert w.put(b"k0", b"x", ("revision", revs[0])) == (KV_CONFLICT, later)
        assert st.kv.get(Q, b"k3", now_ms=0).revision == revs[3]
        os.unlink(os.path.join(root, "kv-index.sqlite3"))       # missing: a new file, indexed again
    finally:
        st.close()
    st = DataState(root, fsync=False)
    try:
        assert st.kv.get(Q, b"k0", now_ms=0).value == b"v0b"
    finally:
        st.close()


def test_retention_removes_old_revisions_and_a_get_there_names_the_oldest_kept(state):
    w = Writer(state)
    r1 = rev(w.put(b"k", b"1"))
    r2 = rev(w.put(b"k", b"2"))
    r3 = rev(w.put(b"k", b"3"))
    state.kv.get(Q, b"k", now_ms=0)             # the index is open: it follows the truncation
    w.index += 1
    state.apply(w.index, ("truncate", Q, r3))
    with pytest.raises(KeyError, match=f"oldest revision kept is {r3}"):
        state.kv.get(Q, b"k", now_ms=0, revision=r2)
    assert [e.revision for e in state.kv.history(Q, b"k")] == [r3]
    assert r1 < r2 < r3


def test_the_leaders_delete_of_an_expired_value_is_stored_only_over_that_revision(state):
    w = Writer(state)
    r = rev(w.put(b"t", b"v", ts=1000, expires=1500))
    assert w.put(b"t", None, ("revision", r), ts=1600)[0] == KV_CONFLICT     # a client's: no live value
    newer = rev(w.put(b"t2", b"v", ts=1000, expires=1500))
    rev(w.put(b"t2", b"renewed", ts=1550))
    assert w.put(b"t2", None, ("expired", newer), ts=1600)[0] == KV_CONFLICT   # renewed meanwhile
    rev(w.put(b"t", None, ("expired", r), ts=1600))
    assert state.kv.state(Q, b"t").deleted


def test_a_replayed_conditional_write_found_in_an_older_segment_answers_as_stored(tmp_path):
    """Journal replay after a restart: a conditional write whose batch is in an older
    segment (not the last one, scanned at open) is found by its apply position, so the
    producer's dedupe entry comes back and a retry is answered with its revision (it was
    answered a conflict, and a retry of an unconditional one got revision -1)."""
    root = str(tmp_path / "a")

    def item(ts, key, value, condition, seq):
        return ProduceItem(Q, "p1", seq, ts, 1, records.encode([value], [key]), False, condition).encode()
    first = ("produce", [item(1000, b"k", b"v1", ("absent",), 0)])
    fillers = [("produce", [item(1000 + i, f"f{i}".encode(), b"x" * 100, None, i)]) for i in range(1, 6)]
    st = DataState(root, fsync=False, segment_bytes=200)
    stored = st.apply(1, first)[0]
    for i, e in enumerate(fillers, 2):
        st.apply(i, e)
    assert len(st.queue(Q).segments) >= 3
    st.close()
    st = DataState(root, fsync=False, segment_bytes=200)          # restart: the journal replays
    try:
        assert st.apply(1, first)[0] == stored
        for i, e in enumerate(fillers, 2):
            st.apply(i, e)
        retry = st.apply(9, ("produce", [item(2000, b"k", b"v1", ("absent",), 0)]))[0]
        assert retry == (stored[0], 1, stored[2], True)             # the same write, once
        assert st.kv.get(Q, b"k", now_ms=0).revision == stored[0]
    finally:
        st.close()


def _sqlite_keys(root: str) -> int:
    """Keys SQLite holds (another connection: what a crash would leave)."""
    import sqlite3
    db = sqlite3.connect(os.path.join(root, "kv-index.sqlite3"))
    try:
        return db.execute("SELECT count(*) FROM keys").fetchone()[0]
    finally:
        db.close()


def test_rows_held_in_memory_answer_at_once_and_a_crash_reads_them_from_the_log_again(tmp_path, monkeypatch):
    from storage_service.statemachine import kv_index

    root = str(tmp_path / "a")
    st = DataState(root, fsync=False)
    w = Writer(st)
    try:
        r = rev(w.put(b"k", b"v0", ("absent",)))
        for i in range(1, 6):                      # each decided on the row the last one left in memory
            r = rev(w.put(b"k", b"v%d" % i, ("revision", r)))
        assert w.put(b"k", b"x", ("revision", r - 1)) == (KV_CONFLICT, r)
        assert _sqlite_keys(root) == 0             # nothing written to SQLite yet
        assert [e.value for e in st.kv.history(Q, b"k")] == [b"v%d" % i for i in range(6)]   # written first
        assert _sqlite_keys(root) == 1
        monkeypatch.setattr(kv_index, "FLUSH_ROWS", 8)
        for i in range(10):
            rev(w.put(f"n{i}".encode(), b"v", ("absent",)))
        assert _sqlite_keys(root) >= 8             # written once 8 rows waited
    finally:
        st.close()
    # the rest at close, n9 too: indexed as it was applied (the index was current)
    assert _sqlite_keys(root) == 11

    pid = os.fork()                                # a node that dies with rows in memory
    if pid == 0:
        code = 1
        try:
            crashed = DataState(root, fsync=False)
            w.states = (crashed,)
            r2 = r
            for i in range(3):
                r2 = rev(w.put(b"k", b"after%d" % i, ("revision", r2)))
            code = 0
        finally:
            os._exit(code)                         # no close: the rows in memory are lost
    assert os.waitpid(pid, 0)[1] == 0
    st = DataState(root, fsync=False)
    try:
        w.states = (st,)
        w.index += 3
        got = st.kv.get(Q, b"k", now_ms=0)
        assert got.value == b"after2" and got.revision > r
        assert w.put(b"k", b"x", ("revision", r)) == (KV_CONFLICT, got.revision)
        assert rev(w.put(b"k", b"next", ("revision", got.revision))) > got.revision
    finally:
        st.close()


class _FailingWrites:
    """A SQLite connection whose bulk writes fail (a disk that refuses them)."""

    def __init__(self, db):
        self._db = db

    def executemany(self, *a):
        import sqlite3
        raise sqlite3.OperationalError("disk I/O error")

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_held_rows_are_written_once_they_waited_and_a_failed_write_drops_them_to_the_log(state, monkeypatch):
    import sqlite3

    from storage_service.statemachine import kv_index

    st, root = state, state.root
    w = Writer(st)
    r = rev(w.put(b"k", b"v0", ("absent",)))
    r = rev(w.put(b"k", b"v1", ("revision", r)))
    index = st.kv.index
    index.flush_held(older_than=3600)           # not waited that long: still held
    assert _sqlite_keys(root) == 0
    monkeypatch.setattr(kv_index, "FLUSH_SECONDS", 0.0)
    st.flush_kv_index()                         # the node's segment-sync pass, FLUSH_SECONDS later
    assert _sqlite_keys(root) == 1 and index._held_since is None

    r = rev(w.put(b"k", b"v2", ("revision", r)))
    r = rev(w.put(b"k", b"v3", ("revision", r)))   # v2's row held in memory
    real = index._db
    index._db = _FailingWrites(real)
    with pytest.raises(sqlite3.OperationalError):
        index.flush()
    index._db = real
    assert index._unflushed_rows == 0 and not index._unflushed   # dropped, not piled up
    assert not index._db.in_transaction
    # read from the log again at the next use: the same decisions as before
    assert w.put(b"k", b"x", ("revision", r - 1)) == (KV_CONFLICT, r)
    assert st.kv.get(Q, b"k", now_ms=0).value == b"v3"
    assert [e.value for e in st.kv.history(Q, b"k")] == [b"v0", b"v1", b"v2", b"v3"]


def test_a_get_of_a_recent_entry_reads_no_segment_and_the_bound_holds(state, monkeypatch):
    """Entries read lately are kept (a revision names one message for good), so a hot
    key's get reads no segment; the kept bytes stay under the bound, least recently
    used dropped first; a revision the log no longer holds is not served from memory."""
    from storage_service.statemachine import kv as kv_mod

    w = Writer(state)
    r = rev(w.put(b"hot", b"v" * 100))
    first = state.kv.get(Q, b"hot", now_ms=2000)
    q = state.queue(Q)
    reads = []
    real = type(q).batch_holding
    monkeypatch.setattr(type(q), "batch_holding", lambda self, off: reads.append(off) or real(self, off))
    assert state.kv.get(Q, b"hot", now_ms=2000) == first and reads == []
    assert state.kv.get(Q, b"hot", now_ms=2000, revision=r) == first and reads == []

    recent = state.kv._recent
    monkeypatch.setattr(recent, "max_bytes", 20 * (100 + 10 + kv_mod._ENTRY_OVERHEAD))
    keys = [b"k%03d" % i for i in range(60)]
    for k in keys:
        w.put(k, b"v" * 100)
    for k in keys:
        assert state.kv.get(Q, k, now_ms=2000).value == b"v" * 100
    assert recent._bytes <= recent.max_bytes and 15 <= len(recent._entries) <= 20
    assert (Q, r) not in recent._entries                   # the oldest went first
    reads.clear()
    assert state.kv.get(Q, keys[-1], now_ms=2000).value == b"v" * 100 and reads == []

    last = state.kv.state(Q, keys[-1]).revision
    monkeypatch.setattr(type(q), "earliest", property(lambda self: self.next_offset))    # retention cut it all
    assert state.kv.read(Q, last) is None


def test_writes_applied_to_a_current_index_are_indexed_from_the_entry_as_the_log_would_index_them(
        tmp_path, monkeypatch):
    """A replica whose key index is current indexes each small applied batch from the entry
    in hand (no log read at the next condition or get); its rows are what a replica that
    indexes the same log afterwards reads back. A big batch, or an append while the index
    is behind, is left to the next use (read from the log)."""
    from storage_service.statemachine import kv as kv_mod

    a, b = DataState(str(tmp_path / "a"), fsync=False), DataState(str(tmp_path / "b"), fsync=False)
    try:
        w = Writer(a, b)
        w.put(b"k0", b"v")
        assert a.kv.get(Q, b"k0", now_ms=2000).value == b"v"        # a's index is current; b's not open
        scans = []
        real = kv_mod.keyed_rows
        monkeypatch.setattr(kv_mod, "keyed_rows", lambda q, s, e: scans.append((s, e)) or real(q, s, e))
        for i in range(1, 30):
            w.put(b"k%d" % (i % 7), None if i % 5 == 0 else b"v%d" % i, expires=5000 if i % 3 == 0 else 0)
        assert a.kv.get(Q, b"k1", now_ms=2000) is not None and scans == []     # no log read
        assert [r for r in a.kv.keys(Q, b"", None, 100, 2000)[0]] == b.kv.keys(Q, b"", None, 100, 2000)[0]
        assert scans                                                   # b read its log
        for k in range(7):
            key = b"k%d" % k
            assert a.kv.history(Q, key) == b.kv.history(Q, key)
            assert a.kv.state(Q, key) == b.kv.state(Q, key)
        # a batch of more than APPENDED_ROWS messages: indexed at the next use, from the log
        scans.clear()
        n = kv_mod.APPENDED_ROWS + 1
        block = records.encode([b"x"] * n, [b"big%d" % i for i in range(n)])
        w.index += 1
        item = ProduceItem(Q, "", 0, 1000, n, block, False, None).encode()
        a.apply(w.index, ("produce", [item]))
        assert a.kv.get(Q, b"big3", now_ms=2000).value == b"x" and scans
    finally:
        a.close()
        b.close()
