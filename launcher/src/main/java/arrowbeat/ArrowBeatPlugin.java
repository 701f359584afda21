package arrowbeat;

import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * Entry point for {@code --conf spark.plugins=arrowbeat.ArrowBeatPlugin}.
 *
 * <p>The JVM side only starts, supervises and stops arrowbeat's Python processes: the driver-side
 * ResourceManager process and one agent per executor. All behaviour lives in Python.
 */
public final class ArrowBeatPlugin implements SparkPlugin {
  @Override
  public DriverPlugin driverPlugin() {
    return new ArrowBeatDriverPlugin();
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ArrowBeatExecutorPlugin();
  }
}
