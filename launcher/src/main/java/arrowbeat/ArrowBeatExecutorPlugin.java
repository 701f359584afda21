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
      settings.put("spark.app.id", conf.get("spark.app.id", ""));
      settings.put("arrowbeat.executor.id", ctx.executorID());
      // PluginContext.hostname() throws on non-local executors; the block manager knows the host.
      settings.put("arrowbeat.executor.host", SparkEnv.get().blockManager().blockManagerId().host());
      settings.put("arrowbeat.executor.cores", conf.get("spark.executor.cores", "1"));
      settings.put("arrowbeat.executor.jvm.pid", String.valueOf(ProcessHandle.current().pid()));
      sidecar =
          Sidecar.start(
              "agent-" + ctx.executorID(),
              Launch.command(conf, "spark_plugin.executor"),
              settings,
              Launch.startupTimeoutMs(conf));
      sidecar.startPulses(Launch.pulseMs(sidecar.info()), runningTasks::get);
    } catch (Throwable t) {
      LOG.error("arrowbeat agent did not start on executor {}; the executor runs on without it: {}",
          ctx.executorID(), t.getMessage());
      if (sidecar != null) {
        sidecar.stop(0);
        sidecar = null;
      }
    }
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
