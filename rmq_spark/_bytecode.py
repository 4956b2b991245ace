"""Byte-compile the zips Spark puts first on every Python worker's path.

Spark starts its Python processes (the worker daemon, and a fresh interpreter
for each streaming query's source: ``python_streaming_source_runner``) with
``SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip ahead of site-packages.
pip installs those zips with sources only, and ``zipimport`` never writes
bytecode, so every such process compiled pyspark again: importing the
streaming source runner took 1.4-1.6 s from the zip against 0.6 s with
bytecode (2 cores), paid again by every streaming query at start and by every
forked worker importing a module the daemon had not.

``compile_zip`` adds ``name.pyc`` next to each ``name.py`` inside the zip, the
layout ``zipimport`` looks for first. Each ``.pyc`` is stamped with its source
entry's time and size, so ``zipimport`` uses it only while it matches that
source and this interpreter's magic number, and compiles the source as before
otherwise. The zip is rewritten beside itself and renamed into place, with a
zip comment naming the magic number; a zip compiled for this interpreter is
left alone.

Run by the Makefile's install step: ``python -m rmq_spark._bytecode``, with
no Spark application running (a running worker daemon keeps the old zip's
directory cached and would fail its next import from the replaced file).
"""
from __future__ import annotations

import glob
import importlib.util
import marshal
import os
import shutil
import struct
import sys
import time
import zipfile

__all__ = ["compile_zip", "spark_python_zips", "is_compiled"]


def spark_python_zips() -> list[str]:
    """pyspark's and py4j's zips under the Spark home a pip-installed pyspark uses."""
    import pyspark

    homes = [os.path.dirname(pyspark.__file__)]
    if os.environ.get("SPARK_HOME"):
        homes.insert(0, os.environ["SPARK_HOME"])
    for home in homes:
        found = sorted(glob.glob(os.path.join(home, "python", "lib", "*.zip")))
        if found:
            return found
    return []


def _source_mtime(info: zipfile.ZipInfo) -> int:
    """The source time zipimport checks a .pyc against (the entry's DOS time, local)."""
    return int(time.mktime(info.date_time + (-1, -1, -1))) & 0xFFFFFFFF


def _pyc(code, info: zipfile.ZipInfo) -> bytes:
    """A timestamp-validated .pyc (PEP 552: magic, flags 0, mtime, source size)."""
    header = importlib.util.MAGIC_NUMBER + struct.pack(
        "<III", 0, _source_mtime(info), info.file_size & 0xFFFFFFFF)
    return header + marshal.dumps(code)


def _marker() -> bytes:
    """The zip comment of a zip compiled for this interpreter."""
    return b"rmq_spark._bytecode 2 " + importlib.util.MAGIC_NUMBER.hex().encode()


def is_compiled(path: str) -> bool:
    """True if ``compile_zip`` compiled the zip for this interpreter's bytecode."""
    with zipfile.ZipFile(path) as z:
        return z.comment == _marker()


def compile_zip(path: str) -> int:
    """Add bytecode for every ``.py`` in the zip at ``path``; returns the modules compiled
    (0 if it was already compiled). A source that does not compile is left as source."""
    if is_compiled(path):
        return 0
    archive = os.path.abspath(path)
    tmp = f"{archive}.{os.getpid()}.tmp"
    compiled = 0
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            names = set(src.namelist())
            for info in src.infolist():
                if info.filename.endswith(".pyc") and info.filename[:-1] in names:
                    continue                  # stale bytecode of another interpreter
                data = src.read(info)
                out.writestr(info, data)
                if not info.filename.endswith(".py"):
                    continue
                try:     # the file name zipimport gives the module: tracebacks match
                    code = compile(data, os.path.join(archive, info.filename), "exec",
                                   dont_inherit=True, optimize=0)
                except (SyntaxError, ValueError):
                    continue                  # zipimport reports it from the source, as before
                entry = zipfile.ZipInfo(info.filename + "c", info.date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(entry, _pyc(code, info))
                compiled += 1
            out.comment = _marker()
        shutil.copymode(archive, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, archive)
        dir_fd = os.open(os.path.dirname(archive), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return compiled


def main() -> int:
    zips = spark_python_zips()
    if not zips:
        print("rmq_spark._bytecode: no Spark Python zips found (is pyspark installed?)",
              file=sys.stderr)
        return 0
    for path in zips:
        try:
            n = compile_zip(path)
        except OSError as e:        # a read-only install: workers just compile as before
            print(f"rmq_spark._bytecode: {path}: not compiled ({e})", file=sys.stderr)
            continue
        print(f"{path}: {'already compiled' if n == 0 else f'{n} modules compiled'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
