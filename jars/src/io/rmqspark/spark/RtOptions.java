package io.rmqspark.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * The options of ``format("rocketmq-rt")``: the Python source's names for what it reads
 * (rmq_spark/datasource/_options.py). Any other option is refused naming the ones taken.
 */
final class RtOptions implements Serializable {
  static final List<String> KNOWN = Arrays.asList(
      "endpoints", "topic", "topics", "subscribe", "startingOffsets", "token", "tokenFile", "tlsCaFile",
      "failOnDataLoss", "maxMessagesPerFetch");

  final List<String> endpoints;
  final List<String> topics;
  /** "earliest", "latest", or null with {@link #startingJson} set. */
  final String starting;
  final Map<String, Map<Integer, Long>> startingJson;
  final String token;
  final String tlsCaFile;
  final int maxMessagesPerFetch;
  final boolean failOnDataLoss;

  private RtOptions(List<String> endpoints, List<String> topics, String starting,
                    Map<String, Map<Integer, Long>> startingJson, String token, String tlsCaFile,
                    int maxMessagesPerFetch, boolean failOnDataLoss) {
    this.endpoints = endpoints;
    this.topics = topics;
    this.starting = starting;
    this.startingJson = startingJson;
    this.token = token;
    this.tlsCaFile = tlsCaFile;
    this.maxMessagesPerFetch = maxMessagesPerFetch;
    this.failOnDataLoss = failOnDataLoss;
  }

  static RtOptions parse(Map<String, String> raw) {
    Map<String, String> opts = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
    opts.putAll(raw);
    TreeSet<String> known = new TreeSet<>(String.CASE_INSENSITIVE_ORDER);
    known.addAll(KNOWN);
    for (String k : opts.keySet()) {
      if (!known.contains(k) && !k.equalsIgnoreCase("path")) {
        throw new IllegalArgumentException("option " + k + " is not taken by format(\"rocketmq-rt\"); it takes "
            + String.join(", ", KNOWN) + " (the other read options are the micro-batch source's, "
            + "format(\"rocketmq\"))");
      }
    }
    String eps = opts.get("endpoints");
    if (eps == null || eps.trim().isEmpty()) {
      throw new IllegalArgumentException("option endpoints: required: the storage nodes as host:port[,host:port...]");
    }
    List<String> endpoints = new ArrayList<>();
    for (String e : eps.split(",")) {
      if (!e.trim().isEmpty()) {
        NodeApi.httpAddress(e.trim());          // host:port, or a clear error
        endpoints.add(e.trim());
      }
    }
    String given = null;
    String name = null;
    for (String n : new String[] {"topic", "topics", "subscribe"}) {
      if (opts.containsKey(n)) {
        if (given != null) {
          throw new IllegalArgumentException("options " + name + " and " + n + ": give one of topic, topics, subscribe");
        }
        given = opts.get(n);
        name = n;
      }
    }
    if (given == null || given.trim().isEmpty()) {
      throw new IllegalArgumentException("option topic: required: the topic to read (or topics/subscribe: a comma-separated list)");
    }
    List<String> topics = new ArrayList<>();
    for (String t : given.split(",")) {
      if (!t.trim().isEmpty()) {
        topics.add(t.trim());
      }
    }
    String starting = opts.getOrDefault("startingOffsets", "latest").trim();
    Map<String, Map<Integer, Long>> json = null;
    String lower = starting.toLowerCase(Locale.ROOT);
    if (lower.equals("earliest") || lower.equals("latest")) {
      starting = lower;
    } else {
      json = parseOffsets(starting);
      starting = null;
    }
    int max = 1000;
    if (opts.containsKey("maxMessagesPerFetch")) {
      try {
        max = Integer.parseInt(opts.get("maxMessagesPerFetch").trim());
      } catch (NumberFormatException e) {
        max = 0;
      }
      if (max < 1 || max > 10_000) {
        throw new IllegalArgumentException("option maxMessagesPerFetch: " + opts.get("maxMessagesPerFetch")
            + ": give 1 to 10000");
      }
    }
    String token = opts.get("token");
    if (opts.containsKey("tokenFile")) {
      if (token != null) {
        throw new IllegalArgumentException("options token and tokenFile: give one");
      }
      try {        // read here, on the driver: the executors get the token (as the Python source)
        token = new String(java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(opts.get("tokenFile"))),
            java.nio.charset.StandardCharsets.UTF_8).trim();
      } catch (IOException e) {
        throw new IllegalArgumentException("option tokenFile: " + opts.get("tokenFile") + " cannot be read ("
            + e + ")");
      }
    }
    String ca = opts.get("tlsCaFile");
    if (ca != null && !new java.io.File(ca).canRead()) {
      throw new IllegalArgumentException("option tlsCaFile: " + ca + " cannot be read");
    }
    String fail = opts.getOrDefault("failOnDataLoss", "true").trim().toLowerCase(Locale.ROOT);
    if (!fail.equals("true") && !fail.equals("false")) {
      throw new IllegalArgumentException("option failOnDataLoss: " + opts.get("failOnDataLoss") + ": give true or false");
    }
    return new RtOptions(endpoints, topics, starting, json, token, ca, max, fail.equals("true"));
  }

  /** {"topic": {"queue": offset}}, -2 earliest and -1 latest, as the Python source takes it. */
  static Map<String, Map<Integer, Long>> parseOffsets(String text) {
    JsonNode root;
    try {
      root = new ObjectMapper().readTree(text);
    } catch (IOException e) {
      throw new IllegalArgumentException("option startingOffsets: " + text
          + ": not earliest, latest or JSON {\"topic\": {\"queue\": offset}} (" + e.getMessage().split("\n")[0] + ")");
    }
    if (root == null || !root.isObject() || root.size() == 0) {
      throw new IllegalArgumentException("option startingOffsets: expected earliest, latest or a non-empty JSON "
          + "object {\"topic\": {\"queue\": offset}}");
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    root.fields().forEachRemaining(t -> {
      if (!t.getValue().isObject()) {
        throw new IllegalArgumentException("option startingOffsets: topic " + t.getKey()
            + ": expected an object {\"queue\": offset}");
      }
      Map<Integer, Long> qs = new TreeMap<>();
      t.getValue().fields().forEachRemaining(q -> {
        long v = q.getValue().asLong(Long.MIN_VALUE);
        if (!q.getKey().matches("\\d+") || !q.getValue().isIntegralNumber() || v < -2) {
          throw new IllegalArgumentException("option startingOffsets: topic " + t.getKey() + " queue "
              + q.getKey() + ": give a queue number and an offset >= 0, -2 (earliest) or -1 (latest)");
        }
        qs.put(Integer.parseInt(q.getKey()), v);
      });
      out.put(t.getKey(), qs);
    });
    return out;
  }
}
