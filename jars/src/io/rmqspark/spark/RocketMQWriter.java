package io.rmqspark.spark;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32;

/**
 * Writes a streaming query's rows to a topic, exactly once, from a JVM ``ForeachWriter``:
 * the sink a real-time query can use (Spark's real-time mode refuses the
 * ``format("rocketmq")`` sink; ``rmq_spark.realtime.to_rocketmq`` attaches this one).
 *
 * Each task writes as producer ``{key}-{partition}``, where the key is the
 * ``idempotenceKey`` given or the query's id (kept in the checkpoint), and numbers its
 * rows per queue: sequence ``(epoch << 32) + position``, as the Python sink numbers its
 * calls. A batch replayed after a crash reads the same rows in the same order from the
 * same start, so every row it had written comes back with its sequence and is dropped
 * as a duplicate by the node. A row goes to its ``queue`` column, else to
 * ``crc32(key) % queues``, else round robin (the Python sink's rule). Columns: ``value``
 * (binary or string, required), optional ``key``, ``tags``, ``properties``, ``queue``.
 * Each row is one produce, acknowledged (a majority has it) before the next.
 */
public final class RocketMQWriter extends ForeachWriter<Row> {
  private static final long CALL_MS = 60_000;
  private static final ObjectMapper JSON = new ObjectMapper();

  private final String endpoints;
  private final String topic;
  private final String token;
  private final String idempotenceKey;
  private final String[] tls;        // CA, client certificate, its key (RtOptions.tls)
  private transient NodeApi api;
  private transient int queues;
  private transient String producer;
  private transient long epoch;
  private transient long partition;
  private transient long rows;
  private transient Map<Integer, Long> positions;

  public RocketMQWriter(String endpoints, String topic, String token, String idempotenceKey, String tlsCaFile) {
    this(endpoints, topic, token, idempotenceKey, tlsCaFile, null, null);
  }

  /** ``tlsCertFile`` and ``tlsKeyFile``: a client certificate (the principal is its CN), where
   * the nodes take one instead of a token. */
  public RocketMQWriter(String endpoints, String topic, String token, String idempotenceKey, String tlsCaFile,
                        String tlsCertFile, String tlsKeyFile) {
    if (topic == null || topic.isEmpty()) {
      throw new IllegalArgumentException("topic: required: the topic to write to");
    }
    Map<String, String> opts = new HashMap<>();
    opts.put("endpoints", endpoints == null ? "" : endpoints);
    opts.put("topic", topic);
    String[] names = {"tlsCaFile", "tlsCertFile", "tlsKeyFile"};
    String[] given = {tlsCaFile, tlsCertFile, tlsKeyFile};
    for (int i = 0; i < 3; i++) {
      if (given[i] != null) {
        opts.put(names[i], given[i]);
      }
    }
    RtOptions checked = RtOptions.parse(opts);     // checked here, on the driver, in the source's words
    this.endpoints = endpoints;
    this.topic = topic;
    this.token = token;
    this.idempotenceKey = idempotenceKey;
    this.tls = new String[] {checked.tlsCaFile, checked.tlsCertFile, checked.tlsKeyFile};
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    List<String> eps = Arrays.asList(endpoints.split("\\s*,\\s*"));
    api = NodeApi.shared(eps, token, tls);
    try {
      queues = api.describe(topic, System.currentTimeMillis() + CALL_MS).size();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    if (queues == 0) {
      throw new IllegalStateException("topic " + topic + " has no queues");
    }
    String key = idempotenceKey;
    if (key == null || key.isEmpty()) {
      TaskContext ctx = TaskContext.get();
      key = ctx == null ? null : ctx.getLocalProperty("sql.streaming.queryId");
    }
    if (key == null) {
      throw new IllegalStateException("no idempotenceKey given and no streaming query id: give idempotenceKey");
    }
    producer = key + "-" + partitionId;
    epoch = epochId;
    partition = partitionId;
    rows = 0;
    positions = new HashMap<>();
    return true;
  }

  @Override
  public void process(Row row) {
    byte[] value = bytes(row, "value");
    byte[] key = has(row, "key") ? bytes(row, "key") : null;
    int queue;
    if (has(row, "queue") && !row.isNullAt(row.fieldIndex("queue"))) {
      queue = ((Number) row.get(row.fieldIndex("queue"))).intValue();
      if (queue < 0 || queue >= queues) {
        throw new IllegalArgumentException("row " + rows + " of partition " + partition + ": queue " + queue
            + " does not exist (topic " + topic + " has " + queues + " queues, 0.." + (queues - 1) + ")");
      }
    } else if (key != null) {
      CRC32 crc = new CRC32();
      crc.update(key);
      queue = (int) (crc.getValue() % queues);
    } else {
      queue = (int) ((rows + partition) % queues);
    }
    long position = positions.merge(queue, 1L, Long::sum) - 1;
    ObjectNode msg = JSON.createObjectNode();
    msg.set("value", value == null ? JSON.nullNode() : b64(value));
    if (key != null) {
      msg.set("key", b64(key));
    }
    if (has(row, "tags") && !row.isNullAt(row.fieldIndex("tags"))) {
      msg.put("tags", row.getString(row.fieldIndex("tags")));
    }
    if (has(row, "properties") && !row.isNullAt(row.fieldIndex("properties"))) {
      ObjectNode props = msg.putObject("properties");
      scala.collection.Map<Object, Object> m = row.getMap(row.fieldIndex("properties"));
      m.foreach(kv -> props.put(String.valueOf(kv._1()), String.valueOf(kv._2())));
    }
    ObjectNode body = JSON.createObjectNode();
    ArrayNode msgs = body.putArray("messages");
    msgs.add(msg);
    body.put("queue", queue);
    body.put("producer_id", producer);
    body.put("sequence", (epoch << 32) + position);
    try {
      api.post("/v1/topics/" + URLEncoder.encode(topic, StandardCharsets.UTF_8).replace("+", "%20") + "/messages",
          JSON.writeValueAsBytes(body), System.currentTimeMillis() + CALL_MS);
    } catch (IOException e) {
      throw new UncheckedIOException("writing row " + rows + " of partition " + partition + " to " + topic, e);
    }
    rows++;
  }

  @Override
  public void close(Throwable error) {
  }

  private static boolean has(Row row, String field) {
    return Arrays.asList(row.schema().fieldNames()).contains(field);
  }

  private static byte[] bytes(Row row, String field) {
    int i = row.fieldIndex(field);
    if (row.isNullAt(i)) {
      return null;
    }
    Object v = row.get(i);
    return v instanceof byte[] ? (byte[]) v : String.valueOf(v).getBytes(StandardCharsets.UTF_8);
  }

  private static ObjectNode b64(byte[] b) {
    return JSON.createObjectNode().put("base64", Base64.getEncoder().encodeToString(b));
  }
}
