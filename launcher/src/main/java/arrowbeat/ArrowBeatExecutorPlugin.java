package arrowbeat;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Starts {@code python -m spark_plugin.executor} (arrowbeat's agent) on this executor and pulses it
 * so the agent can tell a frozen JVM from a live one. Never throws: Spark relaunches forever an
 * executor whose plugin init throws, so a failure is logged and the executor runs on.
 */
public final class ArrowBeatExecutorPlugin implements ExecutorPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatExecutorPlugin.class);
  private final AtomicInteger runningTasks = new AtomicInteger();
  /** Tasks ever started here: without one, this executor cannot hold map outputs. */
  private final AtomicInteger tasksStarted = new AtomicInteger();
  private final java.util.concurrent.atomic.AtomicBoolean lostReported =
      new java.util.concurrent.atomic.AtomicBoolean();
  private Sidecar sidecar;

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
      Map<String, String> settings = new LinkedHashMap<>(extraConf);
      String appId = conf.get("spark.app.id", "");
      settings.put("spark.app.id", appId);
      settings.put("arrowbeat.executor.id", ctx.executorID());
      settings.put("arrowbeat.executor.host", executorHost(ctx));
      settings.put("arrowbeat.executor.cores", conf.get("spark.executor.cores", "1"));
      settings.put("arrowbeat.executor.jvm.pid", String.valueOf(ProcessHandle.current().pid()));
      sidecar =
          Sidecar.start(
              "agent-" + ctx.executorID(),
              Launch.command(conf, "spark_plugin.executor"),
              settings,
              Launch.startupTimeoutMs(conf));
      String executorId = ctx.executorID();
      // An agent may say one thing only: its executor's map outputs are gone. Anything else
      // (kill-executor included) is refused and logged.
      sidecar.onCommand(
          command -> {
            if (Command.OUTPUTS_LOST.equals(command.verb())) {
              reportLost(ctx, executorId, command.argument());
            } else {
              LOG.warn("arrowbeat agent of executor {} may not give command {}; ignored",
                  executorId, command.verb());
            }
          });
      sidecar.onUnexpectedExit(
          () -> {
            if (tasksStarted.get() > 0) {
              reportLost(ctx, executorId, "agent-exited");
            } else { // no task ran here, so no map output can be lost: the executor runs on
              LOG.error("arrowbeat agent of executor {} exited; no task ran here, so no map "
                  + "outputs are lost; the executor runs on without it", executorId);
            }
          });
      sidecar.startPulses(Launch.pulseMs(sidecar.info()), runningTasks::get);
      if (appId.isEmpty()) {
        sendAppIdWhenAssigned(sidecar);
      }
    } catch (Throwable t) {
      LOG.error("arrowbeat agent did not start on executor {}; the executor runs on without it: {}",
          ctx.executorID(), t.getMessage());
      if (sidecar != null) {
        sidecar.stop(0);
        sidecar = null;
      }
    }
  }

  /**
   * This executor's arrowbeat map outputs are gone (its agent died, or their files vanished): Spark
   * still lists them as the outputs of its map tasks, so readers would fail until their retries
   * run out. Asking the driver to replace this executor makes Spark drop everything it listed here
   * and recompute exactly those map partitions, as after any lost executor. Once per executor.
   */
  private void reportLost(PluginContext ctx, String executorId, String reason) {
    if (!lostReported.compareAndSet(false, true)) {
      return;
    }
    LOG.error("arrowbeat map outputs of executor {} are lost ({}); asking Spark to replace the "
        + "executor so their map partitions are recomputed", executorId, reason);
    boolean taken = false;
    try {
      taken = Boolean.TRUE.equals(ctx.ask(ArrowBeatDriverPlugin.lostMessage(executorId, reason)));
    } catch (Exception e) {
      LOG.error("arrowbeat could not tell the driver that executor {} lost its outputs: {}",
          executorId, e.toString());
    }
    if (!taken) { // refused or unreachable: a later loss may ask again
      lostReported.set(false);
    }
  }

  /**
   * PluginContext.hostname() throws on non-local executors, where the block manager knows the
   * host; on the driver's own executor (local mode) the block manager has no id yet at plugin init,
   * and hostname() works.
   */
  private static String executorHost(PluginContext ctx) {
    SparkEnv env = SparkEnv.get();
    if (env != null && env.blockManager() != null && env.blockManager().blockManagerId() != null) {
      return env.blockManager().blockManagerId().host();
    }
    return ctx.hostname();
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
                  agent.send("app " + id);
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
  }

  @Override
  public void onTaskSucceeded() {
    runningTasks.decrementAndGet();
  }

  @Override
  public void onTaskFailed(org.apache.spark.TaskFailedReason failureReason) {
    runningTasks.decrementAndGet();
  }

  @Override
  public void shutdown() {
    if (sidecar != null) {
      try {
        sidecar.stop(Launch.STOP_GRACE_MS);
      } catch (Throwable t) {
        LOG.warn("arrowbeat agent did not stop cleanly: {}", t.toString());
      }
      sidecar = null;
    }
  }
}
