package io.rmqspark.spark;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeMode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The stream of ``format("rocketmq-rt")``. In micro-batch mode each batch reads every
 * queue from the last batch's end to the latest offsets; in real-time mode each batch
 * reads every queue from the last batch's end for the batch's duration, and the tasks'
 * own positions (``RtReader.getOffset``) become the next start (``mergeOffsets``).
 * The queues of a topic are those it had when the query started.
 */
final class RtStream implements MicroBatchStream, SupportsRealTimeMode, SupportsAdmissionControl {
  private static final long DESCRIBE_MS = 30_000;
  private static final Logger LOG = LoggerFactory.getLogger(RtStream.class);

  private final RtOptions opts;
  private final NodeApi api;
  private RtOffset initial;

  RtStream(RtOptions opts) {
    this.opts = opts;
    this.api = NodeApi.shared(opts.endpoints, opts.token, opts.tlsCaFile, opts.tlsCertFile, opts.tlsKeyFile);
  }

  private Map<String, List<NodeApi.Queue>> describe() {
    Map<String, List<NodeApi.Queue>> out = new TreeMap<>();
    try {
      for (String t : opts.topics) {
        out.put(t, api.describe(t, System.currentTimeMillis() + DESCRIBE_MS));
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out;
  }

  @Override
  public Offset initialOffset() {
    if (initial == null) {          // one answer: Spark asks more than once as a query starts
      Map<String, Map<Integer, Long>> pos = new TreeMap<>();
      describe().forEach((t, queues) -> {
        Map<Integer, Long> qs = new TreeMap<>();
        for (NodeApi.Queue q : queues) {
          long at;
          Long given = opts.startingJson == null ? null : opts.startingJson.getOrDefault(t, Map.of()).get(q.queue);
          if (given != null && given >= 0) {
            at = Math.max(given, q.earliest);
          } else if ((given != null && given == -2) || "earliest".equals(opts.starting)
              || (given == null && opts.startingJson != null)) {
            at = q.earliest;        // (JSON without this queue: earliest, as the Python source)
          } else {
            at = q.latest;
          }
          qs.put(q.queue, at);
        }
        pos.put(t, qs);
      });
      initial = new RtOffset(pos);
    }
    return initial;
  }

  @Override
  public Offset latestOffset() {
    Map<String, Map<Integer, Long>> pos = new TreeMap<>();
    describe().forEach((t, queues) -> {
      Map<Integer, Long> qs = new TreeMap<>();
      for (NodeApi.Queue q : queues) {
        qs.put(q.queue, q.latest);
      }
      pos.put(t, qs);
    });
    return new RtOffset(pos);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return ReadLimit.allAvailable();
  }

  /** ``latestOffset()``, never behind ``start`` in any queue: the node answering may hold a
   * replica that lags or is not open yet (it reports 0), and a batch must not end before
   * it starts. */
  @Override
  public Offset latestOffset(Offset start, ReadLimit limit) {
    Map<String, Map<Integer, Long>> from = ((RtOffset) start).positions;
    Map<String, Map<Integer, Long>> pos = new TreeMap<>();
    ((RtOffset) latestOffset()).positions.forEach((t, qs) -> {
      Map<Integer, Long> out = new TreeMap<>();
      qs.forEach((q, latest) -> {
        long s = from.getOrDefault(t, Map.of()).getOrDefault(q, latest);
        out.put(q, s > latest && wentBack(t, q, s) ? latest : Math.max(latest, s));
      });
      pos.put(t, out);
    });
    from.forEach((t, qs) -> qs.forEach((q, o) -> pos.computeIfAbsent(t, k -> new TreeMap<>()).putIfAbsent(q, o)));
    return new RtOffset(pos);
  }

  /** Whether ``queue`` of ``topic`` really ends before ``offset`` (its leader says so, not a
   * lagging replica): the topic was deleted and created again behind the query's back.
   * The query fails naming the offsets (failOnDataLoss) or reads the queue again from its
   * earliest offset (planInputPartitions), as the Python source does. */
  private boolean wentBack(String topic, int queue, long offset) {
    long[] bounds;
    try {
      api.fetch(api.leader(topic, queue), topic, queue, offset, 1, 0, System.currentTimeMillis() + 10_000);
      return false;
    } catch (NodeApi.NodeError e) {
      if (!"OUT_OF_RANGE".equals(e.code)) {
        LOG.warn("topic {} queue {}: its leader did not say whether offset {} is still there ({}); "
            + "the batch waits for it", topic, queue, offset, e.getMessage());
        return false;
      }
      bounds = bounds(e.getMessage());
    } catch (IOException e) {
      LOG.warn("topic {} queue {}: no node answered whether offset {} is still there ({}); the batch waits "
          + "for it", topic, queue, offset, e.getMessage());
      return false;
    }
    if (bounds == null || bounds[1] >= offset) {
      return false;          // not past the leader's end: retention's cut, found by the read
    }
    String why = wentBackError(topic, queue, offset, bounds[1], bounds[0]);
    if (opts.failOnDataLoss) {
      throw new IllegalStateException(why);
    }
    skipping(LOG, why);
    return true;
  }

  /** (earliest, latest) from a leader's OUT_OF_RANGE message ("... earliest=E latest=L"). */
  static long[] bounds(String message) {
    java.util.regex.Matcher m = java.util.regex.Pattern.compile("earliest=(\\d+) latest=(\\d+)").matcher(message);
    return m.find() ? new long[] {Long.parseLong(m.group(1)), Long.parseLong(m.group(2))} : null;
  }

  /** The Python source's data-loss error (rmq_spark/datasource/errors.py), word for word:
   * offsets [start, end) (end -1: from start on) of a queue are gone, and why. */
  static String lost(String topic, int queue, long start, long end, String reason) {
    return "data loss: topic '" + topic + "' queue " + queue + ": offsets "
        + (end < 0 ? "from " + start + " on" : "[" + start + ", " + end + ")") + " " + reason
        + ". The query needs them and failOnDataLoss is true; set .option('failOnDataLoss', 'false') to skip "
        + "missing offsets with a warning instead";
  }

  /** ``lost`` for a queue that went back to ``latest`` (the topic deleted and made again). */
  static String wentBackError(String topic, int queue, long from, long latest, long earliest) {
    return lost(topic, queue, from, -1, "are gone: the queue went back to " + latest
        + " (was the topic deleted and created again?); reading it again from its earliest offset " + earliest);
  }

  /** With failOnDataLoss=false: ``lost``'s loss as the Python source's warning. */
  static void skipping(Logger log, String why) {
    log.warn(why.substring(0, why.indexOf(". The query")) + "; skipping them because failOnDataLoss is false");
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    Map<String, Map<Integer, Long>> s = ((RtOffset) start).positions;
    List<InputPartition> parts = new ArrayList<>();
    // A partition for every queue, an empty range included: a batch replayed after a crash
    // (its end logged, not committed) is planned here, and its partitions must be numbered
    // as the real-time plan numbered them (the sink's producer ids are per partition).
    ((RtOffset) end).positions.forEach((t, qs) -> qs.forEach((q, to) -> {
      long from = s.getOrDefault(t, Map.of()).getOrDefault(q, to);
      if (from > to) {     // the queue went back (latestOffset found it; a replayed batch, not always)
        long earliest = Math.min(earliest(t, q), to);
        if (opts.failOnDataLoss) {
          throw new IllegalStateException(wentBackError(t, q, from, to, earliest));
        }
        from = earliest;
      }
      parts.add(new RtPartition(opts, t, q, from, to));
    }));
    return parts.toArray(new InputPartition[0]);
  }

  private long earliest(String topic, int queue) {
    for (NodeApi.Queue q : describe().getOrDefault(topic, List.of())) {
      if (q.queue == queue) {
        return q.earliest;
      }
    }
    return 0;
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start) {
    List<InputPartition> parts = new ArrayList<>();
    ((RtOffset) start).positions.forEach((t, qs) -> qs.forEach((q, from) ->
        parts.add(new RtPartition(opts, t, q, from, Long.MAX_VALUE))));
    return parts.toArray(new InputPartition[0]);
  }

  @Override
  public Offset mergeOffsets(PartitionOffset[] offsets) {
    Map<String, Map<Integer, Long>> pos = new TreeMap<>();
    for (PartitionOffset o : offsets) {
      RtPartition.Position p = (RtPartition.Position) o;
      pos.computeIfAbsent(p.topic, k -> new TreeMap<>()).put(p.queue, p.next);
    }
    return new RtOffset(pos);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return partition -> new RtReader((RtPartition) partition);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return RtOffset.fromJson(json);
  }

  @Override
  public void commit(Offset end) {
  }

  @Override
  public void stop() {
  }
}
