package io.rmqspark.delta;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import io.delta.storage.S3SingleDriverLogStore;
import software.amazon.awssdk.core.exception.SdkServiceException;

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
 * retries it as a conflict, as on HDFS or a local disk. A commit that is already there
 * with exactly our bytes is ours (the SDK retried a PUT whose answer was lost): success.
 * Reading and listing are Delta's own. Configured by rmq_spark.spark.session_builder
 * for s3a:// and s3://.
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
        byte[] body = render(actions);        // a commit is small: whole before any upload
        FSDataOutputStream out = overwrite
                ? fs.create(path, true)
                : (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
        try {
            out.write(body);
        } catch (IOException | RuntimeException e) {
            abortQuietly(out, e);             // never part of a file: nothing is uploaded
            throw e;
        }
        try {
            out.close();                      // the PUT (and its condition) happens here
        } catch (IOException e) {
            if (!overwrite && isConflict(e)) {
                if (Arrays.equals(readOrNull(fs, path), body)) {
                    return;                   // our own commit, its first answer lost
                }
                FileAlreadyExistsException conflict = new FileAlreadyExistsException(path.toString());
                conflict.initCause(e);
                throw conflict;
            }
            throw e;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;                         // one PUT: all or nothing
    }

    private static byte[] render(Iterator<String> actions) {
        StringBuilder text = new StringBuilder();
        while (actions.hasNext()) {
            text.append(actions.next()).append('\n');
        }
        return text.toString().getBytes(StandardCharsets.UTF_8);
    }

    private static void abortQuietly(FSDataOutputStream out, Throwable cause) {
        try {
            out.abort();
        } catch (RuntimeException e) {
            cause.addSuppressed(e);
        }
    }

    private static byte[] readOrNull(FileSystem fs, Path path) {
        try (InputStream in = fs.open(path)) {
            ByteArrayOutputStream all = new ByteArrayOutputStream();
            in.transferTo(all);
            return all.toByteArray();
        } catch (IOException e) {
            return null;
        }
    }

    /** 412 Precondition Failed or 409 ConditionalRequestConflict from the store, or
     *  a "file exists" from the filesystem. */
    private static boolean isConflict(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof SdkServiceException) {
                int status = ((SdkServiceException) t).statusCode();
                if (status == 412 || status == 409) {
                    return true;
                }
            }
            if (t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || t instanceof FileAlreadyExistsException
                    || t.getClass().getSimpleName().equals("RemoteFileChangedException")) {
                return true;
            }
        }
        return false;
    }
}
