package arrowbeat;

import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Starts {@code python -m spark_plugin.driver} (arrowbeat's ResourceManager) and publishes its
 * address and the application's secret to every executor through the map {@link #init} returns.
 * Never throws: a failure is logged and the application runs on without arrowbeat.
 */
public final class ArrowBeatDriverPlugin implements DriverPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatDriverPlugin.class);
  private Sidecar sidecar;

  @Override
  public Map<String, String> init(SparkContext sc, PluginContext ctx) {
    Map<String, String> executorSettings = new HashMap<>();
    try {
      SparkConf conf = ctx.conf();
      Map<String, String> settings = Launch.settings(conf);
      settings.put("spark.driver.host", conf.get("spark.driver.host", ""));
      String secret = settings.get(Launch.SECRET);
      if (secret == null || secret.isEmpty()) {
        secret = Launch.newSecret();
        settings.put(Launch.SECRET, secret);
      }
      sidecar =
          Sidecar.start(
              "driver",
              Launch.command(conf, "spark_plugin.driver"),
              settings,
              Launch.startupTimeoutMs(conf));
      sidecar.startPulses(Launch.pulseMs(sidecar.info()), () -> 0);
      String address = sidecar.info().get("address");
      conf.set(Launch.RM_ADDRESS, address);
      conf.set("spark.arrowbeat.driver.pid", String.valueOf(sidecar.pid()));
      executorSettings.putAll(settings);
      executorSettings.put(Launch.RM_ADDRESS, address);
    } catch (Throwable t) {
      LOG.error("arrowbeat is off for this application: the driver-side process did not start: {}",
          t.getMessage());
      if (sidecar != null) {
        sidecar.stop(0);
        sidecar = null;
      }
    }
    return executorSettings;
  }

  @Override
  public void shutdown() {
    if (sidecar != null) {
      try {
        sidecar.stop(Launch.STOP_GRACE_MS);
      } catch (Throwable t) {
        LOG.warn("arrowbeat driver-side process did not stop cleanly: {}", t.toString());
      }
      sidecar = null;
    }
  }
}
