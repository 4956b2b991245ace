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

  /** The options, checked in the Python source's order (``ReadOptions.from_options``) so
   * that a set with several mistakes is refused for the same one, in the same words. */
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
    // the subscription
    if (opts.containsKey("subscribe") && opts.containsKey("topics")) {
      throw new IllegalArgumentException("option 'subscribe': is Kafka's name for topics, with the same meaning; "
          + "give topics or subscribe, not both");
    }
    List<String> names = new ArrayList<>();
    for (String n : new String[] {"topic", "topics", "subscribe"}) {
      if (opts.containsKey(n)) {
        names.add(n);
      }
    }
    if (names.size() != 1) {
      throw new IllegalArgumentException("option '" + (names.isEmpty() ? "topic" : names.get(0))
          + "': give exactly one of topic, topics or subscribe (comma list) "
          + (names.isEmpty() ? "(none given)" : "(got " + String.join(", ", names) + ")"));
    }
    String name = names.get(0);
    String given = opts.get(name);
    List<String> topics = new ArrayList<>();
    for (String t : given.split(",", -1)) {
      if (!t.trim().isEmpty()) {
        topics.add(t.trim());
      }
    }
    if (topics.isEmpty() || (name.equals("topic") && topics.size() != 1)) {
      throw new IllegalArgumentException("option '" + name + "': " + py(given) + ": give "
          + (name.equals("topic") ? "one topic name" : "a comma-separated list of topic names"));
    }
    // the scalar options
    String fail = opts.getOrDefault("failOnDataLoss", "true").trim().toLowerCase(Locale.ROOT);
    if (!fail.equals("true") && !fail.equals("false")) {
      throw new IllegalArgumentException("option 'failOnDataLoss': " + py(opts.get("failOnDataLoss"))
          + " is not a boolean; use true or false");
    }
    int max = 1000;
    if (opts.containsKey("maxMessagesPerFetch")) {
      try {
        max = Integer.parseInt(opts.get("maxMessagesPerFetch").trim());
      } catch (NumberFormatException e) {
        max = 0;
      }
      if (max < 1 || max > 10_000) {
        throw new IllegalArgumentException("option 'maxMessagesPerFetch': " + py(opts.get("maxMessagesPerFetch"))
            + " is not an integer from 1 to 10000");
      }
    }
    List<String> endpoints = endpoints(opts);
    // where to start
    String text = opts.getOrDefault("startingOffsets", "latest");
    String starting = text.trim().toLowerCase(Locale.ROOT);
    Map<String, Map<Integer, Long>> json = null;
    if (!starting.equals("earliest") && !starting.equals("latest")) {
      if (!text.trim().startsWith("{")) {
        throw new IllegalArgumentException("option 'startingOffsets': " + py(text) + " is not earliest or latest "
            + "or JSON {\"topic\": {\"queue\": offset}}");
      }
      json = parseOffsets(text);
      starting = null;
    }
    String[] tls = tls(opts);
    String token = token(opts);
    for (String t : json == null ? List.<String>of() : json.keySet()) {
      if (!topics.contains(t)) {
        throw new IllegalArgumentException("option 'startingOffsets': topic " + py(t) + " is not subscribed ("
            + name + "=" + String.join(",", topics) + ")");
      }
    }
    return new RtOptions(endpoints, topics, starting, json, token, tls, max, fail.equals("true"));
  }

  /** As the client's ``parse_endpoints``: host:port[,host:port...], ports 1-65535. */
  private static List<String> endpoints(Map<String, String> opts) {
    if (!opts.containsKey("endpoints")) {
      throw new IllegalArgumentException("option 'endpoints': required: the storage nodes as host:port[,host:port...]");
    }
    List<String> out = new ArrayList<>();
    for (String e : opts.get("endpoints").split(",", -1)) {
      if (!e.trim().isEmpty()) {
        out.add(e.trim());
      }
    }
    if (out.isEmpty()) {
      throw new IllegalArgumentException("option 'endpoints': endpoints is empty: give host:port[,host:port...] "
          + "(or set RMQ_ENDPOINTS)");
    }
    for (String e : out) {
      int colon = e.lastIndexOf(':');
      String port = colon < 0 ? "" : e.substring(colon + 1);
      if (colon <= 0 || port.isEmpty() || !port.chars().allMatch(Character::isDigit)) {
        throw new IllegalArgumentException("option 'endpoints': endpoint " + py(e) + " is not host:port");
      }
      if (port.length() > 5 || Integer.parseInt(port) < 1 || Integer.parseInt(port) > 65535) {
        throw new IllegalArgumentException("option 'endpoints': endpoint " + py(e) + ": port " + port
            + " is out of range (1-65535)");
      }
    }
    return out;
  }

  /** The bearer token: ``token``, or read here, on the driver, from ``tokenFile`` (the
   * executors get the token itself), as the Python source's ``_token``. */
  private static String token(Map<String, String> opts) {
    String token = opts.get("token");
    String file = opts.get("tokenFile");
    if (token != null && !token.isEmpty() && file != null && !file.isEmpty()) {
      throw new IllegalArgumentException("option 'tokenFile': give token or tokenFile, not both");
    }
    if (file != null && !file.isEmpty()) {
      String path = new java.io.File(file).getAbsolutePath();
      unreadable("tokenFile", path, "");
      try {
        token = new String(java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(path)),
            java.nio.charset.StandardCharsets.UTF_8).trim();
      } catch (IOException e) {
        throw new IllegalArgumentException("option 'tokenFile': " + path + ": " + e.getMessage());
      }
      if (token.isEmpty()) {
        throw new IllegalArgumentException("option 'tokenFile': " + path + " is empty");
      }
      return token;
    }
    if (token != null && token.trim().isEmpty()) {
      throw new IllegalArgumentException("option 'token': must not be empty");
    }
    return token;
  }

  /** A string as Python's ``repr`` shows it in the Python source's messages. */
  static String py(String s) {
    return s.contains("'") && !s.contains("\"") ? "\"" + s + "\"" : "'" + s.replace("'", "\\'") + "'";
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
    JsonNode root;
    try {
      root = new ObjectMapper().enable(com.fasterxml.jackson.databind.DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
          .readTree(text);
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
        throw new IllegalArgumentException(option + "topic " + py(t.getKey())
            + ": expected a non-empty object {\"queue\": value}");
      }
      Map<Integer, Long> qs = new TreeMap<>();
      t.getValue().fields().forEachRemaining(q -> {
        if (!q.getKey().matches("\\d+")) {
          throw new IllegalArgumentException(option + "topic " + py(t.getKey()) + ": queue " + py(q.getKey())
              + " is not a non-negative integer");
        }
        JsonNode v = q.getValue();
        if (!v.isIntegralNumber() || v.asLong() < -2) {
          String shown = v.isTextual() ? py(v.asText()) : v.isBoolean() ? (v.asBoolean() ? "True" : "False")
              : v.isNull() ? "None" : v.toString();
          throw new IllegalArgumentException(option + "topic " + py(t.getKey()) + " queue " + q.getKey() + ": "
              + shown + " is not an offset >= 0, -2 (earliest) or -1 (latest)");
        }
        if (q.getKey().length() < 10 || Long.parseLong(q.getKey()) <= Integer.MAX_VALUE) {
          qs.put(Integer.parseInt(q.getKey()), v.asLong());     // a larger number names no queue
        }
      });
      out.put(t.getKey(), qs);
    });
    return out;
  }
}
