package arrowbeat;

import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * Where a supervisor's delayed work runs: in production one thread of a {@link
 * ScheduledExecutorService} (so a hang check and a restart never overlap), in tests a queue run
 * by hand on a fake {@link Clock}. Both throw {@link RejectedExecutionException} once shut down.
 */
interface Scheduler {
  /** Runs {@code task} once, {@code delayMs} from now. */
  void schedule(Runnable task, long delayMs);

  /** Runs {@code task} every {@code periodMs}, the first time {@code periodMs} from now. */
  void every(Runnable task, long periodMs);

  /** A single-thread executor's scheduler. */
  static Scheduler of(ScheduledExecutorService executor) {
    return new Scheduler() {
      @Override
      public void schedule(Runnable task, long delayMs) {
        executor.schedule(task, delayMs, TimeUnit.MILLISECONDS);
      }

      @Override
      public void every(Runnable task, long periodMs) {
        executor.scheduleWithFixedDelay(task, periodMs, periodMs, TimeUnit.MILLISECONDS);
      }
    };
  }
}
