package io.rmqspark.spark;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

/**
 * ``spark.readStream.format("rocketmq-rt")``: the JVM streaming source, for Spark's
 * real-time mode (``trigger(realTime=...)``), which takes only JVM sources that implement
 * ``SupportsRealTimeMode``; it runs micro-batches too. Same columns, option names and
 * checkpointed offsets as the Python source ``format("rocketmq")``
 * (rmq_spark/datasource), which stays the one for batch reads, archives and every other
 * read option. It reads through the nodes' HTTP API, a long poll per queue
 * (``NodeApi``), so a task wakes when a message is appended.
 */
public final class RocketMQRealTimeProvider implements TableProvider, DataSourceRegister {
  /** The Python source's columns (rmq_spark/client/arrow.py SPARK_DDL). */
  static final StructType SCHEMA = (StructType) DataType.fromDDL(
      "key binary, value binary, topic string, queue int, offset long, timestamp timestamp, "
          + "born_timestamp timestamp, tags string, properties map<string,string>, msg_id string");

  @Override
  public String shortName() {
    return "rocketmq-rt";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    RtOptions.parse(options.asCaseSensitiveMap());      // bad options fail at load()
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new RtTable(RtOptions.parse(properties));
  }

  static final class RtTable implements Table, SupportsRead {
    private final RtOptions opts;

    RtTable(RtOptions opts) {
      this.opts = opts;
    }

    @Override
    public String name() {
      return "rocketmq-rt:" + String.join(",", opts.topics);
    }

    @Override
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return SCHEMA;
        }

        @Override
        public String description() {
          return "rocketmq-rt " + String.join(",", opts.topics);
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          return new RtStream(opts);
        }
      };
    }
  }
}
