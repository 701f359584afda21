package arrowbeat;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.RejectedExecutionException;

/**
 * A {@link Scheduler} on a {@link FakeClock}: tasks wait in a queue, {@link #runUntil} moves the
 * clock to each one's time in order and runs it on the test's thread (one thread, as in production).
 */
final class FakeScheduler implements Scheduler {
  private record Task(long at, long seq, Runnable run, long periodMs) {}

  private final FakeClock clock;
  private final List<Task> queue = new ArrayList<>();
  /** The delay of every one-shot task asked for, in order. */
  final List<Long> delays = new ArrayList<>();
  /** The period of every repeating task asked for. */
  final List<Long> periods = new ArrayList<>();
  private long seq;
  private boolean shutDown;

  FakeScheduler(FakeClock clock) {
    this.clock = clock;
  }

  @Override
  public void schedule(Runnable task, long delayMs) {
    if (shutDown) {
      throw new RejectedExecutionException("shut down");
    }
    delays.add(delayMs);
    queue.add(new Task(clock.nowMs() + delayMs, seq++, task, 0));
  }

  @Override
  public void every(Runnable task, long periodMs) {
    if (shutDown) {
      throw new RejectedExecutionException("shut down");
    }
    periods.add(periodMs);
    queue.add(new Task(clock.nowMs() + periodMs, seq++, task, periodMs));
  }

  void shutDown() {
    shutDown = true;
    queue.clear();
  }

  /** One-shot tasks waiting. */
  long pendingOnce() {
    return queue.stream().filter(t -> t.periodMs() == 0).count();
  }

  /** Runs every task due by {@code until} in time order (the clock set to each), then sets the clock there. */
  void runUntil(long until) {
    while (true) {
      Task next = queue.stream()
          .filter(t -> t.at() <= until)
          .min(Comparator.comparingLong(Task::at).thenComparingLong(Task::seq))
          .orElse(null);
      if (next == null) {
        break;
      }
      queue.remove(next);
      clock.set(Math.max(clock.nowMs(), next.at()));
      if (next.periodMs() > 0) {
        queue.add(new Task(next.at() + next.periodMs(), seq++, next.run(), next.periodMs()));
      }
      next.run().run();
    }
    clock.set(Math.max(clock.nowMs(), until));
  }

  /** Runs what is due now (a task scheduled with no delay). */
  void runDue() {
    runUntil(clock.nowMs());
  }
}
