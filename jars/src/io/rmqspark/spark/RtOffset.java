package io.rmqspark.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.sql.connector.read.streaming.Offset;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.TreeMap;

/**
 * A stream position: the next offset to read of every queue, written to the checkpoint
 * as the Python source writes it ({"topic":{"queue":offset}}, sorted, no spaces), so a
 * query can switch between format("rocketmq") and format("rocketmq-rt") and resume.
 */
final class RtOffset extends Offset {
  private static final ObjectMapper JSON = new ObjectMapper();

  final Map<String, Map<Integer, Long>> positions;

  RtOffset(Map<String, Map<Integer, Long>> positions) {
    Map<String, Map<Integer, Long>> copy = new TreeMap<>();
    positions.forEach((t, qs) -> copy.put(t, new TreeMap<>(qs)));
    this.positions = copy;
  }

  @Override
  public String json() {
    StringBuilder b = new StringBuilder("{");
    boolean firstTopic = true;
    for (Map.Entry<String, Map<Integer, Long>> t : positions.entrySet()) {
      if (!firstTopic) {
        b.append(',');
      }
      firstTopic = false;
      b.append(quote(t.getKey())).append(":{");
      boolean firstQueue = true;
      for (Map.Entry<Integer, Long> q : t.getValue().entrySet()) {
        if (!firstQueue) {
          b.append(',');
        }
        firstQueue = false;
        b.append('"').append(q.getKey()).append("\":").append(q.getValue());
      }
      b.append('}');
    }
    return b.append('}').toString();
  }

  static RtOffset fromJson(String json) {
    try {
      JsonNode root = JSON.readTree(json);
      Map<String, Map<Integer, Long>> out = new TreeMap<>();
      root.fields().forEachRemaining(t -> {
        Map<Integer, Long> qs = new TreeMap<>();
        t.getValue().fields().forEachRemaining(q -> qs.put(Integer.parseInt(q.getKey()), q.getValue().asLong()));
        out.put(t.getKey(), qs);
      });
      return new RtOffset(out);
    } catch (IOException e) {
      throw new UncheckedIOException("a checkpointed offset that is not JSON: " + json, e);
    }
  }

  private static String quote(String s) {
    try {
      return JSON.writeValueAsString(s);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
