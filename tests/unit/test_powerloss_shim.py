"""The power-loss shim (tests/faults): real processes, SIGKILL, then what a power loss leaves.

Each test runs a small Python child under the LD_PRELOAD shim with its files
under ``root``, kills it with SIGKILL once it printed ``ready``, applies the
undo journal (``drop_unsynced``) and checks the files byte for byte. The last
tests run a storage node under the shim.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rmq_spark.client import Client
from storage_service.local import LocalCluster
from tests.faults.powerloss import LossReport, build_shim, drop_unsynced, shim_env

pytestmark = pytest.mark.unit

PRELUDE = """
import os, sys, threading, time

def fsync_dir(path="."):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
"""


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def undo(tmp_path):
    return tmp_path / "undo"


def crash(root, undo, code: str, writeback_s: float | None = None, names: str = "posix") -> LossReport:
    """Run ``code`` in a Python child under the shim (cwd: root), SIGKILL it right
    after it is done, and apply the undo journal."""
    env = {**os.environ, **shim_env(str(root), str(undo), writeback_s)}
    script = PRELUDE + textwrap.dedent(code) + "\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        if line != b"ready\n":
            proc.wait(timeout=30)
            pytest.fail(f"child failed ({proc.returncode}):\n{proc.stderr.read().decode()}")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return drop_unsynced(str(undo), names=names)


def put(path, data: bytes) -> str:
    """A file written by the test itself: durable before any child runs."""
    with open(path, "wb") as f:
        f.write(data)
    return os.path.realpath(path)


def get(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_unsynced_append_is_dropped(root, undo):
    report = crash(root, undo, """
        fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644)
        fsync_dir()
        os.write(fd, b"A" * 1000)
        os.fsync(fd)
        os.write(fd, b"B" * 500)
    """)
    assert get(root / "f") == b"A" * 1000
    assert report.truncated == [(str(root / "f"), 1500, 1000)]
    assert report.bytes_dropped == 500 and not report.removed and not report.skipped
    assert report.summary().startswith("power loss: 500 unsynced bytes dropped; 1 file(s) truncated")


def test_overwrite_in_place_restores_the_pre_image(root, undo):
    original = b"0123456789" * 10
    put(root / "f", original)
    report = crash(root, undo, """
        fd = os.open("f", os.O_RDWR)
        os.pwrite(fd, b"XXXX", 10)
        os.fsync(fd)                        # durable from here on
        os.pwrite(fd, b"YYYY", 12)          # over 2 synced X and 2 original bytes
        os.pwritev(fd, [b"ZZ", b"ZZ"], 50)  # os.pwritev: libc's pwritev64v2
        os.lseek(fd, 96, os.SEEK_SET)
        os.write(fd, b"W" * 8)              # 4 bytes over the end, 4 past it
    """)
    assert get(root / "f") == original[:10] + b"XXXX" + original[14:]
    assert report.restored == [(str(root / "f"), 12)]
    assert report.truncated == [(str(root / "f"), 104, 100)]
    assert report.bytes_dropped == 16


def test_fdatasync_through_a_dup_or_another_descriptor_is_durable(root, undo):
    crash(root, undo, """
        fd = os.open("seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir()
        os.write(fd, b"A" * 100)
        dup = os.dup(fd)                    # what QueueLog.sync_behind syncs
        os.fdatasync(dup)
        os.close(dup)
        os.write(fd, b"B" * 10)
        other = os.open("seg", os.O_RDONLY)
        os.fdatasync(other)                 # any descriptor of the inode will do
        os.close(other)
        os.write(fd, b"C" * 5)
    """)
    assert get(root / "seg") == b"A" * 100 + b"B" * 10


@pytest.mark.parametrize("case, names, expect", [
    ("no_syncs", "posix", None),
    ("data_synced_dir_not", "posix", None),          # POSIX: the name was never made durable
    ("dir_synced_data_not", "posix", b""),
    ("data_synced_dir_not", "ext4", b"data"),        # ext4 commits the name with the fsync
])
def test_new_file_needs_its_directory_synced(root, undo, case, names, expect):
    report = crash(root, undo, f"""
        case = {case!r}
        with open("new", "wb") as f:
            f.write(b"data")
            f.flush()
            if case == "data_synced_dir_not":
                os.fsync(f.fileno())
        if case == "dir_synced_data_not":
            fsync_dir()
    """, names=names)
    if expect is None:
        assert not (root / "new").exists()
        assert report.removed == [str(root / "new")]
    else:
        assert get(root / "new") == expect
        assert not report.removed


@pytest.mark.parametrize("synced,queues", [(False, 3), (True, 3), ("sync", 40), ("sync_behind", 40)],
                         ids=["unsynced", "synced", "bulk-sync", "bulk-sync-behind"])
def test_a_new_queue_is_durable_once_its_data_state_synced(root, undo, synced, queues):
    """A new queue's directory syncs wait for the data state's next sync (``DirSyncs``):
    before it a power loss may take the queue's files (the raft journal replays
    them); after it, the sync a snapshot makes first, they are all there. With 32
    queues or more to sync, a sync round (the snapshot's, the background one) syncs
    the file system once (``syncfs``) instead of each queue and directory."""
    report = crash(root, undo, f"""
        sys.path.insert(0, {os.getcwd()!r})
        import storage_service.statemachine.data as data
        from storage_service.statemachine.data import DataState, queue_dir
        from tests.unit._helpers import encode_values
        whole = []
        data.syncfs = lambda fd, syncfs=data.syncfs: (whole.append(fd), syncfs(fd))
        st = DataState("data", fsync=True)
        n = {queues!r}
        st.apply(1, ("produce", [(queue_dir("t", "i", q), "", 0, 1, 1, encode_values([b"m"])) for q in range(n)]))
        assert len(st.dirs) == n + 1             # the group's directory and each queue's
        if {synced!r}:
            st.sync_behind() if {synced!r} == "sync_behind" else st.sync()
            assert len(st.dirs) == 0
            assert len(whole) == (n >= data.BULK_SYNC_QUEUES), whole
            assert not any(q._dirty for q in st.queues.values())
    """)
    logs = sorted(str(p) for p in (root / "data").glob("*/*.log"))
    if synced:
        assert len(logs) == queues and all(os.path.getsize(p) > 0 for p in logs), report.summary()
        assert not report.removed
    else:
        # each queue's .log (its index files come with its first index entry, past 64 KiB)
        assert not logs and len(report.removed) == 3, report.summary()


@pytest.mark.parametrize("sync_dir", [False, True])
def test_replace_without_a_directory_sync_is_undone(root, undo, sync_dir):
    target = put(root / "meta", b"old contents")
    report = crash(root, undo, f"""
        with open("meta.tmp", "wb") as f:
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
        os.replace("meta.tmp", "meta")
        if {sync_dir}:
            fsync_dir()
    """)
    assert sorted(os.listdir(root)) == ["meta"]
    if sync_dir:
        assert get(target) == b"new"
        assert not report.changed
    else:
        assert get(target) == b"old contents"
        assert report.renamed_back == [(target, target + ".tmp")]
        assert report.relinked == [target]
        assert report.removed == [target + ".tmp"]
    assert os.listdir(undo) == []                       # journals and kept links are gone


def test_buffered_file_object(root, undo):
    put(root / "log", b"")
    crash(root, undo, """
        f = open("log", "ab")
        f.write(b"a" * 100)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"b" * 50)
        f.flush()                           # in the page cache only
        f.write(b"c" * 10)                  # still in the process's buffer
    """)
    assert get(root / "log") == b"a" * 100


@pytest.mark.parametrize("writeback_s", [None, 0.5])
def test_writeback_keeps_what_is_older_than_the_interval(root, undo, writeback_s):
    put(root / "log", b"")
    crash(root, undo, """
        fd = os.open("log", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"early")
        with open("early-file", "wb") as f:
            f.write(b"x")
        time.sleep(1.0)
        os.write(fd, b"late")
    """, writeback_s=writeback_s)
    if writeback_s:
        assert get(root / "log") == b"early"
        assert get(root / "early-file") == b"x"
    else:                                   # no writeback: nothing unsynced survives
        assert get(root / "log") == b""
        assert not (root / "early-file").exists()


def test_truncates_and_unlinks_are_undone(root, undo):
    (root / "a").mkdir()
    (root / "b").mkdir()
    put(root / "idx", b"12345678")
    put(root / "seg", b"s" * 100)
    put(root / "a" / "gone", b"kept")
    put(root / "b" / "gone", b"removed for good")
    report = crash(root, undo, """
        with open("idx", "wb") as f:        # O_TRUNC over synced bytes
            f.write(b"ab")
        with open("seg", "r+b") as f:
            f.truncate(10)
        os.truncate("idx", 1)
        os.unlink("a/gone")
        os.remove("b/gone")
        fsync_dir("b")
    """)
    assert get(root / "idx") == b"12345678"
    assert get(root / "seg") == b"s" * 100
    assert get(root / "a" / "gone") == b"kept"
    assert not (root / "b" / "gone").exists()
    assert report.relinked == [str(root / "a" / "gone")]


def test_a_file_removed_for_good_takes_its_unsynced_writes_with_it(root, undo):
    """Unsynced writes to a file whose removal became durable need no undo: the file
    is gone either way (the node's power-loss run once failed on one: "no name of
    it left under root")."""
    put(root / "synced-then-replaced", b"old")
    report = crash(root, undo, """
        with open("scratch", "wb") as f:             # written, never synced, unlinked
            f.write(b"x" * 100)
        fsync_dir()                                   # its name durable
        os.unlink("scratch")
        with open("synced-then-replaced", "ab") as f:  # appended, then replaced
            f.write(b" and more")
        with open("new", "wb") as f:
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
        os.rename("new", "synced-then-replaced")
        f = open("open-while-unlinked", "wb")         # written through a descriptor after the unlink
        fsync_dir()
        os.unlink("open-while-unlinked")
        f.write(b"y" * 10)
        f.flush()
        fsync_dir()                                   # every removal durable
    """)
    assert not report.skipped, report
    assert sorted(os.listdir(root)) == ["synced-then-replaced"]
    assert get(root / "synced-then-replaced") == b"new", report


def test_threads_each_keep_what_they_synced(root, undo):
    crash(root, undo, """
        def work(i):
            fd = os.open(f"t{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for j in range(205):
                os.write(fd, b"%d:%03d;" % (i, j))
                if j % 10 == 9:
                    os.fdatasync(fd)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fsync_dir()
    """)
    for i in range(8):
        assert get(root / f"t{i}") == b"".join(b"%d:%03d;" % (i, j) for j in range(200))


def test_a_forked_child_has_its_own_journal(root, undo):
    report = crash(root, undo, """
        pid = os.fork()
        if pid == 0:
            with open("child", "wb") as f:
                f.write(b"c" * 10)
                f.flush()
                os.fsync(f.fileno())
                f.write(b"d" * 5)
            os._exit(0)
        os.waitpid(pid, 0)
        with open("parent", "wb") as f:
            f.write(b"p")
        fsync_dir()                         # the child's create too
    """)
    assert get(root / "child") == b"c" * 10 and get(root / "parent") == b""
    assert report.journals == 2


def test_a_process_that_never_touches_root(tmp_path, root, undo):
    out = tmp_path / "outside"
    out.mkdir()
    put(out / "renamed", b"r")
    put(out / "unlinked", b"u")
    report = crash(root, undo, f"""
        os.chdir({str(out)!r})
        with open("new", "wb") as f:
            f.write(b"n" * 10)
        with open("appended", "ab") as f:
            f.write(b"a")
        os.rename("renamed", "renamed-to")
        os.unlink("unlinked")
    """)
    assert sorted(os.listdir(out)) == ["appended", "new", "renamed-to"]
    assert get(out / "new") == b"n" * 10 and get(out / "renamed-to") == b"r"
    assert report == LossReport()                       # not even a journal was written


# libc symbols that open, change, sync, rename or remove files or duplicate
# descriptors; those libpython imports must be interposed unless listed below.
FILE_SYMBOL = re.compile(r"(__)?(open|openat|creat|p?writev?|pwrite|pwritev|f?truncate|f?allocate"
                         r"|posix_fallocate|fallocate|f?sync|fdatasync|syncfs|sync_file_range"
                         r"|rename|renameat|renameat2"
                         r"|unlink|unlinkat|remove|link|linkat|symlink|symlinkat|mkdir|mkdirat|rmdir|dup|dup2"
                         r"|dup3|fcntl|sendfile|copy_file_range|splice|vmsplice|tee|mmap|msync|fopen|fdopen"
                         r"|fwrite|fputs|fprintf|close|close_range)(64)?(v2|_2)?")
NOT_INTERPOSED = {
    "close", "close_range",          # a closed descriptor's table entry is checked (fstat) at its next use
    "fopen64", "fdopen", "fwrite", "fputs", "fprintf",   # stdio: glibc calls its internal write;
                                                          # Python's file objects do not use stdio
    "mkdir", "mkdirat", "rmdir",     # directories are durable at once (documented)
    "symlink", "symlinkat",          # not emulated (documented)
    "mmap64",                        # shared writable mappings are not seen (documented)
    "splice",                        # os.splice into a tracked file is not seen (documented)
}


def _dynamic_symbols(path: str, undefined: bool) -> set[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only" if undefined else "--defined-only", path],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_every_file_changing_symbol_python_imports_is_interposed():
    shim = _dynamic_symbols(build_shim(), undefined=False)
    libs = re.findall(r"=> (\S*libpython\S*)", subprocess.run(
        ["ldd", os.path.realpath(sys.executable)], capture_output=True, text=True).stdout)
    imported = set()
    for path in [os.path.realpath(sys.executable), *libs]:
        imported |= {s for s in _dynamic_symbols(path, undefined=True) if FILE_SYMBOL.fullmatch(s)}
    assert {"write", "pwrite64", "pwritev64v2", "open64", "fcntl64", "fdatasync", "rename"} <= imported
    assert imported - NOT_INTERPOSED - shim == set()


# ---------------------------------------------------------------- a real node


class ShimmedCluster(LocalCluster):
    """Every node runs under the shim, its data dir the root (one node: one undo dir;
    several nodes would each need their own, to lose power one at a time)."""

    def __init__(self, *args, undo_dir: str, writeback_s: float | None = None, **kwargs):
        self.undo_dir = undo_dir
        self.writeback_s = writeback_s
        super().__init__(*args, **kwargs)

    def node_command(self, i: int) -> list[str]:
        env = shim_env(os.path.join(self.data_dir, f"node-{i}"), self.undo_dir, self.writeback_s)
        return ["env", *[f"{k}={v}" for k, v in env.items()], *super().node_command(i)]


def _produce(cluster, batches: int, first: int = 0) -> list[bytes]:
    sent = []
    with Client(cluster.endpoints, timeout=30) as client:
        if not first:
            client.create_topic("t", queues=1)
        for i in range(first, first + batches):
            batch = [f"m{i}-{j}".encode() for j in range(20)]
            (res,) = client.produce("t", batch, queue=0)
            assert res.base_offset == first * 20 + len(sent)
            sent += batch
    return sent


def _read_all(cluster, count: int) -> list[bytes]:
    got = []
    deadline = time.monotonic() + 30
    with Client(cluster.endpoints, timeout=30) as client:
        while len(got) < count and time.monotonic() < deadline:
            res = client.fetch("t", 0, len(got), max_messages=1000)
            got += [r.value for r in res.records]
            if res.next_offset >= res.latest and len(got) < count:
                break                       # nothing more to read: lost
    return got


@pytest.mark.integration
def test_node_with_fsync_always_loses_no_acknowledged_message(tmp_path):
    cluster = ShimmedCluster(nodes=1, groups=1, data_dir=str(tmp_path / "data"), fsync="always",
                             undo_dir=str(tmp_path / "undo"))
    try:
        cluster.start(timeout=60)
        sent = _produce(cluster, 8)
        cluster.kill(0, signal.SIGKILL)
        report = drop_unsynced(cluster.undo_dir)
        assert report.records, "the shim saw nothing of the node"
        cluster.start_node(0)
        cluster.wait_ready(60)
        assert _read_all(cluster, len(sent)) == sent, report.summary()
    finally:
        cluster.stop()


@pytest.mark.integration
@pytest.mark.parametrize("names", ["posix", "ext4"])
def test_node_after_a_raft_snapshot(tmp_path, names):
    cluster = ShimmedCluster(nodes=1, groups=1, data_dir=str(tmp_path / "data"), fsync="always",
                             undo_dir=str(tmp_path / "undo"), extra_args=["--compaction-entries", "4"])
    snapshot = tmp_path / "data" / "node-0" / "group-1" / "snapshot"
    try:
        cluster.start(timeout=60)
        sent = _produce(cluster, 8)
        deadline = time.monotonic() + 10
        while not snapshot.exists():
            assert time.monotonic() < deadline, "no raft snapshot of the data group"
            time.sleep(0.05)
        cluster.kill(0, signal.SIGKILL)
        report = drop_unsynced(cluster.undo_dir, names=names)
        lost = [p for p in report.removed if "/queues/" in p]
        assert not lost, f"segment files lost: {lost}; {report.summary()}"
        cluster.start_node(0)
        cluster.wait_ready(60)
        assert _read_all(cluster, len(sent)) == sent, report.summary()
    finally:
        cluster.stop()


@pytest.mark.integration
def test_node_with_fsync_none_loses_the_last_writeback_interval(tmp_path):
    """--fsync none: an acknowledged message is only in the page cache; the kernel's
    writeback (here every change older than 1 s) is all that saves it."""
    cluster = ShimmedCluster(nodes=1, groups=1, data_dir=str(tmp_path / "data"), fsync="none",
                             undo_dir=str(tmp_path / "undo"), writeback_s=1.0)
    try:
        cluster.start(timeout=60)
        old = _produce(cluster, 3)
        time.sleep(2.0)                     # older than the writeback interval now
        recent = _produce(cluster, 3, first=3)
        cluster.kill(0, signal.SIGKILL)
        report = drop_unsynced(cluster.undo_dir)
        cluster.start_node(0)
        cluster.wait_ready(60)
        assert _read_all(cluster, len(old) + len(recent)) == old, report.summary()
    finally:
        cluster.stop()
