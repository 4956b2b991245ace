package io.rmqspark.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;

/**
 * Record batches as the nodes store them and a Fetch with ``encoding=batches`` hands them
 * over: ``u32 body length | u32 crc32c(body) | body``, the body ``u64 base offset, i64 store
 * ts, u32 count, u64 apply position`` and a columnar records block
 * (storage_service/protocol/framing.py and records.py, where the layout is described).
 * Each batch's CRC is checked; a batch that fails it is an error, never rows.
 */
final class Batches {
  static final int FLAG_KEY = 1;
  static final int FLAG_NULL_VALUE = 2;
  private static final int BATCH_HEAD = 8;
  private static final int BODY_HEAD = 28;

  /** One record, as the reader turns it into a row. */
  interface Sink {
    void record(long offset, long storeTs, long bornTs, byte[] key, byte[] value, String tags,
                String[] propKeys, String[] propValues);
  }

  private Batches() {
  }

  /** Every record of ``data`` at or after ``from`` and before ``until``, in order. */
  static void decode(byte[] data, long from, long until, Sink sink) throws IOException {
    try {
      batches(data, from, until, sink);
    } catch (IndexOutOfBoundsException | NegativeArraySizeException e) {
      throw new IOException("fetched batches: a records block does not parse (" + e + ")", e);
    }
  }

  private static void batches(byte[] data, long from, long until, Sink sink) throws IOException {
    ByteBuffer buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
    int pos = 0;
    while (pos < data.length) {
      if (pos + BATCH_HEAD + BODY_HEAD > data.length) {
        throw new IOException("fetched batches: a batch header is cut short at byte " + pos);
      }
      long bodyLen = Integer.toUnsignedLong(buf.getInt(pos));
      long crc = Integer.toUnsignedLong(buf.getInt(pos + 4));
      int start = pos + BATCH_HEAD;
      if (bodyLen < BODY_HEAD || start + bodyLen > data.length) {
        throw new IOException("fetched batches: bad body length " + bodyLen + " at byte " + pos);
      }
      int end = (int) (start + bodyLen);
      CRC32C check = new CRC32C();
      check.update(data, start, end - start);
      if (check.getValue() != crc) {
        throw new IOException("fetched batches: the batch at byte " + pos + " fails its CRC");
      }
      long base = buf.getLong(start);
      long storeTs = buf.getLong(start + 8);
      int count = buf.getInt(start + 16);
      if (count <= 0) {
        throw new IOException("fetched batches: a batch of " + count + " records at byte " + pos);
      }
      if (!records(buf, start + BODY_HEAD, end, count, base, storeTs, from, until, sink)) {
        return;
      }
      pos = end;
    }
  }

  /** False once a record at or past ``until`` was met: nothing after it is wanted. */
  private static boolean records(ByteBuffer buf, int at, int end, int n, long base, long storeTs, long from,
                                 long until, Sink sink) throws IOException {
    int delta = at;
    int born = delta + 4 * n;
    int flags = born + 8 * n;
    int keyOff = flags + n;
    int keyData = keyOff + 4 * (n + 1);
    int valueOff = keyData + buf.getInt(keyOff + 4 * n);
    int valueData = valueOff + 4 * (n + 1);
    int tagsOff = valueData + buf.getInt(valueOff + 4 * n);
    int tagsData = tagsOff + 4 * (n + 1);
    int propOff = tagsData + buf.getInt(tagsOff + 4 * n);
    int m = buf.getInt(propOff + 4 * n);
    int pkOff = propOff + 4 * (n + 1);
    int pkData = pkOff + 4 * (m + 1);
    int pvOff = pkData + buf.getInt(pkOff + 4 * m);
    int pvData = pvOff + 4 * (m + 1);
    if (pvData + buf.getInt(pvOff + 4 * m) != end) {
      throw new IOException("fetched batches: a records block does not end where its batch does");
    }
    for (int i = 0; i < n; i++) {
      long offset = base + Integer.toUnsignedLong(buf.getInt(delta + 4 * i));
      if (offset < from) {
        continue;
      }
      if (offset >= until) {
        return false;
      }
      int f = buf.get(flags + i);
      byte[] key = (f & FLAG_KEY) != 0 ? slice(buf, keyData, keyOff, i) : null;
      byte[] value = (f & FLAG_NULL_VALUE) != 0 ? null : slice(buf, valueData, valueOff, i);
      String tags = new String(slice(buf, tagsData, tagsOff, i), StandardCharsets.UTF_8);
      int p0 = buf.getInt(propOff + 4 * i);
      int p1 = buf.getInt(propOff + 4 * (i + 1));
      String[] pk = new String[p1 - p0];
      String[] pv = new String[p1 - p0];
      for (int j = p0; j < p1; j++) {
        pk[j - p0] = new String(slice(buf, pkData, pkOff, j), StandardCharsets.UTF_8);
        pv[j - p0] = new String(slice(buf, pvData, pvOff, j), StandardCharsets.UTF_8);
      }
      sink.record(offset, storeTs, buf.getLong(born + 8 * i), key, value, tags, pk, pv);
    }
    return true;
  }

  private static byte[] slice(ByteBuffer buf, int data, int off, int i) {
    int a = buf.getInt(off + 4 * i);
    int b = buf.getInt(off + 4 * (i + 1));
    byte[] out = new byte[b - a];
    buf.get(data + a, out);
    return out;
  }
}
