package arrowbeat;

import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Map;

/**
 * When the driver plugin calls its driver-side process hung, and when it may restart one: the
 * decisions of {@link RmSupervisor} and {@link AgentSupervisor}, apart from any I/O or clock so that
 * the JVM unit tests ({@code launcher/src/test}) and {@code tests/spark_plugin/java/SupervisionCheck.java}
 * drive them on a fake one (every time is a monotonic millisecond reading the caller passes). They live in the JVM, not in Python, because
 * they must act while the Python process is hung or dead; the numbers come from Python
 * ({@link Policy#from}: the ready line, from the validated {@code spark.arrowbeat.rm.*} keys).
 *
 * <p>Hung: a pulse was written and no answer came for longer than {@link Policy#hangMs}. A check
 * that itself runs late (this JVM was paused: a GC, a frozen host) judges nothing and starts the
 * wait again, so a pause of our own never kills a live process (Cassandra's and Pekko's failure
 * detectors suppress convictions after a local pause the same way).
 *
 * <p>Restarts: at most {@link Policy#maxRestarts} attempts start in any window of {@link
 * Policy#windowMs} (sliding: a further one waits until the oldest leaves the window; never a cap per
 * application), and an attempt that failed is retried after a backoff doubling from 1 s up to
 * {@link Policy#backoffMaxMs}.
 *
 * <p>A failed first start is retried the same way ({@link #retriesStart}): a loaded node that
 * missed the start-up timeout, or a port taken for a moment, must not leave the application (the
 * RM) or an executor (an agent) unmonitored for life. Only a start that cannot succeed later is
 * final: no interpreter, or a process that refused its settings ({@link #NOT_STARTED}).
 */
final class Supervision {
  /** The supervisor's numbers, as the driver-side process announced them in its ready line. */
  record Policy(long hangMs, int maxRestarts, long windowMs, long backoffMaxMs) {
    /** Before a ready line (and for a process that announces none): no hang detection. */
    static final Policy DEFAULT = new Policy(0, 10, 600_000, 30_000);

    /**
     * From the ready line's {@code hang_ms restart_max restart_window_ms restart_backoff_ms}; a
     * process that announces no {@code hang_ms} does not answer pulses and is never called hung.
     */
    static Policy from(Map<String, String> info) {
      return new Policy(
          positive(info.get("hang_ms"), 0),
          (int) Math.min(10_000, positive(info.get("restart_max"), DEFAULT.maxRestarts)),
          positive(info.get("restart_window_ms"), DEFAULT.windowMs),
          positive(info.get("restart_backoff_ms"), DEFAULT.backoffMaxMs));
    }

    private static long positive(String text, long fallback) {
      try {
        long value = Long.parseLong(text == null ? "" : text);
        return value > 0 ? value : fallback;
      } catch (NumberFormatException e) {
        return fallback;
      }
    }
  }

  /**
   * The exit status of a driver-side process or an agent that refused its settings (a bad
   * {@code spark.arrowbeat.*} value, no secret): the same settings fail again, so it is not retried
   * ({@code spark_plugin.jvm.protocol.NOT_STARTED}).
   */
  static final int NOT_STARTED = 2;

  /**
   * Is a failed start worth another attempt? Yes unless it cannot succeed with the same settings:
   * the interpreter is missing ({@link Launch.MissingInterpreterException}) or the process exited
   * with {@link #NOT_STARTED}. A start-up timeout (-1), a crash or any other status is retried.
   */
  static boolean retriesStart(boolean interpreterMissing, int exitStatus) {
    return !interpreterMissing && exitStatus != NOT_STARTED;
  }

  /** {@link #retriesStart} of what a start threw. */
  static boolean retriesStart(Throwable failure) {
    int status = failure instanceof Sidecar.SidecarException started ? started.exitStatus() : -1;
    return retriesStart(failure instanceof Launch.MissingInterpreterException, status);
  }

  /**
   * How often a supervisor checks for a hang: every pulse interval, within 100 ms to 1 s (1 s
   * without pulses).
   */
  static long checkMs(long pulseMs) {
    return Math.max(100, Math.min(1000, pulseMs <= 0 ? 1000 : pulseMs));
  }

  /** First delay before retrying a failed restart; doubles per further failure. */
  static final long FIRST_BACKOFF_MS = 1000;

  private Policy policy;
  private final Deque<Long> attempts = new ArrayDeque<>();
  private int failures;
  private long retryAt = Long.MIN_VALUE;
  private long waitingSince = -1;
  private long lastCheck = -1;

  Supervision(Policy policy) {
    this.policy = policy;
  }

  synchronized Policy policy() {
    return policy;
  }

  /** A new process answers from now on: its own announcement, and no wait pending. */
  synchronized void launched(Policy announced, long now) {
    policy = announced;
    waitingSince = -1;
    lastCheck = now;
  }

  /** A pulse was written: if none was waiting for an answer, the wait starts now. */
  synchronized void pulsed(long now) {
    if (waitingSince < 0) {
      waitingSince = now;
    }
  }

  /** An answer came: nothing is waiting. */
  synchronized void answered() {
    waitingSince = -1;
  }

  /**
   * Is the process hung, by this check at {@code now}, run every {@code checkMs}? A check more than
   * three periods after the previous one (this JVM was paused) judges nothing and restarts the wait.
   */
  synchronized boolean hung(long now, long checkMs) {
    boolean late = lastCheck >= 0 && now - lastCheck > 3 * checkMs;
    lastCheck = now;
    if (late) {
      waitingSince = waitingSince < 0 ? -1 : now;
      return false;
    }
    return policy.hangMs() > 0 && waitingSince >= 0 && now - waitingSince > policy.hangMs();
  }

  /** How long the process has left a pulse unanswered at {@code now} (0 if none waits). */
  synchronized long silentMs(long now) {
    return waitingSince < 0 ? 0 : now - waitingSince;
  }

  /**
   * The earliest time a restart attempt may start, at {@code now}: after the backoff of a failed
   * attempt, and once fewer than {@code maxRestarts} attempts started in the window before it.
   */
  synchronized long nextRestartAt(long now) {
    while (!attempts.isEmpty() && attempts.peekFirst() <= now - policy.windowMs()) {
      attempts.removeFirst();
    }
    long at = Math.max(now, retryAt);
    if (attempts.size() >= policy.maxRestarts()) {
      at = Math.max(at, attempts.peekFirst() + policy.windowMs());
    }
    return at;
  }

  /** A restart attempt starts now (it counts toward the window whatever its outcome). */
  synchronized void attempting(long now) {
    attempts.addLast(now);
    while (attempts.size() > policy.maxRestarts()) {
      attempts.removeFirst();
    }
  }

  /** The attempt failed at {@code now}: the next waits {@link #backoffMs} of the failures so far. */
  synchronized void failed(long now) {
    failures++;
    retryAt = now + backoffMs(failures);
  }

  /** The attempt's process is ready: failures are forgotten. */
  synchronized void succeeded() {
    failures = 0;
    retryAt = Long.MIN_VALUE;
  }

  /** The delay after {@code failures} consecutive failed attempts: 1 s doubling, capped by the policy. */
  synchronized long backoffMs(int failures) {
    long delay = FIRST_BACKOFF_MS << Math.min(30, Math.max(0, failures - 1));
    return Math.min(delay, policy.backoffMaxMs());
  }
}
