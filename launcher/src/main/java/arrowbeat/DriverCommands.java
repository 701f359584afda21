package arrowbeat;

import arrowbeat.compat.SparkInternals.Internal;
import java.util.Optional;
import java.util.concurrent.Executor;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The actions the driver-side process may ask of Spark: {@code kill-executor <id>} (for an
 * executor whose map outputs are lost), {@code lost-executor <id>} (a heartbeat timeout with
 * {@code spark.arrowbeat.onHeartbeatTimeout=kill}: the same kill, then Spark's task scheduler is
 * told the executor is lost), {@code decommission-executor <id>} (an executor slower than its
 * peers, {@code spark.arrowbeat.onDegraded=exclude}) and {@code kill-task <task attempt id>} ({@code
 * spark.arrowbeat.onStuckTask=kill}). Only commands from the driver-side process's protocol
 * channel get here, already validated ({@link Protocol#parseCommand}); an agent's verbs are
 * ignored. Each runs off the protocol pump ({@code replacer}: a kill waits on the cluster manager,
 * as Spark's HeartbeatReceiver kills from its own thread). What became of a replacement goes back
 * ({@link Protocol#executorReplacement}): the driver-side process charged its budget for lost
 * outputs and refunds a refused one. Spark's calls are handed in ({@link Spark}), so the JUnit
 * tests run every outcome without Spark.
 */
final class DriverCommands implements Consumer<Protocol.Command> {
  private static final Logger LOG = LoggerFactory.getLogger(DriverCommands.class);

  /** Spark's calls ({@code arrowbeat.compat.SparkInternals}, {@code SparkContext}); each may throw. */
  interface Spark {
    /** Kill and replace: accepted or not, empty if this Spark cannot ({@code killAndReplaceExecutor}). */
    Optional<Boolean> killAndReplace(String executorId);

    /** Tell the task scheduler the executor is lost: done or not, empty if this Spark cannot. */
    Optional<Boolean> executorLost(String executorId, String message);

    /** {@code SparkContext.killTaskAttempt}: false if it runs no more. */
    boolean killTaskAttempt(long taskId, String reason);

    /** Decommission: accepted or not, empty if this Spark cannot ({@code decommissionExecutor}). */
    Optional<Boolean> decommission(String executorId, String message);
  }

  static final String LOST_MESSAGE =
      "arrowbeat: executor heartbeats timed out (spark.arrowbeat.onHeartbeatTimeout=kill)";
  static final String KILL_TASK_REASON = "arrowbeat: no progress for spark.arrowbeat.stuckTask.timeout";
  static final String DEGRADED_MESSAGE =
      "arrowbeat: executor consistently slower than its peers (spark.arrowbeat.onDegraded=exclude)";

  private final Spark spark;
  private final Executor replacer;
  private final SparkExecutors executors;
  private final Consumer<String> toProcess;

  /** {@code toProcess} sends a line to the driver-side process running now, if any. */
  DriverCommands(Spark spark, Executor replacer, SparkExecutors executors, Consumer<String> toProcess) {
    this.spark = spark;
    this.replacer = replacer;
    this.executors = executors;
    this.toProcess = toProcess;
  }

  @Override
  public void accept(Protocol.Command command) {
    if (Protocol.KILL_EXECUTOR.equals(command.verb()) || Protocol.LOST_EXECUTOR.equals(command.verb())) {
      String executorId = command.argument();
      boolean lost = Protocol.LOST_EXECUTOR.equals(command.verb());
      replacer.execute(
          () -> {
            Protocol.Replacement outcome = replace(executorId);
            LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", executorId, text(outcome));
            if (lost && outcome == Protocol.Replacement.ACCEPTED) {
              declareLost(executorId);
            }
            toProcess.accept(Protocol.executorReplacement(executorId, outcome));
          });
    } else if (Protocol.DECOMMISSION_EXECUTOR.equals(command.verb())) {
      String executorId = command.argument();
      replacer.execute(() -> toProcess.accept(Protocol.executorReplacement(executorId, decommission(executorId))));
    } else if (Protocol.KILL_TASK.equals(command.verb())) {
      long taskId = Long.parseLong(command.argument());
      // Off the protocol pump: killTaskAttempt takes the task scheduler's lock.
      replacer.execute(() -> killTask(taskId));
    }
  }

  /**
   * Kill-and-replace, remembered so that Spark's removal of the executor is recorded as a
   * replacement arrowbeat asked for, not as a crash.
   */
  Protocol.Replacement replace(String executorId) {
    executors.replacing(executorId);
    Protocol.Replacement outcome = Protocol.Replacement.REFUSED;
    try {
      outcome = spark.killAndReplace(executorId)
          .map(accepted -> accepted ? Protocol.Replacement.ACCEPTED : Protocol.Replacement.REFUSED)
          .orElse(Protocol.Replacement.UNAVAILABLE);
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: replacing executor {} failed: {}", executorId, e.toString());
    }
    if (outcome != Protocol.Replacement.ACCEPTED) {
      executors.notReplaced(executorId);
    }
    return outcome;
  }

  /**
   * {@code decommission-executor} (an executor slower than its peers, {@code onDegraded=exclude},
   * sent only where {@code spark.decommission.enabled} is on): Spark decommissions it, so no new
   * task goes there and its shuffle and cached blocks move (with {@code spark.storage.decommission.*})
   * before it exits and is replaced; remembered like a replacement, so its removal is recorded as
   * one arrowbeat asked for. Where Spark cannot, or refuses, it is killed and replaced instead.
   */
  Protocol.Replacement decommission(String executorId) {
    executors.replacing(executorId);
    Optional<Boolean> answer = Optional.empty();
    try {
      answer = spark.decommission(executorId, DEGRADED_MESSAGE);
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: decommissioning executor {} failed: {}", executorId, e.toString());
    }
    if (answer.orElse(false)) {
      LOG.warn("arrowbeat asked Spark to decommission executor {} (slower than its peers): accepted", executorId);
      return Protocol.Replacement.ACCEPTED;
    }
    LOG.warn("arrowbeat could not have Spark decommission executor {} ({}): it is killed and replaced instead",
        executorId, answer.isPresent() ? "refused" : Internal.DECOMMISSION_EXECUTOR.key() + " unavailable");
    Protocol.Replacement outcome = replace(executorId);
    LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", executorId, text(outcome));
    return outcome;
  }

  /**
   * {@code lost-executor}, once the kill was accepted: Spark's task scheduler is told the executor
   * is lost, so the attempts running there are resubmitted now rather than when the process is
   * gone (a frozen JVM cannot act on the cluster manager's SIGTERM). After the kill, as Spark's
   * own HeartbeatReceiver does: an accepted kill has marked the executor pending removal, so its
   * cores are no longer offered to the task scheduler meanwhile.
   */
  private void declareLost(String executorId) {
    try {
      Optional<Boolean> told = spark.executorLost(executorId, LOST_MESSAGE);
      LOG.warn("arrowbeat told Spark's scheduler that executor {} is lost: {}", executorId,
          told.map(done -> done ? "its tasks are resubmitted now" : "no task scheduler")
              .orElse("not possible on this Spark (" + Internal.EXECUTOR_LOST.key()
                  + " is unavailable: see the warning at start-up)"));
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: telling Spark executor {} is lost failed: {}", executorId, e.toString());
    }
  }

  /** A task attempt made no progress for the stuck-task timeout: Spark kills it and runs it again. */
  private void killTask(long taskId) {
    try {
      boolean killed = spark.killTaskAttempt(taskId, KILL_TASK_REASON);
      LOG.warn("arrowbeat asked Spark to kill stuck task attempt {}: {}", taskId,
          killed ? "accepted" : "not running any more");
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: killing task attempt {} failed: {}", taskId, e.toString());
    }
  }

  /** What became of a request to replace an executor, as the log says it. */
  static String text(Protocol.Replacement outcome) {
    return switch (outcome) {
      case ACCEPTED -> "accepted";
      case REFUSED -> "refused by the scheduler backend";
      case UNAVAILABLE -> "not possible on this Spark (" + Internal.KILL_AND_REPLACE_EXECUTOR.key()
          + " is unavailable: see the warning at start-up)";
    };
  }
}
