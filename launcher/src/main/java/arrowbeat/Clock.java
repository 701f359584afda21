package arrowbeat;

/**
 * A monotonic millisecond clock, passed to every class that decides on time ({@link
 * AgentSupervisor}, {@link RmSupervisor}) so that its tests drive it by hand (as {@code
 * heartbeat.clock}'s {@code ManualClock} does on the Python side); {@link #SYSTEM} in production.
 */
@FunctionalInterface
interface Clock {
  /** Milliseconds from an arbitrary origin; never goes back. */
  long nowMs();

  /** {@link System#nanoTime} in milliseconds. */
  Clock SYSTEM = () -> System.nanoTime() / 1_000_000;
}
