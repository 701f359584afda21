package arrowbeat;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

/**
 * arrowbeat's figures as Dropwizard gauges in the plugin's {@code PluginContext.metricRegistry()},
 * so Spark's configured sinks show them (source {@code plugin.arrowbeat.ArrowBeatPlugin}). The
 * values come from the Python process as lines on its protocol channel (the grammar is
 * {@code spark_plugin.jvm.plugin_metrics}'s):
 *
 * <pre>ARROWBEAT-METRICS &lt;snapshot&gt; name=value name=value ...</pre>
 *
 * <p>{@link #accept} takes a line only if every part is well formed: the snapshot 1-18 digits,
 * 1-{@value #MAX_FIELDS} fields, each name one of the role's fixed names (on the driver also
 * {@code executor.<id>.heartbeatAgeMs|rttMs}), each value a decimal number; else nothing of it is
 * applied and the caller logs it (rate-limited). A gauge is registered at a name's first value.
 * When a new snapshot starts, per-executor gauges the previous snapshot did not carry are removed
 * (the executor went). A name ending in {@code AgeMs} was an age when sent: its gauge adds the
 * time since the line arrived, so it keeps growing while no line comes.
 */
final class PluginMetrics {
  static final String PREFIX = "ARROWBEAT-METRICS";
  static final int MAX_FIELDS = 64;
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
          "shuffle.streamsOpen");
  private static final Pattern SNAPSHOT = Pattern.compile("[0-9]{1,18}");
  private static final Pattern VALUE = Pattern.compile("-?[0-9]{1,18}(\\.[0-9]{1,9})?");
  private static final Pattern PER_EXECUTOR =
      Pattern.compile("executor\\.[A-Za-z0-9][A-Za-z0-9_-]{0,63}\\.(heartbeatAgeMs|rttMs)");

  /** One name's latest value, when its line arrived ({@link System#nanoTime}), in which snapshot. */
  private record Value(double value, long arrivedNanos, String snapshot) {}

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

  /**
   * The fields of {@code line} (name to value), or null unless the whole line is well formed; the
   * snapshot number is under the key {@code ""}.
   */
  Map<String, String> parse(String line) {
    if (line == null || !line.startsWith(PREFIX + " ")) {
      return null;
    }
    String[] parts = line.substring(PREFIX.length() + 1).split(" ", -1);
    if (parts.length < 2 || parts.length > MAX_FIELDS + 1 || !SNAPSHOT.matcher(parts[0]).matches()) {
      return null;
    }
    Map<String, String> fields = new HashMap<>();
    fields.put("", parts[0]);
    for (int i = 1; i < parts.length; i++) {
      int eq = parts[i].indexOf('=');
      String name = eq <= 0 ? "" : parts[i].substring(0, eq);
      String value = eq <= 0 ? "" : parts[i].substring(eq + 1);
      if (!allowed(name) || !VALUE.matcher(value).matches() || fields.put(name, value) != null) {
        return null;
      }
    }
    return fields;
  }

  /** Applies a well-formed line; false (nothing applied) for any other line. */
  synchronized boolean accept(String line) {
    Map<String, String> fields = parse(line);
    if (fields == null) {
      return false;
    }
    String number = fields.remove("");
    if (!number.equals(snapshot)) {
      String finished = snapshot;
      values.keySet().removeIf(name -> dropped(name, finished));
      snapshot = number;
    }
    long now = System.nanoTime();
    for (Map.Entry<String, String> field : fields.entrySet()) {
      String name = field.getKey();
      if (!values.containsKey(name) && registry.getMetrics().size() >= MAX_GAUGES) {
        continue;
      }
      boolean fresh = values.put(name, new Value(Double.parseDouble(field.getValue()), now, number)) == null;
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
    if (name.endsWith("AgeMs")) {
      return value.value() + (System.nanoTime() - value.arrivedNanos()) / 1_000_000.0;
    }
    return value.value();
  }
}
