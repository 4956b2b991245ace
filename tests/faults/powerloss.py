"""Power-loss emulation for real processes: what was written but not synced is gone.

A process started with ``shim_env(root, undo_dir)`` in its environment runs
with ``unsynced.c`` preloaded (``LD_PRELOAD``). The shim sees the libc calls
the process really makes and, before each change to a file under ``root``,
appends to an undo journal in ``undo_dir`` what a power loss at that moment
would have to take back. After the process was SIGKILLed, ``drop_unsynced``
applies the journal: every tracked file is left as a power loss would leave
it, the worst case a POSIX filesystem allows (only what was explicitly synced
survives; ext4 with ``data=ordered`` usually keeps more). The OS itself does
not crash here: the journal is written with plain ``write()`` and survives
the SIGKILL.

Usage::

    env = {**os.environ, **shim_env(data_dir, undo_dir)}
    proc = subprocess.Popen([...], env=env)
    ...
    proc.kill(); proc.wait()
    report = drop_unsynced(undo_dir)       # then restart the process on data_dir
    print(report.summary())

The journal's paths are only hints: at the restore, each inode's current name
is found by walking root (and the kept links in ``undo_dir``), so data undo
follows files through later renames.

Emulated
--------
* Tracked files: regular files under ``root`` opened through ``open``,
  ``open64``, ``openat``, ``openat64``, ``creat``/``creat64`` (and the
  fortified ``__open*_2``); the path's directory is resolved (symlinks,
  ``..``, ``dirfd``) at the open. State is kept per inode ``(st_dev, st_ino)``,
  not per descriptor; descriptors made with ``dup``/``dup2``/``dup3`` or
  ``fcntl(F_DUPFD[_CLOEXEC])`` (Python's ``os.dup``) write to the same inode.
  The files of ``undo_dir`` are never tracked, even when it is inside root.
* Data: ``write``, ``writev``, ``pwrite``/``pwrite64``, ``pwritev``/
  ``pwritev64``/``pwritev2``/``pwritev64v2`` (offset -1, ``RWF_APPEND``),
  ``sendfile``/``sendfile64`` and ``copy_file_range`` into a tracked file,
  ``O_APPEND`` (the position is the size), ``ftruncate``/``ftruncate64``,
  ``truncate``/``truncate64`` (by path), ``O_TRUNC`` at open,
  ``fallocate``/``fallocate64`` (punch/zero/collapse/insert keep a
  pre-image), ``posix_fallocate``/``posix_fallocate64``. Before the change
  the journal gets the file's size and the pre-image of the bytes it
  overwrites below that size. At the crash every change made after the
  inode's last sync is undone, newest first, and the file is cut to its size
  as of that sync (0 for a file created and never synced).
* Syncs: ``fsync``/``fdatasync`` through any descriptor of the inode (a
  ``dup``, or one opened separately) make the inode's changes made before the
  call durable (changes racing with it on other threads are not). Files opened
  ``O_SYNC``/``O_DSYNC`` and ``pwritev2(RWF_SYNC/RWF_DSYNC)`` are durable per
  write. ``sync()`` and ``syncfs()`` make everything durable.
* Names: a file created by ``O_CREAT`` (or a name made by ``link``/``linkat``)
  disappears at the crash unless its directory was fsynced afterwards, even if
  its data was fsynced (POSIX). With the directory synced but not the data, it
  comes back with its synced size (0 if never synced). ``rename``/
  ``renameat``/``renameat2`` of a regular file within root is undone unless
  the directory of the new name was fsynced afterwards: the old name comes
  back, and a file it replaced is back under the new name (a hard link to it
  is kept in ``undo_dir`` until the directory is synced). ``unlink``/
  ``unlinkat``/``remove`` of a regular file: the same (hard link kept, name
  back unless the directory was synced). A file whose removal is durable
  takes its unsynced writes with it: nothing of it to undo. A directory fsync is ``fsync``/
  ``fdatasync`` of a descriptor of a directory under root.
  ``drop_unsynced(names="ext4")`` is kinder, as ext4 (journaled) is in
  practice: a successful ``fsync``, or ``fdatasync`` of a file whose size
  changed since its last sync, commits the filesystem journal and with it every
  create, rename and unlink made before it, in any directory.
* Writeback (``writeback_s``): the kernel's periodic writeback. A thread in the
  process marks every change (data and names) older than ``writeback_s``
  seconds durable, about every ``writeback_s / 5`` (10-100 ms), as ext4's
  flusher and journal commit would. Unset: nothing is ever written back (the
  worst case). This shows what ``--fsync none`` loses: about the last
  ``writeback_s`` seconds.
* Several processes: journals are per process (``journal-<pid>-<ns>.bin``,
  also after ``fork``), records carry CLOCK_MONOTONIC timestamps, and
  ``drop_unsynced`` merges all of them into one timeline, so a sync in one
  process covers another's earlier writes to the same inode.

Not emulated (call through, treated as durable at once or not seen at all)
--------------------------------------------------------------------------
* Directories: ``mkdir``, ``rmdir``, renaming or removing a directory are
  durable at once (``os.makedirs`` of a data directory is never undone; a
  ``shutil.rmtree``'s files are kept as links but cannot come back once their
  directory is gone: reported as skipped). Symlinks, ``mknod``, renames of
  symlinks, ``RENAME_EXCHANGE``, renames into or out of root.
* Writes the shim cannot see: through shared writable ``mmap``; C stdio
  (``fopen``/``fwrite``: glibc calls its internal write, not the ``write``
  symbol; Python's file objects do not use stdio); ``splice``/``vmsplice``,
  ``io_uring``, AIO, raw ``syscall()``; files opened by ``O_TMPFILE`` (and
  linked in later), or before the shim's constructor ran; other processes
  without the shim.
* Partial outcomes: an unsynced change is undone whole (no torn sectors or
  pages, no subset of the unsynced writes surviving in some other order, which
  a real disk may do); no failing fsync (EIO, lost writeback errors).
  ``sync_file_range`` and ``msync`` sync nothing here.
* A rename across two directories is durable when the new name's directory
  is synced (whatever happened to the old one's).
* Bookkeeping is coarser than the minimum: every change records the size
  before it and the pre-image of every byte it overwrites below that size
  (also bytes appended since the last sync; harmless, a bit more journal), so
  syncs racing with writes on other threads need no care.
* The undo dir must be on root's filesystem (hard links); ``shim_env``
  checks it.

Costs: per write to a tracked file, an ``fstat``, an ``fcntl(F_GETFL)``, a
journal record (96 bytes + the pre-image of overwritten bytes) under one
process-wide mutex held across the real write. Other descriptors (sockets,
pipes, files outside root) go straight through after one table lookup; every
``open`` resolves its directory (``realpath``). Meant for tests, not for
benchmarks: the journal grows with every write.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import struct
import shutil
import subprocess
from collections import defaultdict

__all__ = ["LossReport", "build_shim", "drop_unsynced", "shim_env"]

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unsynced.c")
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-U_FORTIFY_SOURCE")
LIBS = ("-ldl", "-pthread")

MAGIC = 0x50574C53
HEAD = struct.Struct("<IIQQ8QII")      # struct rec in unsynced.c
R_HELLO, R_CHANGE, R_SYNC, R_DIRSYNC, R_SYNCALL, R_NEWNAME, R_RENAME, R_UNLINK = range(1, 9)


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rmq-spark", "powerloss")


def build_shim() -> str:
    """Compile ``unsynced.c`` (once per content and flags; again when the source
    is newer than the library) into the user's cache dir; the ``.so`` path."""
    with open(SRC, "rb") as f:
        src = f.read()
    digest = hashlib.sha256(src + " ".join(CFLAGS + LIBS).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    out = os.path.join(out_dir, f"unsynced-{digest}.so")
    try:
        if os.path.getmtime(out) >= os.path.getmtime(SRC):
            return out
    except FileNotFoundError:
        pass
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:                       # a fresh machine: Debian's compiler, as for the clock fix
        from .clock import _apt_install
        _apt_install(["gcc", "libc6-dev"], "building the power-loss shim")
        cc = shutil.which("gcc") or "gcc"
    res = subprocess.run([cc, *CFLAGS, "-o", tmp, SRC, *LIBS], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the power-loss shim failed:\n{res.stderr}")
    os.replace(tmp, out)                 # concurrent builders: each rename is whole
    return out


def _device_of(path: str) -> int:
    """st_dev of path, or of its nearest existing ancestor."""
    while True:
        try:
            return os.stat(path).st_dev
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                raise
            path = parent


def shim_env(root: str, undo_dir: str, writeback_s: float | None = None) -> dict[str, str]:
    """Environment variables to add to a child process: files under ``root`` are
    tracked, the undo journal goes to ``undo_dir`` (created; must be on root's
    filesystem), and with ``writeback_s`` changes older than that count as
    written back by the kernel (None: never; the worst case)."""
    root = os.path.realpath(root)
    undo = os.path.realpath(undo_dir)
    os.makedirs(undo, exist_ok=True)
    if _device_of(root) != os.stat(undo).st_dev:
        raise ValueError(f"undo dir {undo} must be on the filesystem of {root} "
                         f"(replaced and unlinked files are kept there as hard links)")
    preload = build_shim()
    inherited = os.environ.get("LD_PRELOAD")
    env = {"LD_PRELOAD": f"{preload}:{inherited}" if inherited else preload,
           "POWERLOSS_ROOT": root, "POWERLOSS_UNDO_DIR": undo}
    if writeback_s is not None:
        if writeback_s <= 0:
            raise ValueError("writeback_s must be positive (None: no writeback)")
        env["POWERLOSS_WRITEBACK_S"] = repr(float(writeback_s))
    return env


@dataclasses.dataclass
class LossReport:
    """What ``drop_unsynced`` did. Paths are absolute."""
    journals: int = 0
    records: int = 0
    # (path, size at the crash, size now): cut back to the size of the last sync
    truncated: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    # (path, bytes): overwritten bytes put back (their pre-image)
    restored: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)       # names created and not durable
    # (new, old): a rename undone
    renamed_back: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    relinked: list[str] = dataclasses.field(default_factory=list)      # replaced/unlinked names back
    skipped: list[str] = dataclasses.field(default_factory=list)       # what could not be undone, and why
    bytes_dropped: int = 0      # bytes cut off past the synced sizes + overwritten bytes put back

    @property
    def changed(self) -> bool:
        return bool(self.truncated or self.restored or self.removed or self.renamed_back or self.relinked)

    def summary(self) -> str:
        s = (f"power loss: {self.bytes_dropped} unsynced bytes dropped; {len(self.truncated)} file(s) "
             f"truncated, {len(self.restored)} with overwritten bytes put back, {len(self.removed)} new "
             f"name(s) removed, {len(self.renamed_back)} rename(s) undone, {len(self.relinked)} name(s) "
             f"brought back ({self.records} records in {self.journals} journal(s))")
        return s + (f"; {len(self.skipped)} skipped" if self.skipped else "")


@dataclasses.dataclass
class _Rec:
    type: int
    seq: int
    v: tuple[int, ...]
    strs: list[str]
    data: bytes


def _read_journal(path: str) -> list[_Rec]:
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos + HEAD.size <= len(data):
        magic, typ, total, seq, *rest = HEAD.unpack_from(data, pos)
        v, nstr = tuple(rest[:8]), rest[8]
        if magic != MAGIC or total < HEAD.size or pos + total > len(data):
            break                        # a record cut by the kill: its change was not made yet
        p, strs = pos + HEAD.size, []
        for _ in range(nstr):
            (n,) = struct.unpack_from("<I", data, p)
            strs.append(os.fsdecode(data[p + 4:p + 4 + n]))
            p += 4 + n
        out.append(_Rec(typ, seq, v, strs, data[p:pos + total]))
        pos += total
    return out


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _holds(path: str, dev: int, ino: int) -> bool:
    st = _lstat(path)
    return st is not None and (st.st_dev, st.st_ino) == (dev, ino)


def _inode_paths(roots: set[str], undo: str) -> dict[tuple[int, int], str]:
    """(dev, ino) -> a name of every regular file under the roots, and the kept links."""
    found: dict[tuple[int, int], str] = {}
    for root in sorted(roots):
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(dirpath, d) != undo]
            for name in files:
                p = os.path.join(dirpath, name)
                st = _lstat(p)
                if st is not None and stat.S_ISREG(st.st_mode):
                    found.setdefault((st.st_dev, st.st_ino), p)
    for name in os.listdir(undo):
        if name.startswith("keep-"):
            p = os.path.join(undo, name)
            st = _lstat(p)
            if st is not None:
                found.setdefault((st.st_dev, st.st_ino), p)
    return found


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _undo_data(path: str, recs: list[_Rec], report: LossReport) -> None:
    """Undo an inode's unsynced changes (oldest first in ``recs``)."""
    target = recs[0].v[2]                # its size as of the last sync
    spans = _merge([(r.v[3], min(r.v[3] + len(r.data), target)) for r in recs
                    if r.data and r.v[3] < target])
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        before = [os.pread(fd, b - a, a) for a, b in spans]
        for r in reversed(recs):
            if r.data:
                os.pwrite(fd, r.data, r.v[3])
        os.ftruncate(fd, target)
        differ = 0
        for (a, b), old in zip(spans, before):
            new = os.pread(fd, b - a, a)
            differ += sum(x != y for x, y in zip(old, new)) + abs(len(new) - len(old))
    finally:
        os.close(fd)
    if size != target:
        report.truncated.append((path, size, target))
    if differ:
        report.restored.append((path, differ))
    report.bytes_dropped += max(0, size - target) + differ


NAME_RULES = ("posix", "ext4")


def drop_unsynced(undo_dir: str, names: str = "posix") -> LossReport:
    """After the tracked process(es) died (SIGKILL): apply every undo journal in
    ``undo_dir`` so each tracked file is as a power loss would leave it, then
    remove the journals and kept links (a restarted process starts fresh).

    ``names``: when creates, renames and unlinks are durable. ``"posix"`` (the
    worst case): only once their directory is fsynced. ``"ext4"``: also once any
    later ``fsync``, or ``fdatasync`` of a file whose size changed since its last
    sync, succeeded: ext4 (journaled) commits its whole running transaction
    then, every name change before it included."""
    if names not in NAME_RULES:
        raise ValueError(f"names={names!r}; one of {', '.join(NAME_RULES)}")
    undo = os.path.realpath(undo_dir)
    report = LossReport()
    journals = sorted(os.path.join(undo, n) for n in os.listdir(undo)
                      if n.startswith("journal-") and n.endswith(".bin"))
    recs: list[_Rec] = []
    for j in journals:
        recs.extend(_read_journal(j))
    recs.sort(key=lambda r: r.seq)       # stable: each journal is in order already
    report.journals, report.records = len(journals), len(recs)

    roots = {r.strs[0] for r in recs if r.type == R_HELLO}
    all_upto = max((r.v[0] for r in recs if r.type == R_SYNCALL), default=0)
    # ext4: a sync that commits the journal (fsync; fdatasync after the size changed)
    names_upto = max((r.v[2] for r in recs if r.type == R_SYNC and (r.v[3] or r.v[4])), default=0)
    if names == "posix":
        names_upto = 0
    synced: dict[tuple[int, int], int] = defaultdict(int)
    dir_synced: dict[tuple[int, int], int] = defaultdict(int)
    born: dict[tuple[int, int], int] = defaultdict(int)   # seq at which O_CREAT made the inode
    for r in recs:
        if r.type == R_SYNC:
            synced[r.v[0], r.v[1]] = max(synced[r.v[0], r.v[1]], r.v[2])
        elif r.type == R_DIRSYNC:
            dir_synced[r.v[0], r.v[1]] = max(dir_synced[r.v[0], r.v[1]], r.v[2])
        elif r.type == R_NEWNAME and r.v[4]:
            born[r.v[2], r.v[3]] = max(born[r.v[2], r.v[3]], r.seq)

    def durable(seq: int, dev: int, ino: int) -> bool:
        """A name change at ``seq`` in directory (dev, ino) survives the power loss."""
        return seq <= max(all_upto, names_upto, dir_synced[dev, ino])

    # Inodes whose last name went for good (an unlink, or a rename over it, made
    # durable): their unsynced writes vanish with them, nothing to undo.
    removed: set[tuple[int, int]] = set()
    for r in recs:
        if r.type == R_UNLINK and durable(r.seq, r.v[0], r.v[1]) and r.seq >= born[r.v[2], r.v[3]]:
            removed.add((r.v[2], r.v[3]))
        elif (r.type == R_RENAME and r.v[7] and durable(r.seq, r.v[2], r.v[3])
              and r.seq >= born[r.v[6], r.v[7]]):
            removed.add((r.v[6], r.v[7]))

    # Data: per inode, the changes after its last sync (of this incarnation of
    # the inode number: records before O_CREAT made it are of a file long gone).
    lost: dict[tuple[int, int], list[_Rec]] = defaultdict(list)
    for r in recs:
        if r.type == R_CHANGE:
            key = (r.v[0], r.v[1])
            if r.seq > max(all_upto, synced[key]) and r.seq >= born[key]:
                lost[key].append(r)
    if lost:
        names = _inode_paths(roots, undo)
        for key, changes in lost.items():
            path = names.get(key)
            if path is None and key in removed:
                continue                 # removed for good: its writes went with it
            if path is None:
                report.skipped.append(f"{len(changes)} unsynced change(s) of inode {key[0]}:{key[1]}: "
                                      f"no name of it left under root")
                continue
            _undo_data(path, changes, report)

    # Names: newest first, what no directory sync made durable.
    for r in reversed(recs):
        if r.type == R_NEWNAME and not durable(r.seq, r.v[0], r.v[1]):
            path = r.strs[0]
            if _holds(path, r.v[2], r.v[3]):
                os.unlink(path)
                report.removed.append(path)
        elif r.type == R_RENAME and not durable(r.seq, r.v[2], r.v[3]):
            old, new, keep = r.strs
            if not _holds(new, r.v[4], r.v[5]):
                report.skipped.append(f"rename {old} -> {new}: {new} no longer holds the file it moved")
                continue
            os.rename(new, old)
            report.renamed_back.append((new, old))
            if r.v[7]:
                if keep and _holds(keep, r.v[6], r.v[7]):
                    os.link(keep, new)
                    report.relinked.append(new)
                else:
                    report.skipped.append(f"rename {old} -> {new}: the file it replaced was not kept")
        elif r.type == R_UNLINK and not durable(r.seq, r.v[0], r.v[1]):
            path, keep = r.strs
            if not (keep and _holds(keep, r.v[2], r.v[3])):
                report.skipped.append(f"unlink {path}: the file was not kept")
            elif os.path.lexists(path) or not os.path.isdir(os.path.dirname(path)):
                report.skipped.append(f"unlink {path}: the name is taken or its directory is gone")
            else:
                os.link(keep, path)
                report.relinked.append(path)

    for name in os.listdir(undo):
        if name.startswith("keep-") or (name.startswith("journal-") and name.endswith(".bin")):
            os.unlink(os.path.join(undo, name))
    return report
