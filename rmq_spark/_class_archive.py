"""Build the JVM class archive every Spark driver of ours starts with (AppCDS).

A Spark driver JVM loads and verifies some 10,000 classes from pyspark's jars
before its first query, on every start: each job of ``rmq tier`` / ``rmq
compact``, each notebook, each test that starts Spark in a subprocess. The
JDK can keep those classes parsed and verified in a file that later JVMs map
(class data sharing; a dynamic archive, JDK 13+): a driver started with
``-XX:SharedArchiveFile`` skips that work. On this 2-core VM a session that
writes and reads a small Delta table took 44.7-46.3 s of JVM CPU and 24-25 s
against 51.8-54.7 s and 28.5-29.8 s without it (2 runs each, alternating).

``python -m rmq_spark._class_archive PATH`` (run by ``make jars``) starts a
session the way ``session_builder`` does, with ``-XX:ArchiveClassesAtExit``,
runs a small workload (Delta and Parquet writes and reads, a streaming query),
stops, waits for the JVM to write the archive as it exits, and renames it to
PATH. ``session_builder`` adds the archive to ``spark.driver.defaultJavaOptions``
when the file is there (``class_archive_options``).

What the JVM checks before it uses the file: the same JDK build, the same
base archive, and a classpath that starts with the one it was dumped with
(pyspark's jars, their sizes and times). Anything else, and it runs without
the archive exactly as before (``-Xlog:cds=off`` keeps that quiet: the
warning would land on the job's stdout). Classes of the jars Spark adds at run
time (``spark.jars``: Delta, S3A) are used from it only while those jars are
unchanged. A new venv or new jars rebuild it (the Makefile's dependencies).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

__all__ = ["build"]

# How long the JVM may take to write the archive after the session stopped
# (~190 MB; 2-5 s on the test VM).
_DUMP_TIMEOUT_S = 180.0


def _workload(spark, scratch: str) -> None:
    """What most of our drivers do in their first seconds: Delta and Parquet, a
    grouped aggregate, a streaming query with a checkpoint."""
    delta, parquet = os.path.join(scratch, "delta"), os.path.join(scratch, "parquet")
    df = spark.range(2000).selectExpr("id", "cast(id as string) as key", "id % 7 as g",
                                      "current_timestamp() as ts")
    df.write.format("delta").save(delta)
    spark.read.format("delta").load(delta).groupBy("g").count().collect()
    df.write.partitionBy("g").parquet(parquet)
    files = spark.read.parquet(parquet)
    files.filter("id > 5").orderBy("key").limit(3).collect()
    query = (spark.readStream.schema(files.schema).parquet(parquet)
             .writeStream.format("delta").trigger(availableNow=True)
             .option("checkpointLocation", os.path.join(scratch, "checkpoint"))
             .start(os.path.join(scratch, "stream")))
    query.awaitTermination(120)


def build(path: str) -> bool:
    """Write the archive to ``path``; False (and ``path`` left alone) when this JVM
    cannot dump one."""
    from pyspark import SparkContext

    from .spark import QUIET_CDS, SHORT_LIVED_JVM, session_builder

    path = os.path.abspath(path)
    partial = f"{path}.partial-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="rmq-class-archive-") as scratch:
        # (replaces the archive options session_builder gives when an older archive is there)
        # A dynamic archive holds classes, not compiled code or heap objects: this
        # one-minute JVM runs with C1 and the serial GC (45 s and 52 CPU-s against 56 s
        # and 85 on 2 cores), and the archive maps into drivers with any JIT or GC.
        spark = (session_builder("rmq-class-archive", master="local[2]")
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.defaultJavaOptions",
                         f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS} {SHORT_LIVED_JVM}")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            _workload(spark, scratch)
        finally:
            gateway = SparkContext._gateway
            spark.stop()
            # The JVM writes the archive on a normal exit, which it takes when
            # its stdin closes (pyspark's launcher contract).
            gateway.shutdown()
            gateway.proc.stdin.close()
            gateway.proc.wait(_DUMP_TIMEOUT_S)
    if not os.path.exists(partial):
        print(f"no class archive written to {partial}: Spark drivers will start without one",
              file=sys.stderr)
        return False
    os.replace(partial, path)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rmq_spark._class_archive PATH", file=sys.stderr)
        return 2
    t = time.monotonic()
    ok = build(argv[0])
    if ok:
        print(f"JVM class archive {argv[0]}: {os.path.getsize(argv[0]) >> 20} MiB "
              f"in {time.monotonic() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
