package arrowbeat;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;

/**
 * Lines of a child's output, each at most {@code maxBytes}: the rest of an over-long line is read
 * and dropped, and {@link #truncated} says so. A child that writes without newlines therefore
 * cannot make the JVM buffer without bound.
 */
final class BoundedLineReader implements Closeable {
  private final InputStream in;
  private final byte[] buffer;
  private boolean truncated;

  BoundedLineReader(InputStream in, int maxBytes) {
    this.in = new BufferedInputStream(in);
    this.buffer = new byte[maxBytes];
  }

  /** The next line without its {@code \n}, or null at end of input. */
  String next() throws IOException {
    int length = 0;
    boolean dropped = false;
    int b;
    while ((b = in.read()) != -1 && b != '\n') {
      if (length < buffer.length) {
        buffer[length++] = (byte) b;
      } else {
        dropped = true;
      }
    }
    if (b == -1 && length == 0 && !dropped) {
      return null;
    }
    truncated = dropped;
    return new String(buffer, 0, length, StandardCharsets.UTF_8);
  }

  /** Whether the line {@link #next} returned last was cut at the limit. */
  boolean truncated() {
    return truncated;
  }

  @Override
  public void close() throws IOException {
    in.close();
  }
}
