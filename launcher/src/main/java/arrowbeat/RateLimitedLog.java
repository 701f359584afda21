package arrowbeat;

import org.slf4j.Logger;

/**
 * A warning logged at most once per interval; the ones in between are counted and the count is
 * reported with the next one, so a child (or a peer behind it) that floods a refused input cannot
 * flood the application's log.
 */
final class RateLimitedLog {
  private final Logger log;
  private final long intervalNanos;
  private long nextAt = Long.MIN_VALUE;
  private long suppressed;

  RateLimitedLog(Logger log, long intervalMs) {
    this.log = log;
    this.intervalNanos = intervalMs * 1_000_000L;
  }

  /** Logs {@code message} (already safe to log) unless one was logged less than an interval ago. */
  synchronized void warn(String message) {
    long now = System.nanoTime();
    if (nextAt != Long.MIN_VALUE && now - nextAt < 0) {
      suppressed++;
      return;
    }
    if (suppressed > 0) {
      log.warn("{} ({} similar warnings suppressed)", message, suppressed);
    } else {
      log.warn("{}", message);
    }
    suppressed = 0;
    nextAt = now + intervalNanos;
  }
}
