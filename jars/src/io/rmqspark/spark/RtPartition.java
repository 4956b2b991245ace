package io.rmqspark.spark;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;

/** One queue of one batch: offsets [start, end); end Long.MAX_VALUE in real-time mode. */
final class RtPartition implements InputPartition {
  final RtOptions opts;
  final String topic;
  final int queue;
  final long start;
  final long end;

  RtPartition(RtOptions opts, String topic, int queue, long start, long end) {
    this.opts = opts;
    this.topic = topic;
    this.queue = queue;
    this.start = start;
    this.end = end;
  }

  /** Where a task's reading of a queue stands: the next offset to read. */
  static final class Position implements PartitionOffset {
    final String topic;
    final int queue;
    final long next;

    Position(String topic, int queue, long next) {
      this.topic = topic;
      this.queue = queue;
      this.next = next;
    }
  }
}
