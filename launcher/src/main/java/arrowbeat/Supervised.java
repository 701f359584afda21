package arrowbeat;

import java.util.Map;
import java.util.function.Consumer;
import java.util.function.IntSupplier;

/**
 * A started Python child as its supervisor sees it ({@link AgentSupervisor}, {@link
 * RmSupervisor}): {@link Sidecar} in production, a fake in the JVM unit tests, so that every
 * decision about starts, hangs and restarts runs there without a process or Spark.
 */
interface Supervised {
  long pid();

  /** Its ready line's fields (address, pulse interval, hang bound, restart limits...). */
  Map<String, String> info();

  boolean isAlive();

  /** Its exit status once it ended; -1 while it runs. */
  int exitCode();

  /** Its last log line (redacted; empty if none): an exited agent's cause. */
  String lastLogLine();

  /** One line to its stdin. */
  void send(String line);

  /** SIGKILL, waiting up to {@code waitMs}; no {@link #onUnexpectedExit} follows. */
  void kill(long waitMs);

  /** An orderly stop, then SIGTERM and SIGKILL after {@code graceMs}. */
  void stop(long graceMs);

  /** Its answers to pulses. */
  void onAlive(Consumer<Protocol.Alive> sink);

  /** Runs after each pulse written. */
  void onPulse(Runnable written);

  /** Runs when it exits after it was ready, without being stopped or killed. */
  void onUnexpectedExit(Runnable handler);

  /** Pulses every {@code intervalMs} (none if not positive), each with the running tasks. */
  void startPulses(long intervalMs, IntSupplier runningTasks);
}
