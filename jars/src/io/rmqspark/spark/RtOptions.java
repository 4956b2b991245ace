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
      "tlsCertFile", "tlsKeyFile", "failOnDataLoss", "maxMessagesPerFetch");

  final List<String> endpoints;
  final List<String> topics;
  /** "earliest", "latest", or null with {@link #startingJson} set. */
  final String starting;
  final Map<String, Map<Integer, Long>> startingJson;
  final String token;
  final String tlsCaFile;
  /** A client certificate and its key (PEM), where the nodes take one as the credential. */
  final String tlsCertFile;
  final String tlsKeyFile;
  final int maxMessagesPerFetch;
  final boolean failOnDataLoss;

  private RtOptions(List<String> endpoints, List<String> topics, String starting,
                    Map<String, Map<Integer, Long>> startingJson, String token, String[] tls,
                    int maxMessagesPerFetch, boolean failOnDataLoss) {
    this.endpoints = endpoints;
    this.topics = topics;
    this.starting = starting;
    this.startingJson = startingJson;
    this.token = token;
    this.tlsCaFile = tls[0];
    this.tlsCertFile = tls[1];
    this.tlsKeyFile = tls[2];
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
        throw new IllegalArgumentException("option '" + k + "': not taken by format(\"rocketmq-rt\"); it takes "
            + String.join(", ", KNOWN) + " (the other read options are the micro-batch source's, "
            + "format(\"rocketmq\"))");
      }
    }
    String eps = opts.get("endpoints");
    if (eps == null || eps.trim().isEmpty()) {
      throw new IllegalArgumentException("option 'endpoints': required: the storage nodes as host:port[,host:port...]");
    }
    List<String> endpoints = new ArrayList<>();
    for (String e : eps.split(",")) {
      if (!e.trim().isEmpty()) {
        try {
          NodeApi.httpAddress(e.trim());
        } catch (IllegalArgumentException bad) {
          throw new IllegalArgumentException("option 'endpoints': endpoint '" + e.trim() + "' is not host:port");
        }
        endpoints.add(e.trim());
      }
    }
    List<String> names = new ArrayList<>();
    for (String n : new String[] {"topic", "topics", "subscribe"}) {
      if (opts.containsKey(n)) {
        names.add(n);
      }
    }
    if (names.size() != 1) {
      throw new IllegalArgumentException("option 'topic': give exactly one of topic, topics or subscribe (comma list) "
          + (names.isEmpty() ? "(none given)" : "(got " + String.join(", ", names) + ")"));
    }
    String name = names.get(0);
    String given = opts.get(name);
    List<String> topics = new ArrayList<>();
    for (String t : given.split(",")) {
      if (!t.trim().isEmpty()) {
        topics.add(t.trim());
      }
    }
    if (topics.isEmpty()) {
      throw new IllegalArgumentException("option '" + name + "': '" + given + "': give a comma-separated list of topic names");
    }
    String starting = opts.getOrDefault("startingOffsets", "latest").trim();
    Map<String, Map<Integer, Long>> json = null;
    String lower = starting.toLowerCase(Locale.ROOT);
    if (lower.equals("earliest") || lower.equals("latest")) {
      starting = lower;
    } else {
      json = parseOffsets(starting);
      starting = null;
      for (String t : json.keySet()) {
        if (!topics.contains(t)) {
          throw new IllegalArgumentException("option 'startingOffsets': topic '" + t + "' is not subscribed ("
              + name + "=" + given + ")");
        }
      }
    }
    int max = 1000;
    if (opts.containsKey("maxMessagesPerFetch")) {
      try {
        max = Integer.parseInt(opts.get("maxMessagesPerFetch").trim());
      } catch (NumberFormatException e) {
        max = 0;
      }
      if (max < 1 || max > 10_000) {
        throw new IllegalArgumentException("option 'maxMessagesPerFetch': '" + opts.get("maxMessagesPerFetch")
            + "' is not an integer from 1 to 10000");
      }
    }
    String token = opts.get("token");
    if (opts.containsKey("tokenFile")) {
      if (token != null) {
        throw new IllegalArgumentException("option 'tokenFile': give token or tokenFile, not both");
      }
      String path = opts.get("tokenFile");
      unreadable("tokenFile", path, "");
      try {        // read here, on the driver: the executors get the token (as the Python source)
        token = new String(java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(path)),
            java.nio.charset.StandardCharsets.UTF_8).trim();
      } catch (IOException e) {
        throw new IllegalArgumentException("option 'tokenFile': " + path + ": " + e.getMessage());
      }
    }
    String fail = opts.getOrDefault("failOnDataLoss", "true").trim().toLowerCase(Locale.ROOT);
    if (!fail.equals("true") && !fail.equals("false")) {
      throw new IllegalArgumentException("option 'failOnDataLoss': '" + opts.get("failOnDataLoss")
          + "' is not a boolean; use true or false");
    }
    return new RtOptions(endpoints, topics, starting, json, token, tls(opts), max, fail.equals("true"));
  }

  /** tlsCaFile, and tlsCertFile + tlsKeyFile where the nodes take a client certificate, as
   * the Python source checks them: readable here, on the driver (executors read the same paths). */
  private static String[] tls(Map<String, String> opts) {
    String ca = opts.get("tlsCaFile");
    String cert = opts.get("tlsCertFile");
    String key = opts.get("tlsKeyFile");
    if (ca == null || ca.isEmpty()) {
      if (cert != null || key != null) {
        throw new IllegalArgumentException("option 'tlsCaFile': required with tlsCertFile/tlsKeyFile: the CA the "
            + "nodes' certificates are checked against");
      }
      return new String[] {null, null, null};
    }
    if ((cert == null) != (key == null)) {
      throw new IllegalArgumentException("option '" + (key != null ? "tlsCertFile" : "tlsKeyFile")
          + "': tlsCertFile and tlsKeyFile go together (a certificate and its key)");
    }
    String[] out = {ca, cert, key};
    String[] names = {"tlsCaFile", "tlsCertFile", "tlsKeyFile"};
    for (int i = 0; i < 3; i++) {
      if (out[i] != null) {
        out[i] = new java.io.File(out[i]).getAbsolutePath();
        unreadable(names[i], out[i], "TLS file ");
      }
    }
    return out;
  }

  /** The Python source's words for a file that is not there or cannot be read. */
  private static void unreadable(String option, String path, String what) {
    java.io.File f = new java.io.File(path);
    String why = !f.exists() ? "No such file or directory" : f.isDirectory() ? "Is a directory"
        : !f.canRead() ? "Permission denied" : null;
    if (why != null) {
      throw new IllegalArgumentException("option '" + option + "': " + what + path + ": " + why);
    }
  }

  /** {"topic": {"queue": offset}}, -2 earliest and -1 latest, as the Python source takes it
   * (rmq_spark/datasource/_offsets.py), refused in its words. */
  static Map<String, Map<Integer, Long>> parseOffsets(String text) {
    final String option = "option 'startingOffsets': ";
    if (!text.startsWith("{")) {
      throw new IllegalArgumentException(option + "'" + text + "' is not earliest or latest or JSON "
          + "{\"topic\": {\"queue\": offset}}");
    }
    JsonNode root;
    try {
      root = new ObjectMapper().readTree(text);
    } catch (IOException e) {
      throw new IllegalArgumentException(option + "not valid JSON (" + e.getMessage().split("\n")[0]
          + "); expected {\"topic\": {\"queue\": value}}");
    }
    if (root == null || !root.isObject() || root.size() == 0) {
      throw new IllegalArgumentException(option + "expected a non-empty JSON object {\"topic\": {\"queue\": value}}");
    }
    Map<String, Map<Integer, Long>> out = new TreeMap<>();
    root.fields().forEachRemaining(t -> {
      if (!t.getValue().isObject() || t.getValue().size() == 0) {
        throw new IllegalArgumentException(option + "topic '" + t.getKey()
            + "': expected a non-empty object {\"queue\": value}");
      }
      Map<Integer, Long> qs = new TreeMap<>();
      t.getValue().fields().forEachRemaining(q -> {
        if (!q.getKey().matches("\\d+")) {
          throw new IllegalArgumentException(option + "topic '" + t.getKey() + "': queue '" + q.getKey()
              + "' is not a non-negative integer");
        }
        JsonNode v = q.getValue();
        if (!v.isIntegralNumber() || v.asLong() < -2) {
          throw new IllegalArgumentException(option + "topic '" + t.getKey() + "' queue " + q.getKey() + ": "
              + (v.isTextual() ? "'" + v.asText() + "'" : v.toString())
              + " is not an offset >= 0, -2 (earliest) or -1 (latest)");
        }
        qs.put(Integer.parseInt(q.getKey()), v.asLong());
      });
      out.put(t.getKey(), qs);
    });
    return out;
  }
}
