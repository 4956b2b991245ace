package io.rmqspark.spark;

import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Instant;
import java.util.UUID;

/**
 * A JVM sink for latency benchmarks (bench/latency.py): for each row, its ``value`` (as
 * text) and the wall-clock time it reached the sink, in microseconds, one line per row
 * in a file per task under ``folder``. Real-time mode hands rows to a JVM
 * ``ForeachWriter`` as they are read (a Python foreach gets them in chunks, at the end
 * of the batch), so this measures what the source delivers.
 */
public final class LatencyProbe extends ForeachWriter<Row> {
  private final String folder;
  private transient BufferedWriter out;

  public LatencyProbe(String folder) {
    this.folder = folder;
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    try {
      out = Files.newBufferedWriter(Paths.get(folder, "p" + partitionId + "-e" + epochId + "-" + UUID.randomUUID()
          + ".txt"), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return true;
  }

  @Override
  public void process(Row row) {
    Instant now = Instant.now();
    long micros = now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
    byte[] value = row.getAs("value");
    try {
      out.write(new String(value, StandardCharsets.UTF_8));
      out.write(' ');
      out.write(Long.toString(micros));
      out.write('\n');
      out.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public void close(Throwable error) {
    try {
      if (out != null) {
        out.close();
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
