"""Driver for test_realtime's kill -9 test: a real-time query copying SRC into DST.

Usage: python _realtime_copy.py ENDPOINTS SRC DST CHECKPOINT   (runs until killed)
"""
import sys

from rmq_spark.realtime import to_rocketmq
from rmq_spark.spark import session_builder

endpoints, src, dst, checkpoint = sys.argv[1:5]
spark = (session_builder("rmq-realtime-copy", master="local[4]")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows = (spark.readStream.format("rocketmq-rt").option("endpoints", endpoints).option("topic", src)
        .option("startingOffsets", "earliest").load().select("key", "value", "tags"))
query = to_rocketmq(rows.writeStream.outputMode("update").trigger(realTime="5 seconds")
                    .option("checkpointLocation", checkpoint), endpoints, dst).start()
print("started", flush=True)
query.awaitTermination()
