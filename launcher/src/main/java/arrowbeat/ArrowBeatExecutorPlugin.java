package arrowbeat;

import arrowbeat.compat.SparkInternals;
import arrowbeat.compat.SparkInternals.Internal;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
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
 * <p>This class keeps Spark's callbacks and the wiring only: what Spark tells the agent (its
 * settings, local dirs, host, task hooks), Spark's RPC to the driver plugin, and the agent's
 * launch. The agent's first start, hang checks, restarts and their rate limit are {@link
 * AgentSupervisor}'s; what the agent may ask of the JVM is {@link AgentCommands}'s; where the RM
 * is now (a restarted RM may have moved) is {@link RmAddress}'s: plain classes, tested by JUnit
 * on fake clocks. While the driver's RM has not started yet ({@code arrowbeat.rm.pending}), the
 * agent starts once an ask of the driver returns its address.
 */
public final class ArrowBeatExecutorPlugin implements ExecutorPlugin {
  /** Spark settings that decide the layout of its shuffle files ({@code CONF_KEYS} of the shim). */
  static final String[] SHUFFLE_LAYOUT_KEYS = {
    "spark.shuffle.useOldFetchProtocol", "spark.shuffle.manager", "spark.shuffle.push.enabled"
  };

  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatExecutorPlugin.class);
  private final AtomicInteger runningTasks = new AtomicInteger();
  /** Tasks ever started here: without one, this executor cannot hold map outputs. */
  private final AtomicInteger tasksStarted = new AtomicInteger();
  private final TaskWatch taskWatch = new TaskWatch();
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
  private final ExecutorService reporter = daemonThread("arrowbeat-agent-report");
  /** One ask of the driver for the RM's address at a time (Spark's RPC may wait). */
  private final ExecutorService addressAsker = daemonThread("arrowbeat-rm-address");
  /** At the JVM's shutdown: an agent ending with its JVM is no crash (no restart, no report). */
  private final Thread shutdownNotice =
      new Thread(
          () -> {
            AgentSupervisor current = this.supervisor;
            if (current != null) {
              current.shuttingDown();
            }
          },
          "arrowbeat-agent-shutdown");
  private Thread watchReporter;
  private PluginContext ctx;
  private Map<String, String> settings;
  private PluginMetrics metrics;
  /** The RM's address as last learnt (the driver's settings, then its answers). */
  private RmAddress rmAddress;
  /** The agent's starts, hang checks and restarts; null while arrowbeat is off here. */
  private volatile AgentSupervisor supervisor;

  private static ExecutorService daemonThread(String name) {
    return Executors.newSingleThreadExecutor(
        r -> {
          Thread t = new Thread(r, name);
          t.setDaemon(true);
          return t;
        });
  }

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
      SparkConf conf = ctx.conf();
      this.ctx = ctx;
      String executorId = ctx.executorID();
      rmAddress = new RmAddress(executorId, address, ctx::ask, addressAsker, this::sendLine);
      metrics = PluginMetrics.forExecutor(ctx.metricRegistry());
      settings = new LinkedHashMap<>(extraConf);
      // Looked up first, so the one warning about a missing internal precedes what it affects.
      settings.putAll(
          SparkInternals.unavailableSettings(Internal.EXECUTOR_LOCAL_DIRS, Internal.EXECUTOR_HOST));
      String appId = conf.get("spark.app.id", "");
      settings.put("spark.app.id", appId);
      settings.put("arrowbeat.executor.id", executorId);
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
          executorId, SparkInternals.sparkVersion(), host.name(), host.source(), localDirs);
      supervisor =
          new AgentSupervisor(executorId, agentPlugin(), Clock.SYSTEM, Scheduler.of(restarter),
              runningTasks::get, tasksStarted::get);
      Runtime.getRuntime().addShutdownHook(shutdownNotice); // an agent ending with its JVM is no crash
      supervisor.start();
    } catch (Throwable t) {
      LOG.error("arrowbeat agent did not start on executor {}; the executor runs on without it: {}",
          ctx.executorID(), t.getMessage());
      tellDriverNotStarted(ctx, t);
      if (supervisor != null) {
        supervisor.abandon();
      }
    }
  }

  /** What {@link AgentSupervisor} needs of Spark and of this plugin. */
  private AgentSupervisor.Plugin agentPlugin() {
    return new AgentSupervisor.Plugin() {
      @Override
      public Supervised launch() throws Exception {
        return ArrowBeatExecutorPlugin.this.launch();
      }

      @Override
      public boolean rmKnown() {
        return rmAddress.known();
      }

      @Override
      public String askRmAddress() {
        return rmAddress.ask("");
      }

      @Override
      public void tellDriver(String line) {
        ArrowBeatExecutorPlugin.this.tellDriver(line);
      }

      @Override
      public void reportLost(String reason) {
        ArrowBeatExecutorPlugin.this.reportLost(ctx, ctx.executorID(), reason);
      }

      @Override
      public void reportLostLater(String reason) {
        ArrowBeatExecutorPlugin.this.reportLostLater(ctx.executorID(), reason);
      }

      @Override
      public void notStarted(Throwable why) {
        tellDriverNotStarted(ctx, why);
      }

      @Override
      public void firstStarted(Supervised agent) {
        startWatchReports(Launch.pulseMs(agent.info()));
      }
    };
  }

  /**
   * Starts the agent with this executor's settings and the RM's address last learnt, its commands
   * and metrics wired ({@link AgentSupervisor} wires its pulses and exit). Throws if it does not
   * report ready within the startup timeout.
   */
  private Sidecar launch() throws Exception {
    SparkConf conf = ctx.conf();
    settings.put(Launch.RM_ADDRESS, rmAddress.current()); // a restarted RM may have moved
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
    agent.onCommand(
        new AgentCommands(
            executorId,
            new AgentCommands.Actions() {
              @Override
              public void outputsLost(String reason) {
                reportLostLater(executorId, reason);
              }

              @Override
              public void rmUnreachable(String dialled) {
                rmAddress.askLater(dialled);
              }

              @Override
              public String stackOf(long taskId) {
                return taskWatch.stackOf(taskId);
              }

              @Override
              public void send(String line) {
                sendLine(line);
              }
            }));
    if (appId.isEmpty()) {
      sendAppIdWhenAssigned(agent);
    }
    return agent;
  }

  /** Why an agent ended ({@link AgentSupervisor#exitCause}; ProtocolCheck.java calls it here). */
  static String exitCause(int code, String lastLine) {
    return AgentSupervisor.exitCause(code, lastLine);
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
    AgentSupervisor current = supervisor;
    if (current != null) {
      current.send(line);
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
    } catch (RejectedExecutionException e) {
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
    AgentSupervisor current = supervisor;
    Supervised agent = current == null ? null : current.shutdown();
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
