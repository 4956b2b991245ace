package io.rmqspark.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeRead;
import org.apache.spark.unsafe.types.UTF8String;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.zip.CRC32;

/**
 * Reads one queue. A micro-batch task reads [start, end) and ends; a real-time task reads
 * from start until Spark ends the batch, each fetch a long poll of at most a second (the
 * node answers as soon as a message is appended). ``getOffset`` is the offset after the
 * last row handed out: what was fetched and not handed out is fetched again next batch.
 */
final class RtReader implements SupportsRealTimeRead<InternalRow> {
  private static final Logger LOG = LoggerFactory.getLogger(RtReader.class);
  private static final long POLL_MS = 1000;
  private static final long CALL_MS = 60_000;     // a fetch that finds no node for this long fails the task

  private final RtPartition p;
  private final NodeApi api;
  private final UTF8String topic;
  private final long topicCrc;
  private final ArrayDeque<Buffered> buffered = new ArrayDeque<>();
  private long next;
  private InternalRow current;

  RtReader(RtPartition p) {
    this.p = p;
    this.api = NodeApi.shared(p.opts.endpoints, p.opts.token, p.opts.tlsCaFile, p.opts.tlsCertFile,
        p.opts.tlsKeyFile);
    this.topic = UTF8String.fromString(p.topic);
    CRC32 crc = new CRC32();
    crc.update(p.topic.getBytes(StandardCharsets.UTF_8));
    this.topicCrc = crc.getValue();
    this.next = p.start;
  }

  @Override
  public boolean next() throws IOException {
    while (true) {
      if (take()) {
        return true;
      }
      if (next >= p.end) {
        return false;
      }
      fill(0);
    }
  }

  @Override
  public RecordStatus nextWithTimeout(Long startTimeMs, Long timeoutMs) throws IOException {
    long deadline = startTimeMs + timeoutMs;
    while (true) {
      if (take()) {
        return RecordStatus.newStatusWithArrivalTimeMs(lastStoreTs);
      }
      long left = deadline - System.currentTimeMillis();
      if (left <= 0) {
        return RecordStatus.newStatusWithoutArrivalTime(false);
      }
      fill(Math.min(left, POLL_MS));
    }
  }

  private long lastStoreTs;

  /** A fetched record not handed out yet: its row, offset and store time. */
  private static final class Buffered {
    final InternalRow row;
    final long offset;
    final long storeTs;

    Buffered(InternalRow row, long offset, long storeTs) {
      this.row = row;
      this.offset = offset;
      this.storeTs = storeTs;
    }
  }

  /** The next buffered message within the partition's range as ``current``. */
  private boolean take() {
    Buffered m = buffered.poll();
    if (m == null) {
      return false;
    }
    if (m.offset >= p.end) {
      buffered.clear();
      next = p.end;            // nothing left below the end (compaction removed the rest)
      return false;
    }
    lastStoreTs = m.storeTs;
    current = m.row;
    next = m.offset + 1;
    return true;
  }

  private void fill(long waitMs) throws IOException {
    int max = p.end == Long.MAX_VALUE ? p.opts.maxMessagesPerFetch
        : (int) Math.min(p.opts.maxMessagesPerFetch, p.end - next);
    NodeApi.Fetched got;
    try {
      got = api.fetch(api.leader(p.topic, p.queue), p.topic, p.queue, next, Math.max(1, max), waitMs,
          System.currentTimeMillis() + waitMs + CALL_MS);
    } catch (NodeApi.NodeError e) {
      if ("INVALID_ARGUMENT".equals(e.code) && e.getMessage().contains("encoding")) {
        throw new IOException("a storage node is older than this connector (it does not answer "
            + "encoding=batches): upgrade the nodes before the Spark jobs' rmq-spark (" + e.getMessage() + ")", e);
      }
      if (!"OUT_OF_RANGE".equals(e.code)) {
        throw e;
      }
      dataLoss(e);
      return;
    }
    api.served(p.topic, p.queue, got.servedBy);
    Batches.decode(got.batches, next, p.end, (offset, storeTs, bornTs, key, value, tags, pk, pv) ->
        buffered.add(new Buffered(row(offset, storeTs, bornTs, key, value, tags, pk, pv), offset, storeTs)));
    if (buffered.isEmpty()) {
      // nothing at next: a gap (compaction) the node stepped over, or the end
      next = Math.min(Math.max(next, got.next), p.end);
    }
  }

  /** ``next`` is not in the queue any more: retention or compaction cut below it, or the
   * queue went back (the topic deleted and made again). As the Python source: fail naming
   * the range, or with failOnDataLoss=false go on from the queue's earliest offset. */
  private void dataLoss(NodeApi.NodeError e) throws IOException {
    NodeApi.Queue q = null;
    for (NodeApi.Queue each : api.describe(p.topic, System.currentTimeMillis() + CALL_MS)) {
      if (each.queue == p.queue) {
        q = each;
      }
    }
    if (q == null) {
      throw new IOException("topic " + p.topic + " has no queue " + p.queue + " any more", e);
    }
    String why = next < q.earliest
        ? RtStream.lost(p.topic, p.queue, next, Math.min(q.earliest, p.end), "were removed by retention before "
            + "they were read (the queue now starts at " + q.earliest + ")")
        : RtStream.wentBackError(p.topic, p.queue, next, q.latest, q.earliest);
    if (p.opts.failOnDataLoss) {
      throw new IOException(why, e);
    }
    RtStream.skipping(LOG, why);
    next = Math.min(q.earliest, p.end);
  }

  private InternalRow row(long offset, long storeTs, long bornTs, byte[] key, byte[] value, String tags,
                          String[] propKeys, String[] propValues) {
    Object[] keys = new Object[propKeys.length];
    Object[] values = new Object[propValues.length];
    for (int i = 0; i < keys.length; i++) {
      keys[i] = UTF8String.fromString(propKeys[i]);
      values[i] = UTF8String.fromString(propValues[i]);
    }
    return new GenericInternalRow(new Object[] {
        key,
        value,
        topic,
        p.queue,
        offset,
        storeTs * 1000L,
        bornTs * 1000L,
        UTF8String.fromString(tags),
        new ArrayBasedMapData(new GenericArrayData(keys), new GenericArrayData(values)),
        UTF8String.fromString(String.format("%08X%04X%016X", topicCrc, p.queue, offset)),
    });
  }

  @Override
  public InternalRow get() {
    return current;
  }

  @Override
  public PartitionOffset getOffset() {
    return new RtPartition.Position(p.topic, p.queue, next);
  }

  @Override
  public void close() {
  }
}
