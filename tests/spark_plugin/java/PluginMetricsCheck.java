package arrowbeat;

import com.codahale.metrics.MetricRegistry;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * Feeds stdin's lines to a driver-role {@link PluginMetrics} (a line {@code =name} asks for a
 * gauge's value instead) and prints one answer per line: {@code accepted}, {@code refused}, or the
 * value as the registry's gauge reads it ({@code absent} if none). For
 * tests/spark_plugin/test_plugin_metrics.py.
 */
public final class PluginMetricsCheck {
  public static void main(String[] args) throws Exception {
    MetricRegistry registry = new MetricRegistry();
    PluginMetrics metrics = PluginMetrics.forDriver(registry);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.startsWith("=")) {
        com.codahale.metrics.Gauge<?> gauge = registry.getGauges().get(line.substring(1));
        System.out.println(gauge == null ? "absent" : String.valueOf(gauge.getValue()));
      } else {
        System.out.println(metrics.accept(line) ? "accepted" : "refused");
      }
    }
  }
}
