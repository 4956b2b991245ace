package io.rmqspark.delta;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import io.delta.storage.S3SingleDriverLogStore;

/**
 * Delta's log store for s3a:// tables with commits that cannot overwrite each other
 * across drivers.
 *
 * Delta 4.4's S3 log store checks that a commit file is absent and then writes it:
 * safe within one JVM (it locks the path), not between two (two tiering or compaction
 * jobs, or a job and a user's DELETE): both write version N, the later one silently
 * replaces the earlier commit. S3 (since 2024) and S3A (Hadoop 3.5) offer a put that
 * fails when the object exists (If-None-Match: *); this store writes commits with it,
 * so the loser gets FileAlreadyExistsException and Delta's optimistic concurrency
 * retries it as a conflict, as on HDFS or a local disk. Reading and listing are
 * Delta's own. Configured by rmq_spark.spark.session_builder for s3a:// and s3://.
 */
public class ConditionalPutLogStore extends S3SingleDriverLogStore {
    private static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

    public ConditionalPutLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite,
                      Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) {
            try (FSDataOutputStream out = fs.create(path, true)) {
                writeAll(out, actions);
            }
            return;
        }
        FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path).overwrite(false)
                .must(CONDITIONAL, true).build();
        try {
            writeAll(out, actions);
        } catch (IOException | RuntimeException e) {
            out.abort();                  // never a part of a commit: nothing is uploaded
            throw e;
        }
        try {
            out.close();                  // the PUT (and its condition) happens here
        } catch (IOException e) {
            if (isConflict(e)) {
                throw new FileAlreadyExistsException(path.toString());
            }
            throw e;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;                     // one PUT: all or nothing
    }

    private static void writeAll(FSDataOutputStream out, Iterator<String> actions) throws IOException {
        while (actions.hasNext()) {
            out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
    }

    /** 412 Precondition Failed (S3A's RemoteFileChangedException), or already there. */
    private static boolean isConflict(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            String name = t.getClass().getSimpleName();
            String msg = String.valueOf(t.getMessage());
            if (t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || t instanceof FileAlreadyExistsException
                    || name.equals("RemoteFileChangedException")
                    || msg.contains("412") || msg.contains("PreconditionFailed")) {
                return true;
            }
        }
        return false;
    }
}
