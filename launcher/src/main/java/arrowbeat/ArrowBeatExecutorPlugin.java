package arrowbeat;

import arrowbeat.compat.SparkInternals;
import arrowbeat.compat.SparkInternals.Internal;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Starts {@code python -m spark_plugin.processes.executor} (arrowbeat's agent) on this executor and pulses it
 * so the agent can tell a frozen JVM from a live one. Never throws: Spark relaunches forever an
 * executor whose plugin init throws, so a failure is logged and the executor runs on.
 *
 * <p>An agent that exits while the executor runs (killed, crashed, or ended on purpose because it
 * gave up: it then logs the cause as its last line and exits non-zero) is reported to the driver
 * at once ({@link Protocol#executorAgentDown}: the driver lists the executor UNMONITORED with that
 * cause) besides the lost-outputs report, and started again: at most {@link #RESTARTS_MAX} starts
 * in any {@link #RESTARTS_WINDOW_MS} (a sliding window, never a cap per lifetime: a further one
 * waits until the oldest leaves the window), a failed start retried after a backoff up to {@link
 * #RESTART_BACKOFF_MAX_MS}; each delay is told to the driver. The decisions are {@link
 * Supervision}'s (the driver plugin's RM supervisor uses the same), tested on a fake clock.
 *
 * <p>An agent that runs but is wedged (its heartbeat loop blocked, the process stopped) is found
 * the way the driver plugin finds a hung RM: the agent answers each pulse from the loop that serves
 * its heartbeats ({@link Protocol#parseAlive}, {@code 0 0}); one that leaves a pulse unanswered for
 * longer than the hang bound it announced ({@code hang_ms} in its ready line: twice the heartbeat
 * timeout, at least 5 s) is killed by pid (SIGKILL), reported like an exit with the cause {@code
 * agent hung: no answer to the JVM's pulse for N ms ...}, and started again through the same rate
 * limit. A check that runs late because this JVM was paused (a GC, a SIGSTOP) judges nothing, so a
 * frozen JVM never kills a live agent once it resumes; while it is frozen it sends no pulse, and
 * the agent stops answering the RM as before.
 *
 * <p>The RM's address can change (a restarted RM that could not bind its port again): an agent
 * that cannot reach the RM says so ({@link Protocol#RM_UNREACHABLE}, at most once a second), this
 * plugin asks the driver plugin for the address now ({@link Protocol#RM_ADDRESS_QUERY}, one ask at
 * a time, off the agent's threads) and, if it moved, tells the agent ({@link Protocol#rm}) and
 * starts any later agent with it. A failed first start of the agent is retried like a restart
 * unless it cannot succeed ({@link Supervision#retriesStart}); while the driver's RM has not
 * started yet ({@code arrowbeat.rm.pending}), the agent starts once an ask returns its address.
 */
public final class ArrowBeatExecutorPlugin implements ExecutorPlugin {
  /** Spark settings that decide the layout of its shuffle files ({@code CONF_KEYS} of the shim). */
  static final String[] SHUFFLE_LAYOUT_KEYS = {
    "spark.shuffle.useOldFetchProtocol", "spark.shuffle.manager", "spark.shuffle.push.enabled"
  };

  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatExecutorPlugin.class);
  static final int RESTARTS_MAX = 5;
  static final long RESTARTS_WINDOW_MS = 5 * 60_000;
  static final long RESTART_BACKOFF_MAX_MS = 30_000;
  /** How long a kill of a hung agent waits for its end (SIGKILL: a stopped process dies too). */
  static final long KILL_WAIT_MS = 5000;
  private final AtomicInteger runningTasks = new AtomicInteger();
  /** Tasks ever started here: without one, this executor cannot hold map outputs. */
  private final AtomicInteger tasksStarted = new AtomicInteger();
  private final TaskWatch taskWatch = new TaskWatch();
  /** Hang checks of the current agent and its restarts' rate limit (pure; the restarter acts). */
  private final Supervision supervision =
      new Supervision(new Supervision.Policy(0, RESTARTS_MAX, RESTARTS_WINDOW_MS, RESTART_BACKOFF_MAX_MS));
  /** One thread checks the agent and restarts it: a hang kill and a restart never overlap. */
  private final ScheduledExecutorService restarter =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "arrowbeat-agent-restart");
            t.setDaemon(true);
            return t;
          });
  /**
   * Asks of the driver about lost outputs ({@link #reportLost}, which waits for Spark's RPC): off
   * the agent's protocol thread, which must go on reading its pulse answers, and off the restarter.
   */
  private final java.util.concurrent.ExecutorService reporter =
      Executors.newSingleThreadExecutor(
          r -> {
            Thread t = new Thread(r, "arrowbeat-agent-report");
            t.setDaemon(true);
            return t;
          });
  private volatile Sidecar sidecar;
  /** The agent whose pulses and answers the hang check times (set before its first pulse). */
  private volatile Sidecar supervised;
  /** The last agent reported down: a hung one killed and its exit seen are one report, not two. */
  private Sidecar reportedDown;
  private volatile boolean shuttingDown;
  private final Thread shutdownNotice = new Thread(() -> shuttingDown = true, "arrowbeat-agent-shutdown");
  private Thread watchReporter;
  private PluginContext ctx;
  private Map<String, String> settings;
  private PluginMetrics metrics;
  /** The RM's address as last learnt (the driver's settings, then its answers); "" while pending. */
  private volatile String rmAddress = "";
  /** Whether the hang checks and task-watch reports run (they start with the first agent). */
  private boolean wired;
  /** One ask of the driver for the RM's address at a time (Spark's RPC may wait). */
  private final java.util.concurrent.atomic.AtomicBoolean asking = new java.util.concurrent.atomic.AtomicBoolean();
  private final java.util.concurrent.ExecutorService addressAsker =
      Executors.newSingleThreadExecutor(
          r -> {
            Thread t = new Thread(r, "arrowbeat-rm-address");
            t.setDaemon(true);
            return t;
          });

  /**
   * This executor's own local directories as Spark resolved them (its block manager's folders),
   * joined with commas exactly as PySpark hands them to Python workers in SPARK_LOCAL_DIRS: agent
   * and workers find one another there, with no path computed on the driver. Empty if unknown
   * (a Spark whose internal changed: {@link SparkInternals} said so once).
   */
  static String localDirs() {
    try {
      return String.join(",", SparkInternals.executorLocalDirs().orElse(java.util.List.of()));
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: Spark's local dirs of this executor are unknown ({})", e.toString());
      return "";
    }
  }

  @Override
  public void init(PluginContext ctx, Map<String, String> extraConf) {
    try {
      String address = extraConf.get(Launch.RM_ADDRESS);
      boolean pending = "true".equals(extraConf.get(ArrowBeatDriverPlugin.RM_PENDING));
      if ((address == null || address.isEmpty()) && !pending) {
        LOG.warn("arrowbeat is off on executor {}: the driver-side process is not running",
            ctx.executorID());
        return;
      }
      rmAddress = address == null ? "" : address;
      SparkConf conf = ctx.conf();
      this.ctx = ctx;
      metrics = PluginMetrics.forExecutor(ctx.metricRegistry());
      settings = new LinkedHashMap<>(extraConf);
      // Looked up first, so the one warning about a missing internal precedes what it affects.
      settings.putAll(
          SparkInternals.unavailableSettings(Internal.EXECUTOR_LOCAL_DIRS, Internal.EXECUTOR_HOST));
      String appId = conf.get("spark.app.id", "");
      settings.put("spark.app.id", appId);
      settings.put("arrowbeat.executor.id", ctx.executorID());
      Host host = executorHost(ctx);
      settings.put("arrowbeat.executor.host", host.name());
      settings.put("arrowbeat.executor.cores", conf.get("spark.executor.cores", "1"));
      settings.put("arrowbeat.executor.jvm.pid", String.valueOf(ProcessHandle.current().pid()));
      String localDirs = localDirs();
      settings.put("arrowbeat.executor.local.dirs", localDirs);
      // What decides how Spark names this executor's shuffle files (the agent removes the status
      // blocks of a damaged map output by those names: spark_plugin/compat/shuffle_blocks.py).
      settings.put("arrowbeat.executor.spark.version", SparkInternals.sparkVersion());
      for (String key : SHUFFLE_LAYOUT_KEYS) {
        if (conf.contains(key)) {
          settings.put(key, conf.get(key));
        }
      }
      LOG.info(
          "arrowbeat executor plugin on executor {} (Spark {}): host {} (from the {}), local dirs [{}]",
          ctx.executorID(), SparkInternals.sparkVersion(), host.name(), host.source(), localDirs);
      Runtime.getRuntime().addShutdownHook(shutdownNotice); // an agent ending with its JVM is no crash
      if (rmAddress.isEmpty()) {
        LOG.warn("arrowbeat's driver-side process on the driver has not started yet; the agent of "
            + "executor {} starts once it runs", ctx.executorID());
        scheduleFirstStart();
        return;
      }
      try {
        started(launch());
      } catch (Throwable first) {
        if (!Supervision.retriesStart(first)) {
          throw first;
        }
        supervision.attempting(nowMs());
        supervision.failed(nowMs());
        LOG.error("arrowbeat agent did not start on executor {}; it is started again (rate-limited as "
            + "restarts are): {}", ctx.executorID(), first.getMessage());
        tellDriverNotStarted(ctx, first);
        scheduleFirstStart();
      }
    } catch (Throwable t) {
      LOG.error("arrowbeat agent did not start on executor {}; the executor runs on without it: {}",
          ctx.executorID(), t.getMessage());
      tellDriverNotStarted(ctx, t);
      if (sidecar != null) {
        sidecar.stop(0);
        sidecar = null;
      }
    }
  }

  /** The first agent that started: it is the one running, and the checks that follow it start. */
  private synchronized void started(Sidecar agent) {
    sidecar = agent;
    if (!wired) {
      wired = true;
      startWatchReports(Launch.pulseMs(agent.info()));
      startHangChecks(Launch.pulseMs(agent.info()));
    }
  }

  /** The next first-start attempt, when the rate limit allows (on the restarter thread). */
  private void scheduleFirstStart() {
    if (shuttingDown) {
      return;
    }
    long delayMs = Math.max(0, supervision.nextRestartAt(nowMs()) - nowMs());
    try {
      restarter.schedule(this::firstStart, delayMs, TimeUnit.MILLISECONDS);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      LOG.debug("arrowbeat agent start not scheduled: the executor is shutting down");
    }
  }

  /**
   * A retried first start: without the RM's address yet, an ask of the driver first (no attempt
   * counted while the RM is pending, only the backoff); then a start, which on failure is tried
   * again unless it cannot succeed.
   */
  private void firstStart() {
    if (shuttingDown) {
      return;
    }
    if (rmAddress.isEmpty() && askRmAddress("") == null) {
      supervision.failed(nowMs());
      scheduleFirstStart();
      return;
    }
    supervision.attempting(nowMs());
    try {
      Sidecar agent = launch();
      supervision.succeeded();
      synchronized (this) {
        if (shuttingDown) {
          agent.stop(0);
          return;
        }
        started(agent);
      }
      LOG.warn("arrowbeat agent of executor {} started (pid {}) after a failed or delayed first start",
          ctx.executorID(), agent.pid());
    } catch (Throwable t) {
      supervision.failed(nowMs());
      if (!Supervision.retriesStart(t)) {
        LOG.error("arrowbeat agent of executor {} did not start and will not be retried: {}",
            ctx.executorID(), t.getMessage());
        tellDriverNotStarted(ctx, t);
        return;
      }
      LOG.error("arrowbeat agent of executor {} did not start (retried in {} ms): {}", ctx.executorID(),
          Math.max(0, supervision.nextRestartAt(nowMs()) - nowMs()), t.getMessage());
      scheduleFirstStart();
    }
  }

  /**
   * Asks the driver plugin where the RM is now ({@link Protocol#RM_ADDRESS_QUERY}); if it moved
   * from {@code dialled}, later agents start with the new address and the running one is told.
   * The address, or null while the RM is down or the ask failed.
   */
  private String askRmAddress(String dialled) {
    Object answer;
    try {
      answer = ctx.ask(Protocol.RM_ADDRESS_QUERY);
    } catch (Exception e) {
      LOG.debug("arrowbeat could not ask the driver for the RM's address: {}", e.toString());
      return null;
    }
    String address = Protocol.address(answer);
    if (address == null) {
      return null; // the RM is down (being restarted) or has not started yet
    }
    rmAddress = address;
    if (dialled.isEmpty()) {
      LOG.info("arrowbeat's RM runs at {}: starting the agent of executor {}", address, ctx.executorID());
    } else if (!address.equals(dialled)) {
      LOG.warn("arrowbeat's RM is at {} now (the agent of executor {} dialled {}); telling the agent",
          address, ctx.executorID(), dialled);
      sendLine(Protocol.rm(address));
    }
    return address;
  }

  /** {@link #askRmAddress} off the agent's protocol thread, skipped while an ask is in flight. */
  private void askRmAddressLater(String dialled) {
    if (!asking.compareAndSet(false, true)) {
      return;
    }
    try {
      addressAsker.execute(
          () -> {
            try {
              askRmAddress(dialled);
            } finally {
              asking.set(false);
            }
          });
    } catch (java.util.concurrent.RejectedExecutionException e) {
      asking.set(false);
    }
  }

  /**
   * Starts the agent with this executor's settings and wires it: its commands, metrics, pulses,
   * and what its unexpected exit does. Throws if it does not report ready within the startup timeout.
   */
  private Sidecar launch() throws Exception {
    SparkConf conf = ctx.conf();
    settings.put(Launch.RM_ADDRESS, rmAddress); // the last one learnt (a restarted RM may have moved)
    String executorId = ctx.executorID();
    String appId = settings.getOrDefault("spark.app.id", "");
    if (appId.isEmpty() && SparkEnv.get() != null) { // a restart: the driver has assigned one since
      appId = SparkEnv.get().conf().get("spark.app.id", "");
      settings.put("spark.app.id", appId);
    }
    Sidecar agent =
        Sidecar.start(
            "agent-" + executorId,
            Launch.command(conf, "spark_plugin.processes.executor"),
            settings,
            Launch.startupTimeoutMs(conf));
    agent.onMetrics(metrics::accept); // the agent's shuffle figures, as Spark metrics
    // An agent may say three things only: its executor's map outputs are gone, it wants the
    // stack of one running task's thread, or it cannot reach the RM at an address. Anything else
    // (kill-executor included) is refused.
    agent.onCommand(
        command -> {
          if (Protocol.OUTPUTS_LOST.equals(command.verb())) {
            LOG.error("arrowbeat map outputs of executor {} are lost ({}); telling the driver, which "
                + "has Spark replace the executor so their map partitions are recomputed", executorId,
                command.argument());
            reportLostLater(executorId, command.argument());
          } else if (Protocol.RM_UNREACHABLE.equals(command.verb())) {
            askRmAddressLater(command.argument()); // did the RM move? (a restart on another port)
          } else if (Protocol.JSTACK.equals(command.verb())) {
            String stack = taskWatch.stackOf(Long.parseLong(command.argument()));
            sendLine(Protocol.stack(command.argument(), stack));
          } else {
            LOG.warn("arrowbeat agent of executor {} may not give command {}; ignored",
                executorId, command.verb());
          }
        });
    agent.onUnexpectedExit(() -> agentExited(agent));
    // Its hang bound is its own (the ready line); the restart limits stay this plugin's.
    supervision.launched(
        new Supervision.Policy(Supervision.Policy.from(agent.info()).hangMs(), RESTARTS_MAX,
            RESTARTS_WINDOW_MS, RESTART_BACKOFF_MAX_MS),
        nowMs());
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
            supervision.pulsed(nowMs());
          }
        });
    agent.startPulses(Launch.pulseMs(agent.info()), runningTasks::get);
    if (appId.isEmpty()) {
      sendAppIdWhenAssigned(agent);
    }
    return agent;
  }

  /**
   * The agent exited while this executor runs: the driver hears it at once (UNMONITORED with the
   * cause), then, as before, whether map outputs were lost with it (the driver's call: not if no
   * task ever ran here); a restart is scheduled.
   */
  private void agentExited(Sidecar dead) {
    if (shuttingDown || !claimDown(dead)) {
      return;
    }
    String executorId = ctx.executorID();
    String cause = exitCause(dead.exitCode(), dead.lastLogLine());
    LOG.error("arrowbeat agent of executor {} (pid {}) {} ({} tasks started here); telling the driver "
        + "and starting it again", executorId, dead.pid(), cause, tasksStarted.get());
    scheduleRestart(dead.pid(), cause);
    reportLost(ctx, executorId, "agent-exited");
  }

  /** True the first time {@code agent} is reported down (a hung one killed, or one that exited). */
  private synchronized boolean claimDown(Sidecar agent) {
    if (reportedDown == agent) {
      return false;
    }
    reportedDown = agent;
    return true;
  }

  private static long nowMs() {
    return System.nanoTime() / 1_000_000;
  }

  /** How often the hang check runs: every pulse interval, within 100 ms to 1 s (as the driver's). */
  static long checkMs(long pulseMs) {
    return Math.max(100, Math.min(1000, pulseMs <= 0 ? 1000 : pulseMs));
  }

  /** The hang check, on the restarter thread (so it never runs beside a restart). */
  private void startHangChecks(long pulseMs) {
    long checkMs = checkMs(pulseMs);
    restarter.scheduleWithFixedDelay(() -> checkHang(checkMs), checkMs, checkMs, TimeUnit.MILLISECONDS);
  }

  /**
   * A live agent that left a pulse unanswered for longer than its hang bound ({@link Supervision#hung};
   * never judged by a check that ran late, this JVM having been paused) is hung: SIGKILLed by pid,
   * reported to the driver with the cause as an exited one is, and started again (rate-limited).
   * An agent that exited is not this check's: its exit is reported as it happens.
   */
  private void checkHang(long checkMs) {
    try {
      Sidecar current = sidecar;
      if (shuttingDown || current == null || current != supervised || !current.isAlive()) {
        return;
      }
      long now = nowMs();
      if (!supervision.hung(now, checkMs) || !claimDown(current)) {
        return;
      }
      long silentMs = supervision.silentMs(now);
      String cause = hungCause(silentMs, supervision.policy().hangMs());
      LOG.error("arrowbeat agent of executor {} (pid {}) is hung: no answer to the pulse for {} ms ({} "
          + "tasks started here); killing it, telling the driver and starting it again",
          ctx.executorID(), current.pid(), silentMs, tasksStarted.get());
      current.kill(KILL_WAIT_MS); // no exit callback: this check reports it
      scheduleRestart(current.pid(), cause);
      reportLostLater(ctx.executorID(), "agent-hung");
    } catch (Throwable t) { // the check must outlive anything one round throws
      LOG.error("arrowbeat's hang check of the agent of executor {} failed this round: {}",
          ctx.executorID(), t.toString());
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

  /** Tells the driver when the agent starts again (the rate limit's answer), and schedules it. */
  private void scheduleRestart(long deadPid, String cause) {
    if (shuttingDown) {
      return;
    }
    long now = nowMs();
    long delayMs = Math.max(0, supervision.nextRestartAt(now) - now);
    if (delayMs > 0) {
      LOG.warn("arrowbeat agent of executor {} restarts in {} ms (at most {} starts per {} s)",
          ctx.executorID(), delayMs, RESTARTS_MAX, RESTARTS_WINDOW_MS / 1000);
    }
    tellDriver(Protocol.executorAgentDown(ctx.executorID(), deadPid, delayMs, cause));
    try {
      restarter.schedule(() -> restart(deadPid), delayMs, TimeUnit.MILLISECONDS);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      LOG.debug("arrowbeat agent restart not scheduled: the executor is shutting down");
    }
  }

  /** One restart attempt (on the restarter thread); a failed one is told and tried again later. */
  private void restart(long deadPid) {
    if (shuttingDown) {
      return;
    }
    supervision.attempting(nowMs());
    try {
      Sidecar agent = launch();
      supervision.succeeded();
      synchronized (this) {
        if (shuttingDown) {
          agent.stop(0);
          return;
        }
        sidecar = agent;
      }
      LOG.warn("arrowbeat agent of executor {} started again (pid {})", ctx.executorID(), agent.pid());
    } catch (Throwable t) {
      supervision.failed(nowMs());
      LOG.error("arrowbeat agent of executor {} did not start again: {}", ctx.executorID(), t.getMessage());
      scheduleRestart(deadPid, "agent restart failed: " + t.getMessage());
    }
  }

  /** A line to the driver plugin (Spark's RPC, one way); a failure is only logged. */
  private void tellDriver(String line) {
    try {
      ctx.send(line);
    } catch (Throwable t) {
      LOG.warn("arrowbeat could not tell the driver: {}", t.toString());
    }
  }

  /**
   * One {@link TaskWatch} line per pulse interval: the agent judges from it whether each running
   * task progresses, and what a gap in the lines was (GC, a stopped process).
   */
  private void startWatchReports(long intervalMs) {
    if (intervalMs <= 0) {
      return;
    }
    watchReporter =
        new Thread(
            () -> {
              try {
                while (!Thread.currentThread().isInterrupted()) {
                  sendLine(taskWatch.line());
                  Thread.sleep(intervalMs);
                }
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              } catch (RuntimeException e) {
                LOG.warn("arrowbeat task watch stopped: {}", e.toString());
              }
            },
            "arrowbeat-task-watch");
    watchReporter.setDaemon(true);
    watchReporter.start();
  }

  /** The driver shows this executor unmonitored at once (not after the registration bound). */
  private static void tellDriverNotStarted(PluginContext ctx, Throwable why) {
    String reason =
        why instanceof Launch.MissingInterpreterException ? "interpreter-missing" : "start-failed";
    try {
      ctx.send(Protocol.executorUnmonitored(ctx.executorID(), reason));
    } catch (Throwable t) {
      LOG.debug("arrowbeat could not tell the driver: {}", t.toString());
    }
  }

  private void sendLine(String line) {
    Sidecar agent = sidecar;
    if (agent != null) {
      agent.send(line);
    }
  }

  /**
   * This executor's arrowbeat map outputs may be gone (its agent died, or their files vanished):
   * Spark still lists them as the outputs of its map tasks, so readers would fail until their
   * retries run out. The driver-side process decides (once per executor, within a budget, not for
   * an executor that never ran a task) whether Spark replaces this executor, which makes it drop
   * everything it listed here and recompute exactly those map partitions.
   */
  private void reportLost(PluginContext ctx, String executorId, String reason) {
    boolean taken = false;
    try {
      taken = Boolean.TRUE.equals(
          ctx.ask(Protocol.executorOutputsLost(executorId, reason, tasksStarted.get())));
    } catch (Exception e) {
      LOG.error("arrowbeat could not tell the driver that executor {} lost its outputs: {}",
          executorId, e.toString());
      return;
    }
    if (!taken) {
      LOG.error("arrowbeat: the driver plugin did not take executor {}'s lost outputs (it takes none "
          + "for the driver's own executor, nor while its driver-side process is down)", executorId);
    }
  }

  /** {@link #reportLost} on the reporter thread (dropped once the executor shuts down). */
  private void reportLostLater(String executorId, String reason) {
    try {
      reporter.execute(() -> reportLost(ctx, executorId, reason));
    } catch (java.util.concurrent.RejectedExecutionException e) {
      LOG.debug("arrowbeat lost-outputs report not sent: the executor is shutting down");
    }
  }

  /** This executor's host and where it came from (the log line at start-up says which). */
  record Host(String name, String source) {}

  /**
   * The host Spark's block manager registered this executor under. Before it has an id (the
   * driver's own executor in local mode, at plugin init) PluginContext.hostname() works; on other
   * executors that throws (their RPC environment has no address), and without the block manager's
   * id (an internal missing) the last resort is what Spark itself starts from: SPARK_LOCAL_HOSTNAME,
   * SPARK_LOCAL_IP, else this machine's address.
   */
  private static Host executorHost(PluginContext ctx) {
    java.util.Optional<String> registered = SparkInternals.blockManagerHost();
    if (registered.isPresent()) {
      return new Host(registered.get(), "block manager");
    }
    try {
      return new Host(ctx.hostname(), "plugin context");
    } catch (RuntimeException e) {
      for (String variable : new String[] {"SPARK_LOCAL_HOSTNAME", "SPARK_LOCAL_IP"}) {
        String value = System.getenv(variable);
        if (value != null && !value.isEmpty()) {
          return new Host(value, variable + " variable");
        }
      }
      try {
        return new Host(java.net.InetAddress.getLocalHost().getHostAddress(), "local address");
      } catch (java.net.UnknownHostException unknown) {
        return new Host("localhost", "nothing else known");
      }
    }
  }

  /**
   * The driver's own executor (local mode) starts before the driver has an application id; tell
   * the agent as soon as the shared conf has one (before any task can run).
   */
  private static void sendAppIdWhenAssigned(Sidecar agent) {
    Thread waiter =
        new Thread(
            () -> {
              long deadline = System.currentTimeMillis() + 600_000;
              while (System.currentTimeMillis() < deadline) {
                SparkEnv env = SparkEnv.get();
                String id = env == null ? "" : env.conf().get("spark.app.id", "");
                if (!id.isEmpty()) {
                  agent.send(Protocol.app(id));
                  return;
                }
                try {
                  Thread.sleep(20);
                } catch (InterruptedException e) {
                  return;
                }
              }
            },
            "arrowbeat-app-id");
    waiter.setDaemon(true);
    waiter.start();
  }

  @Override
  public void onTaskStart() {
    tasksStarted.incrementAndGet();
    runningTasks.incrementAndGet();
    taskWatch.started();
  }

  @Override
  public void onTaskSucceeded() {
    runningTasks.decrementAndGet();
    taskWatch.ended();
  }

  @Override
  public void onTaskFailed(org.apache.spark.TaskFailedReason failureReason) {
    runningTasks.decrementAndGet();
    taskWatch.ended();
  }

  @Override
  public void shutdown() {
    Sidecar agent;
    synchronized (this) {
      shuttingDown = true;
      agent = sidecar;
      sidecar = null;
    }
    restarter.shutdownNow();
    reporter.shutdownNow();
    addressAsker.shutdownNow();
    try {
      Runtime.getRuntime().removeShutdownHook(shutdownNotice);
    } catch (IllegalStateException | IllegalArgumentException e) {
      LOG.debug("arrowbeat: the JVM is shutting down");
    }
    if (watchReporter != null) {
      watchReporter.interrupt();
    }
    if (agent != null) {
      try {
        agent.stop(Launch.STOP_GRACE_MS);
      } catch (Throwable t) {
        LOG.warn("arrowbeat agent did not stop cleanly: {}", t.toString());
      }
    }
  }
}
