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
 */
public final class ArrowBeatExecutorPlugin implements ExecutorPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatExecutorPlugin.class);
  static final int RESTARTS_MAX = 5;
  static final long RESTARTS_WINDOW_MS = 5 * 60_000;
  static final long RESTART_BACKOFF_MAX_MS = 30_000;
  private final AtomicInteger runningTasks = new AtomicInteger();
  /** Tasks ever started here: without one, this executor cannot hold map outputs. */
  private final AtomicInteger tasksStarted = new AtomicInteger();
  private final TaskWatch taskWatch = new TaskWatch();
  private final Supervision restarts =
      new Supervision(new Supervision.Policy(0, RESTARTS_MAX, RESTARTS_WINDOW_MS, RESTART_BACKOFF_MAX_MS));
  private final ScheduledExecutorService restarter =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "arrowbeat-agent-restart");
            t.setDaemon(true);
            return t;
          });
  private volatile Sidecar sidecar;
  private volatile boolean shuttingDown;
  private final Thread shutdownNotice = new Thread(() -> shuttingDown = true, "arrowbeat-agent-shutdown");
  private Thread watchReporter;
  private PluginContext ctx;
  private Map<String, String> settings;
  private PluginMetrics metrics;

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
      if (address == null || address.isEmpty()) {
        LOG.warn("arrowbeat is off on executor {}: the driver-side process is not running",
            ctx.executorID());
        return;
      }
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
      LOG.info(
          "arrowbeat executor plugin on executor {} (Spark {}): host {} (from the {}), local dirs [{}]",
          ctx.executorID(), SparkInternals.sparkVersion(), host.name(), host.source(), localDirs);
      sidecar = launch();
      startWatchReports(Launch.pulseMs(sidecar.info()));
      Runtime.getRuntime().addShutdownHook(shutdownNotice); // an agent ending with its JVM is no crash
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

  /**
   * Starts the agent with this executor's settings and wires it: its commands, metrics, pulses,
   * and what its unexpected exit does. Throws if it does not report ready within the startup timeout.
   */
  private Sidecar launch() throws Exception {
    SparkConf conf = ctx.conf();
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
    // An agent may say two things only: its executor's map outputs are gone, or it wants the
    // stack of one running task's thread. Anything else (kill-executor included) is refused.
    agent.onCommand(
        command -> {
          if (Protocol.OUTPUTS_LOST.equals(command.verb())) {
            LOG.error("arrowbeat map outputs of executor {} are lost ({}); telling the driver, which "
                + "has Spark replace the executor so their map partitions are recomputed", executorId,
                command.argument());
            reportLost(ctx, executorId, command.argument());
          } else if (Protocol.JSTACK.equals(command.verb())) {
            String stack = taskWatch.stackOf(Long.parseLong(command.argument()));
            sendLine(Protocol.stack(command.argument(), stack));
          } else {
            LOG.warn("arrowbeat agent of executor {} may not give command {}; ignored",
                executorId, command.verb());
          }
        });
    agent.onUnexpectedExit(() -> agentExited(agent));
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
    if (shuttingDown) {
      return;
    }
    String executorId = ctx.executorID();
    String cause = exitCause(dead.exitCode(), dead.lastLogLine());
    LOG.error("arrowbeat agent of executor {} (pid {}) {} ({} tasks started here); telling the driver "
        + "and starting it again", executorId, dead.pid(), cause, tasksStarted.get());
    scheduleRestart(dead.pid(), cause);
    reportLost(ctx, executorId, "agent-exited");
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
    long now = System.nanoTime() / 1_000_000;
    long delayMs = Math.max(0, restarts.nextRestartAt(now) - now);
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
    restarts.attempting(System.nanoTime() / 1_000_000);
    try {
      Sidecar agent = launch();
      restarts.succeeded();
      synchronized (this) {
        if (shuttingDown) {
          agent.stop(0);
          return;
        }
        sidecar = agent;
      }
      LOG.warn("arrowbeat agent of executor {} started again (pid {})", ctx.executorID(), agent.pid());
    } catch (Throwable t) {
      restarts.failed(System.nanoTime() / 1_000_000);
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
