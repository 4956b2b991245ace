package io.rmqspark.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * The storage nodes' HTTP API (storage_service/http/api.py), as the JVM source uses it:
 * a topic's queues with their leaders and offsets, and a queue's messages from an offset,
 * long-polling (wait_ms) so a read wakes when a message is appended. A node that does not
 * lead the queue answers 307 to the leader, which the client follows; a node that does
 * not answer is skipped for the next one.
 */
final class NodeApi {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The time a call may take beyond its long poll before it counts as lost. */
  private static final long SLACK_MS = 10_000;

  /** One client per cluster and token in a JVM: a real-time query's tasks start every batch. */
  private static final Map<String, NodeApi> SHARED = new ConcurrentHashMap<>();

  private final List<String> nodes;        // host:port of each node's HTTP port
  private final String token;
  private final String scheme;             // https on a cluster with TLS (its CA given)
  private final HttpClient http;
  private final boolean clientCert;        // a client certificate is shown (tlsCertFile)
  /** topic + "/" + queue -> the gRPC address of the node that last served it. */
  private final Map<String, String> leaders = new ConcurrentHashMap<>();

  /** ``tls``: the CA file, and a client certificate and its key (or nulls), PEM. */
  static NodeApi shared(List<String> grpcEndpoints, String token, String... tls) {
    return SHARED.computeIfAbsent(String.join(",", grpcEndpoints) + "|" + (token == null ? "" : token) + "|"
        + Arrays.toString(tls), k -> new NodeApi(grpcEndpoints, token, tls));
  }

  /** The node that last served ``queue`` of ``topic`` ("" if none is known yet). */
  String leader(String topic, int queue) {
    return leaders.getOrDefault(topic + "/" + queue, "");
  }

  void served(String topic, int queue, String node) {
    if (node != null && !node.isEmpty()) {
      leaders.put(topic + "/" + queue, node);
    }
  }

  private NodeApi(List<String> grpcEndpoints, String token, String[] tls) {
    String caFile = tls.length > 0 ? tls[0] : null;
    this.clientCert = tls.length > 2 && tls[1] != null;
    this.nodes = new ArrayList<>();
    for (String e : grpcEndpoints) {
      this.nodes.add(httpAddress(e));
    }
    this.token = token;
    HttpClient.Builder b = HttpClient.newBuilder()
        .followRedirects(HttpClient.Redirect.NORMAL)
        .connectTimeout(Duration.ofSeconds(3));
    if (caFile != null && !caFile.isEmpty()) {
      b.sslContext(tls(caFile, tls.length > 2 ? tls[1] : null, tls.length > 2 ? tls[2] : null));
      this.scheme = "https";
    } else {
      this.scheme = "http";
    }
    this.http = b.build();
  }

  /** TLS trusting only the certificates of ``caFile`` (PEM), the cluster's CA; with
   * ``certFile`` and ``keyFile`` (PEM, the key PKCS#8 as rmq-storage's certificates have
   * it), showing that client certificate: the principal is its CN, as on gRPC. */
  static SSLContext tls(String caFile, String certFile, String keyFile) {
    try (InputStream in = Files.newInputStream(Paths.get(caFile))) {
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      int i = 0;
      for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
        store.setCertificateEntry("ca-" + i++, c);
      }
      if (i == 0) {
        throw new IllegalArgumentException("option 'tlsCaFile': " + caFile + " holds no PEM certificate");
      }
      TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(store);
      SSLContext ctx = SSLContext.getInstance("TLS");
      ctx.init(certFile == null ? null : keys(certFile, keyFile), tmf.getTrustManagers(), null);
      return ctx;
    } catch (IOException | GeneralSecurityException e) {
      throw new IllegalArgumentException("option 'tlsCaFile': " + caFile + ": " + e.getMessage(), e);
    }
  }

  private static KeyManager[] keys(String certFile, String keyFile) {
    List<Certificate> chain;
    try (InputStream in = Files.newInputStream(Paths.get(certFile))) {
      chain = new ArrayList<>(CertificateFactory.getInstance("X.509").generateCertificates(in));
    } catch (IOException | GeneralSecurityException e) {
      throw new IllegalArgumentException("option 'tlsCertFile': " + certFile + ": " + e.getMessage(), e);
    }
    if (chain.isEmpty()) {
      throw new IllegalArgumentException("option 'tlsCertFile': " + certFile + " holds no PEM certificate");
    }
    PrivateKey key;
    try {
      String pem = new String(Files.readAllBytes(Paths.get(keyFile)), StandardCharsets.US_ASCII);
      int from = pem.indexOf("-----BEGIN PRIVATE KEY-----");
      int to = pem.indexOf("-----END PRIVATE KEY-----");
      if (from < 0 || to < from) {
        throw new IllegalArgumentException("option 'tlsKeyFile': " + keyFile
            + " holds no PKCS#8 PEM key (-----BEGIN PRIVATE KEY-----; convert another with "
            + "openssl pkcs8 -topk8 -nocrypt)");
      }
      byte[] der = Base64.getMimeDecoder().decode(pem.substring(from + 27, to));
      String algorithm = chain.get(0).getPublicKey().getAlgorithm();      // EC or RSA: the certificate's
      key = KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
      java.security.Signature sign = java.security.Signature.getInstance(
          "EC".equals(algorithm) ? "SHA256withECDSA" : "SHA256with" + algorithm);
      byte[] probe = "rmq-spark".getBytes(StandardCharsets.US_ASCII);
      sign.initSign(key);
      sign.update(probe);
      byte[] signed = sign.sign();
      sign.initVerify(chain.get(0).getPublicKey());
      sign.update(probe);
      if (!sign.verify(signed)) {
        throw new IllegalArgumentException("option 'tlsKeyFile': " + keyFile + " is not the key of the certificate in "
            + certFile);
      }
    } catch (IOException | GeneralSecurityException e) {
      throw new IllegalArgumentException("option 'tlsKeyFile': " + keyFile + ": " + e.getMessage(), e);
    }
    try {
      char[] none = new char[0];
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      store.setKeyEntry("client", key, none, chain.toArray(new Certificate[0]));
      KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
      kmf.init(store, none);
      return kmf.getKeyManagers();
    } catch (IOException | GeneralSecurityException e) {
      throw new IllegalArgumentException("option 'tlsKeyFile': " + keyFile + " does not go with " + certFile
          + ": " + e.getMessage(), e);
    }
  }

  /** A node's HTTP port: its gRPC port + 4 (storage_service/protocol/placement.py). */
  static String httpAddress(String grpcAddress) {
    int colon = grpcAddress.lastIndexOf(':');
    if (colon < 0) {
      throw new IllegalArgumentException("endpoint " + grpcAddress + ": give host:port");
    }
    int port = Integer.parseInt(grpcAddress.substring(colon + 1).trim());
    return grpcAddress.substring(0, colon).trim() + ":" + (port + 4);
  }

  static final class Queue {
    final int queue;
    final long earliest;
    final long latest;
    final String leader;        // gRPC address, or "" when none is known

    Queue(int queue, long earliest, long latest, String leader) {
      this.queue = queue;
      this.earliest = earliest;
      this.latest = latest;
      this.leader = leader;
    }
  }

  /** The topic's queues (their number, offsets and leaders). */
  List<Queue> describe(String topic, long deadlineMs) throws IOException {
    JsonNode got = get(null, "/v1/topics/" + enc(topic), 0, deadlineMs);
    List<Queue> out = new ArrayList<>();
    for (JsonNode q : got.path("queues")) {
      out.add(new Queue(q.path("queue").asInt(), q.path("earliest").asLong(), q.path("latest").asLong(),
          q.path("leader").asText("")));
    }
    return out;
  }

  /** A Fetch answered with ``encoding=batches``: the record batches (``Batches``) and where
   * the next fetch starts. */
  static final class Fetched {
    final byte[] batches;
    final long next;
    final String servedBy;

    Fetched(HttpResponse<byte[]> resp) throws IOException {
      String type = resp.headers().firstValue("Content-Type").orElse("");
      if (!type.startsWith("application/x-rmq-batches")) {
        throw new IOException("storage node " + resp.uri().getAuthority() + " answered a fetch with " + type
            + ", not application/x-rmq-batches: it is older than this connector (upgrade the nodes first)");
      }
      this.batches = resp.body();
      this.next = header(resp, "X-Rmq-Next-Offset");
      this.servedBy = resp.headers().firstValue("X-Rmq-Served-By").orElse("");
    }

    private static long header(HttpResponse<byte[]> resp, String name) throws IOException {
      String v = resp.headers().firstValue(name).orElse(null);
      try {
        return Long.parseLong(v);
      } catch (NumberFormatException e) {
        throw new IOException("storage node " + resp.uri().getAuthority() + " answered a fetch without a "
            + "number in " + name + " (" + v + ")");
      }
    }
  }

  /** Batches of ``queue`` from ``offset`` on (up to about ``max`` messages), long-polling up
   * to ``waitMs`` when there are none: the stored framing, decoded here, not JSON made by the
   * node per message (``bench/rt_read.py``: 11-18 us of node CPU a row as JSON). */
  Fetched fetch(String leaderGrpc, String topic, int queue, long offset, int max, long waitMs, long deadlineMs)
      throws IOException {
    String path = "/v1/topics/" + enc(topic) + "/queues/" + queue + "/messages?offset=" + offset
        + "&max=" + max + "&wait_ms=" + waitMs + "&encoding=batches";
    return new Fetched(call(leaderGrpc == null || leaderGrpc.isEmpty() ? null : httpAddress(leaderGrpc), path,
        waitMs, deadlineMs, null));
  }

  /** POST a JSON ``body`` (a produce: idempotent by its producer id and sequence). */
  JsonNode post(String path, byte[] body, long deadlineMs) throws IOException {
    return JSON.readTree(call(null, path, 0, deadlineMs, body).body());
  }

  private JsonNode get(String first, String path, long waitMs, long deadlineMs) throws IOException {
    return JSON.readTree(call(first, path, waitMs, deadlineMs, null).body());
  }

  /**
   * GET ``path`` (or POST ``body``), first at ``first`` (if given), then at each node in
   * turn, until one answers or ``deadlineMs`` passes. An error the node answered with a
   * reason (a topic that does not exist, a bad offset) is raised at once; not-leader
   * answers (307 to the leader) are followed.
   */
  private HttpResponse<byte[]> call(String first, String path, long waitMs, long deadlineMs, byte[] body)
      throws IOException {
    List<String> order = new ArrayList<>();
    if (first != null) {
      order.add(first);
    }
    order.addAll(nodes);
    IOException last = null;
    long pause = 50;
    while (true) {
      int closedOnHello = 0;     // plain HTTP connections a node closed before any answer
      for (String node : order) {
        long left = deadlineMs - System.currentTimeMillis();
        if (left <= 0) {
          throw last != null ? last : new IOException("no storage node answered " + path);
        }
        HttpRequest.Builder req = HttpRequest.newBuilder(URI.create(scheme + "://" + node + path))
            .timeout(Duration.ofMillis(Math.min(left, waitMs + SLACK_MS)));
        if (body == null) {
          req.GET();
        } else {
          req.header("Content-Type", "application/json").POST(HttpRequest.BodyPublishers.ofByteArray(body));
        }
        if (token != null && !token.isEmpty()) {
          req.header("Authorization", "Bearer " + token);
        }
        HttpResponse<byte[]> resp;
        try {
          resp = http.send(req.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted while asking " + node + path, e);
        } catch (javax.net.ssl.SSLHandshakeException e) {
          // not a node gone away: its certificate (or the plaintext/TLS choice) is wrong
          throw new IOException("TLS: the certificate of node " + node + " was not accepted (" + e.getMessage()
              + "): give tlsCaFile, the cluster's CA (on a cluster without TLS, leave it out)"
              + (clientCert ? "; the node may also have refused the client certificate (tlsCertFile)" : ""), e);
        } catch (IOException e) {
          if ("http".equals(scheme) && String.valueOf(e.getMessage()).contains("header parser received no bytes")) {
            closedOnHello++;     // what a TLS port does with plain HTTP
          }
          last = new IOException("storage node " + node + " did not answer " + path + ": " + e
              + ("http".equals(scheme) ? " (a cluster with TLS takes HTTPS only: give tlsCaFile, its CA)" : ""), e);
          continue;
        }
        if (resp.statusCode() == 200) {
          return resp;
        }
        String why = new String(resp.body(), StandardCharsets.UTF_8);
        String code = "";
        try {
          JsonNode err = JSON.readTree(resp.body()).path("error");
          if (!err.isMissingNode()) {
            code = err.path("code").asText();
            why = code + ": " + err.path("message").asText();
          }
        } catch (IOException ignored) {
          // not JSON: the body as it came
        }
        NodeError failed = new NodeError(code, "storage node " + node + " answered " + path + " with "
            + resp.statusCode() + " " + why);
        if (resp.statusCode() == 503 || resp.statusCode() == 502 || resp.statusCode() == 504
            || resp.statusCode() == 429) {
          last = failed;         // no leader now, or at a limit: another node, then again
          continue;
        }
        throw failed;
      }
      if (closedOnHello == order.size()) {
        throw last;              // every node closed plain HTTP unanswered: a cluster with TLS, no CA given
      }
      order = nodes;             // the hint did not answer: every node from now on
      try {
        Thread.sleep(Math.min(pause, Math.max(1, deadlineMs - System.currentTimeMillis())));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted", e);
      }
      pause = Math.min(1000, pause * 2);
    }
  }

  /** An answer of a node that settles the call: its gRPC code (OUT_OF_RANGE, NOT_FOUND, ...). */
  static final class NodeError extends IOException {
    final String code;

    NodeError(String code, String message) {
      super(message);
      this.code = code;
    }
  }

  private static String enc(String s) {
    return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
  }
}
