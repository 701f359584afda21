package arrowbeat;

import java.util.concurrent.RejectedExecutionException;
import java.util.function.IntSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An executor's agent from its first start to the executor's end: its start (retried unless it
 * cannot succeed), its hang checks, its restarts and what the driver is told of each. No Spark
 * here: {@link ArrowBeatExecutorPlugin} hands in what only it can do ({@link Plugin}: start a
 * wired agent, ask or tell the driver), a {@link Clock} and a {@link Scheduler}, so the JUnit
 * tests drive every decision on a fake clock with fake agents.
 *
 * <p>An agent that exits while the executor runs (killed, crashed, or ended on purpose because it
 * gave up: it then logs the cause as its last line and exits non-zero) is reported to the driver
 * at once ({@link Protocol#executorAgentDown}: the driver lists the executor UNMONITORED with that
 * cause) besides the lost-outputs report, and started again: at most {@link #RESTARTS_MAX} starts
 * in any {@link #RESTARTS_WINDOW_MS} (a sliding window, never a cap per lifetime: a further one
 * waits until the oldest leaves the window), a failed start retried after a backoff up to {@link
 * #RESTART_BACKOFF_MAX_MS}; each delay is told to the driver. The numbers' arithmetic is {@link
 * Supervision}'s (the driver's RM supervisor uses the same).
 *
 * <p>An agent that runs but is wedged (its heartbeat loop blocked, the process stopped) is found
 * the way the driver plugin finds a hung RM: the agent answers each pulse from the loop that serves
 * its heartbeats ({@link Protocol#parseAlive}); one that leaves a pulse unanswered for longer than
 * the hang bound it announced ({@code hang_ms} in its ready line) is SIGKILLed, reported like an
 * exit with the cause {@link #hungCause}, and started again through the same rate limit. A check
 * that runs late because this JVM was paused judges nothing ({@link Supervision#hung}).
 *
 * <p>One start path serves a retried first start and a restart ({@link #attempt}): they differ only
 * in what a first start does before (without the RM's address, an ask of the driver first, no
 * attempt counted while the RM is pending) and after a failure (final if it cannot succeed, and
 * told as "not started"; a restart's failure is told as the agent down, and always retried).
 */
final class AgentSupervisor {
  private static final Logger LOG = LoggerFactory.getLogger(AgentSupervisor.class);
  static final int RESTARTS_MAX = 5;
  static final long RESTARTS_WINDOW_MS = 5 * 60_000;
  static final long RESTART_BACKOFF_MAX_MS = 30_000;
  /** How long a kill of a hung agent waits for its end (SIGKILL: a stopped process dies too). */
  static final long KILL_WAIT_MS = 5000;
  /** {@link #attempt}'s {@code deadPid} for a retried first start (no agent died). */
  private static final long FIRST_START = -1;

  /** What only the executor plugin can do (Spark's RPC, Spark's conf), for the supervisor. */
  interface Plugin {
    /**
     * Starts one agent with the RM's address last learnt, its commands and metrics wired; throws
     * when it is not ready within the start-up timeout, or cannot start at all.
     */
    Supervised launch() throws Exception;

    /** Whether the RM's address is known (the driver's settings, or an answer since). */
    boolean rmKnown();

    /** Asks the driver where the RM is now: its address, or null while it is down or pending. */
    String askRmAddress();

    /** One line to the driver plugin (one way; a failure is only logged). */
    void tellDriver(String line);

    /** This executor's outputs may be lost ({@code reason}): asks the driver, waiting for it. */
    void reportLost(String reason);

    /** {@link #reportLost}, off the calling thread. */
    void reportLostLater(String reason);

    /** The agent did not start and will not be retried (the driver shows the executor unmonitored). */
    void notStarted(Throwable why);

    /** The first agent runs: what follows it for the executor's life starts (task-watch reports). */
    void firstStarted(Supervised agent);
  }

  private final String executorId;
  private final Plugin plugin;
  private final Clock clock;
  /** Hang checks and restarts, on one thread: a hang kill and a restart never overlap. */
  private final Scheduler restarter;
  private final IntSupplier runningTasks;
  /** Tasks ever started here (for the logs: without one, this executor cannot hold map outputs). */
  private final IntSupplier tasksStarted;
  private final Supervision supervision = new Supervision(policy(0));
  private volatile Supervised sidecar;
  /** The agent whose pulses and answers the hang check times (set before its first pulse). */
  private volatile Supervised supervised;
  /** The last agent reported down: a hung one killed and its exit seen are one report, not two. */
  private Supervised reportedDown;
  private volatile boolean shuttingDown;
  /** Whether the hang checks and the plugin's {@link Plugin#firstStarted} ran. */
  private boolean wired;

  AgentSupervisor(
      String executorId, Plugin plugin, Clock clock, Scheduler restarter, IntSupplier runningTasks,
      IntSupplier tasksStarted) {
    this.executorId = executorId;
    this.plugin = plugin;
    this.clock = clock;
    this.restarter = restarter;
    this.runningTasks = runningTasks;
    this.tasksStarted = tasksStarted;
  }

  /** The executor's restart limits, with an agent's own hang bound. */
  static Supervision.Policy policy(long hangMs) {
    return new Supervision.Policy(hangMs, RESTARTS_MAX, RESTARTS_WINDOW_MS, RESTART_BACKOFF_MAX_MS);
  }

  /** The agent running now (null before the first start and after shutdown). */
  Supervised current() {
    return sidecar;
  }

  /** One line to the running agent, if any. */
  void send(String line) {
    Supervised agent = sidecar;
    if (agent != null) {
      agent.send(line);
    }
  }

  /**
   * The plugin's start: at once if the RM's address is known, else once an ask of the driver
   * returns it. A failed start that may succeed later is told to the driver and retried like a
   * restart; one that cannot ({@link Supervision#retriesStart}) is thrown to the plugin.
   */
  void start() throws Throwable {
    if (!plugin.rmKnown()) {
      LOG.warn("arrowbeat's driver-side process on the driver has not started yet; the agent of "
          + "executor {} starts once it runs", executorId);
      scheduleFirstStart();
      return;
    }
    try {
      started(launch());
    } catch (Throwable first) {
      if (!Supervision.retriesStart(first)) {
        throw first;
      }
      supervision.attempting(clock.nowMs());
      supervision.failed(clock.nowMs());
      LOG.error("arrowbeat agent did not start on executor {}; it is started again (rate-limited as "
          + "restarts are): {}", executorId, first.getMessage());
      plugin.notStarted(first);
      scheduleFirstStart();
    }
  }

  /** The plugin's start failed for good: an agent that did start is stopped at once. */
  void abandon() {
    Supervised agent = sidecar;
    if (agent != null) {
      agent.stop(0);
      sidecar = null;
    }
  }

  /** The JVM shuts down: an agent that ends from now on is no crash (no report, no restart). */
  void shuttingDown() {
    shuttingDown = true;
  }

  /** The executor ends: no restart from now on; the running agent, if any, is returned to stop. */
  synchronized Supervised shutdown() {
    shuttingDown = true;
    Supervised agent = sidecar;
    sidecar = null;
    return agent;
  }

  /** {@link Plugin#launch}, then the supervision of what started: its exit, pulses and answers. */
  private Supervised launch() throws Exception {
    Supervised agent = plugin.launch();
    agent.onUnexpectedExit(() -> agentExited(agent));
    // Its hang bound is its own (the ready line); the restart limits stay the executor's.
    supervision.launched(policy(Supervision.Policy.from(agent.info()).hangMs()), clock.nowMs());
    supervised = agent;
    agent.onAlive(
        answer -> {
          if (supervised == agent) { // a late line of a replaced agent changes nothing
            supervision.answered();
          }
        });
    agent.onPulse(
        () -> {
          if (supervised == agent) {
            supervision.pulsed(clock.nowMs());
          }
        });
    agent.startPulses(Launch.pulseMs(agent.info()), runningTasks);
    return agent;
  }

  /** An agent that started is the one running; the first one starts the checks that follow it. */
  private synchronized void started(Supervised agent) {
    sidecar = agent;
    if (!wired) {
      wired = true;
      plugin.firstStarted(agent);
      long checkMs = Supervision.checkMs(Launch.pulseMs(agent.info()));
      restarter.every(() -> checkHang(checkMs), checkMs);
    }
  }

  /** The next first-start attempt, when the rate limit allows (on the restarter). */
  private void scheduleFirstStart() {
    if (shuttingDown) {
      return;
    }
    long delayMs = Math.max(0, supervision.nextRestartAt(clock.nowMs()) - clock.nowMs());
    try {
      restarter.schedule(() -> attempt(FIRST_START), delayMs);
    } catch (RejectedExecutionException e) {
      LOG.debug("arrowbeat agent start not scheduled: the executor is shutting down");
    }
  }

  /**
   * One start attempt, on the restarter: a retried first start ({@code deadPid} {@link
   * #FIRST_START}) or a restart after agent {@code deadPid}. A first start without the RM's address
   * asks the driver first (no attempt counted while the RM is pending, only the backoff). A failed
   * first start is tried again unless it cannot succeed; a failed restart always is, and is told.
   */
  private void attempt(long deadPid) {
    if (shuttingDown) {
      return;
    }
    boolean first = deadPid == FIRST_START;
    if (first && !plugin.rmKnown() && plugin.askRmAddress() == null) {
      supervision.failed(clock.nowMs());
      scheduleFirstStart();
      return;
    }
    supervision.attempting(clock.nowMs());
    try {
      Supervised agent = launch();
      supervision.succeeded();
      synchronized (this) {
        if (shuttingDown) {
          agent.stop(0);
          return;
        }
        started(agent);
      }
      if (first) {
        LOG.warn("arrowbeat agent of executor {} started (pid {}) after a failed or delayed first start",
            executorId, agent.pid());
      } else {
        LOG.warn("arrowbeat agent of executor {} started again (pid {})", executorId, agent.pid());
      }
    } catch (Throwable t) {
      supervision.failed(clock.nowMs());
      if (!first) {
        LOG.error("arrowbeat agent of executor {} did not start again: {}", executorId, t.getMessage());
        scheduleRestart(deadPid, "agent restart failed: " + t.getMessage());
      } else if (!Supervision.retriesStart(t)) {
        LOG.error("arrowbeat agent of executor {} did not start and will not be retried: {}",
            executorId, t.getMessage());
        plugin.notStarted(t);
      } else {
        LOG.error("arrowbeat agent of executor {} did not start (retried in {} ms): {}", executorId,
            Math.max(0, supervision.nextRestartAt(clock.nowMs()) - clock.nowMs()), t.getMessage());
        scheduleFirstStart();
      }
    }
  }

  /**
   * The agent exited while this executor runs (its protocol thread): the driver hears it at once
   * (UNMONITORED with the cause), then, as before, whether map outputs were lost with it (the
   * driver's call: not if no task ever ran here); a restart is scheduled.
   */
  private void agentExited(Supervised dead) {
    if (shuttingDown || !claimDown(dead)) {
      return;
    }
    String cause = exitCause(dead.exitCode(), dead.lastLogLine());
    LOG.error("arrowbeat agent of executor {} (pid {}) {} ({} tasks started here); telling the driver "
        + "and starting it again", executorId, dead.pid(), cause, tasksStarted.getAsInt());
    scheduleRestart(dead.pid(), cause);
    plugin.reportLost("agent-exited");
  }

  /** True the first time {@code agent} is reported down (a hung one killed, or one that exited). */
  private synchronized boolean claimDown(Supervised agent) {
    if (reportedDown == agent) {
      return false;
    }
    reportedDown = agent;
    return true;
  }

  /**
   * A live agent that left a pulse unanswered for longer than its hang bound ({@link
   * Supervision#hung}; never judged by a check that ran late) is hung: SIGKILLed, reported to the
   * driver with the cause as an exited one is, and started again (rate-limited). An agent that
   * exited is not this check's: its exit is reported as it happens.
   */
  void checkHang(long checkMs) {
    try {
      Supervised current = sidecar;
      if (shuttingDown || current == null || current != supervised || !current.isAlive()) {
        return;
      }
      long now = clock.nowMs();
      if (!supervision.hung(now, checkMs) || !claimDown(current)) {
        return;
      }
      long silentMs = supervision.silentMs(now);
      String cause = hungCause(silentMs, supervision.policy().hangMs());
      LOG.error("arrowbeat agent of executor {} (pid {}) is hung: no answer to the pulse for {} ms ({} "
          + "tasks started here); killing it, telling the driver and starting it again",
          executorId, current.pid(), silentMs, tasksStarted.getAsInt());
      current.kill(KILL_WAIT_MS); // no exit callback: this check reports it
      scheduleRestart(current.pid(), cause);
      plugin.reportLostLater("agent-hung");
    } catch (Throwable t) { // the check must outlive anything one round throws
      LOG.error("arrowbeat's hang check of the agent of executor {} failed this round: {}",
          executorId, t.toString());
    }
  }

  /** Tells the driver when the agent starts again (the rate limit's answer), and schedules it. */
  private void scheduleRestart(long deadPid, String cause) {
    if (shuttingDown) {
      return;
    }
    long now = clock.nowMs();
    long delayMs = Math.max(0, supervision.nextRestartAt(now) - now);
    if (delayMs > 0) {
      LOG.warn("arrowbeat agent of executor {} restarts in {} ms (at most {} starts per {} s)",
          executorId, delayMs, RESTARTS_MAX, RESTARTS_WINDOW_MS / 1000);
    }
    plugin.tellDriver(Protocol.executorAgentDown(executorId, deadPid, delayMs, cause));
    try {
      restarter.schedule(() -> attempt(deadPid), delayMs);
    } catch (RejectedExecutionException e) {
      LOG.debug("arrowbeat agent restart not scheduled: the executor is shutting down");
    }
  }

  /** Why a hung agent was killed, for the driver (an {@link Protocol#executorAgentDown} cause). */
  static String hungCause(long silentMs, long boundMs) {
    return "agent hung: no answer to the JVM's pulse for " + silentMs + " ms (bound " + boundMs
        + " ms); killed";
  }

  /** Why an agent ended, in a few words: its signal, or its status and its last log line. */
  static String exitCause(int code, String lastLine) {
    if (code > 128 && code < 160) {
      return "agent exited (killed by signal " + (code - 128) + ")";
    }
    String line = lastLine == null || lastLine.isEmpty() ? "" : ": " + lastLine;
    return "agent exited (status " + code + ")" + line;
  }
}
