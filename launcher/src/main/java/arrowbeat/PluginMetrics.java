package arrowbeat;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

/**
 * arrowbeat's figures as Dropwizard gauges in the plugin's {@code PluginContext.metricRegistry()},
 * so Spark's configured sinks show them (source {@code plugin.arrowbeat.ArrowBeatPlugin}). The
 * values come from the Python process as {@code ARROWBEAT-METRICS} lines on its protocol channel
 * ({@link Protocol#parseMetrics}; the figures are {@code spark_plugin.jvm.plugin_metrics}'s).
 *
 * <p>{@link #accept} takes a line only if it is well formed and each name is one of the role's
 * fixed names (on the driver also {@code executor.<id>.heartbeatAgeMs|rttMs}); else nothing of it
 * is applied and the caller logs it (rate-limited). A gauge is registered at a name's first value.
 * When a new snapshot starts, per-executor gauges the previous snapshot did not carry are removed
 * (the executor went). A value the line marks as an age grows by the time since the line arrived,
 * read on this JVM's clock, so it keeps growing while no line comes (which figures are ages is the
 * Python side's choice).
 */
final class PluginMetrics {
  /** Gauges at most (fixed and per-executor): a runaway child cannot grow the registry. */
  static final int MAX_GAUGES = 4096;
  /** The JVM's own gauge: ms since the last accepted line (a stalled Python process shows here). */
  static final String LINE_AGE = "metricsLineAgeMs";

  static final Set<String> DRIVER =
      Set.of(
          "executors.running",
          "executors.timedOut",
          "executors.unreachable",
          "executors.unmonitored",
          "events.heartbeatTimeout",
          "events.unreachable",
          "events.reregistered",
          "events.shuffleCorrupt",
          "executors.degraded",
          "events.degraded",
          "events.recovered",
          "history.rowsBuffered",
          "history.rowsDropped",
          "history.commitFailures");
  static final Set<String> EXECUTOR =
      Set.of(
          "shuffle.poolUsedBytes",
          "shuffle.bytesServed",
          "shuffle.poolWaitMs",
          "shuffle.creditWaitMs",
          "shuffle.spillBytes",
          "shuffle.diskBytes",
          "shuffle.streamsOpen",
          "shuffle.corruptOutputs");
  private static final Pattern PER_EXECUTOR =
      Pattern.compile("executor\\.[A-Za-z0-9][A-Za-z0-9_-]{0,63}\\.(heartbeatAgeMs|rttMs)");

  /** A name's latest value, whether an age, when its line arrived ({@link System#nanoTime}), its snapshot. */
  private record Value(double value, boolean age, long arrivedNanos, String snapshot) {}

  private final MetricRegistry registry;
  private final Set<String> fixed;
  private final boolean perExecutor;
  private final Map<String, Value> values = new ConcurrentHashMap<>();
  private volatile long lastLineNanos = System.nanoTime();
  private String snapshot = "";

  private PluginMetrics(MetricRegistry registry, Set<String> fixed, boolean perExecutor) {
    this.registry = registry;
    this.fixed = fixed;
    this.perExecutor = perExecutor;
    // Registered at once: Spark adds the plugin's source only if its registry is not empty then.
    registry.register(LINE_AGE, (Gauge<Long>) () -> (System.nanoTime() - lastLineNanos) / 1_000_000L);
  }

  static PluginMetrics forDriver(MetricRegistry registry) {
    return new PluginMetrics(registry, DRIVER, true);
  }

  static PluginMetrics forExecutor(MetricRegistry registry) {
    return new PluginMetrics(registry, EXECUTOR, false);
  }

  boolean allowed(String name) {
    return fixed.contains(name) || (perExecutor && PER_EXECUTOR.matcher(name).matches());
  }

  /** Applies a well-formed line; false (nothing applied) for any other line. */
  synchronized boolean accept(String line) {
    Protocol.MetricsLine parsed = Protocol.parseMetrics(line, this::allowed);
    if (parsed == null) {
      return false;
    }
    String number = parsed.snapshot();
    if (!number.equals(snapshot)) {
      String finished = snapshot;
      values.keySet().removeIf(name -> dropped(name, finished));
      snapshot = number;
    }
    long now = System.nanoTime();
    for (Map.Entry<String, Protocol.Metric> field : parsed.fields().entrySet()) {
      String name = field.getKey();
      if (!values.containsKey(name) && registry.getMetrics().size() >= MAX_GAUGES) {
        continue;
      }
      Protocol.Metric metric = field.getValue();
      boolean fresh = values.put(name, new Value(metric.value(), metric.age(), now, number)) == null;
      if (fresh && !registry.getMetrics().containsKey(name)) {
        registry.register(name, (Gauge<Double>) () -> read(name));
      }
    }
    lastLineNanos = now;
    return true;
  }

  /** A per-executor gauge the snapshot {@code finished} did not carry: removed with its value. */
  private boolean dropped(String name, String finished) {
    Value value = values.get(name);
    if (fixed.contains(name) || value == null || value.snapshot().equals(finished)) {
      return false;
    }
    registry.remove(name);
    return true;
  }

  /** A gauge's value: the latest, plus the time since it arrived for an age; NaN once removed. */
  private Double read(String name) {
    Value value = values.get(name);
    if (value == null) {
      return Double.NaN;
    }
    if (value.age()) {
      return value.value() + (System.nanoTime() - value.arrivedNanos()) / 1_000_000.0;
    }
    return value.value();
  }
}
