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
      // No onCommand handler: an agent may give no command, so the Sidecar refuses every one.
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
