"""Driver program for test_standalone: runs against spark://..., prints one JSON line.

Usage: python _standalone_driver.py MASTER ENDPOINTS SRC DST CHECKPOINT
"""
import json
import os
import sys

from pyspark.sql import SparkSession


def executor_jvm(_):
    """The pid of the executor JVM above this Python worker (Linux /proc), or None."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return None


master, endpoints, src, dst, checkpoint = sys.argv[1:6]
spark = (SparkSession.builder.master(master).appName("rmq-standalone-test")
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
         .config("spark.executor.cores", "2").config("spark.cores.max", "2")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
executor_pids = sorted(set(spark.sparkContext.parallelize(range(4), 4)
                           .map(executor_jvm).collect()), key=str)
df = spark.read.format("rocketmq").option("endpoints", endpoints).option("topic", src).load()
batch_count = df.count()
df.select("key", "value").write.format("rocketmq").option("endpoints", endpoints) \
    .option("topic", dst).mode("append").save()
seen = []
q = (spark.readStream.format("rocketmq").option("endpoints", endpoints).option("topic", dst)
     .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150").load()
     .writeStream.foreachBatch(lambda b, i: seen.append(b.count()))
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
q.awaitTermination(180)
print(json.dumps({"driver_pid": os.getpid(), "executor_pids": executor_pids,
                  "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
                  "batch_count": batch_count, "stream_batches": seen}))
spark.stop()
