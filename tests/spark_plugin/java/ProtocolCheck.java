package arrowbeat;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The JVM end of every protocol line kind, driven line by line from stdin for
 * tests/spark_plugin/test_protocol_contract.py. A request is {@code <kind>} and its arguments,
 * tab-separated, each argument hex-encoded UTF-8; the answer is one line, hex-encoded UTF-8: the
 * line {@link Protocol} formats from those raw facts (kinds the JVM writes), or what it makes of
 * the given line (kinds it reads: the parsed fields, {@code -} for a refused line; {@code metrics}
 * feeds a driver-role {@link PluginMetrics}, {@code gauge} reads one of its gauges).
 */
public final class ProtocolCheck {
  public static void main(String[] args) throws Exception {
    MetricRegistry registry = new MetricRegistry();
    PluginMetrics metrics = PluginMetrics.forDriver(registry);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String request;
    while ((request = in.readLine()) != null) {
      String[] words = request.split("\t", -1);
      List<String> a = new ArrayList<>();
      for (int i = 1; i < words.length; i++) {
        a.add(new String(HexFormat.of().parseHex(words[i]), StandardCharsets.UTF_8));
      }
      String answer = answer(words[0], a, metrics, registry);
      byte[] bytes = (answer == null ? "-" : answer).getBytes(StandardCharsets.UTF_8);
      System.out.println(HexFormat.of().formatHex(bytes));
    }
  }

  private static String answer(String kind, List<String> a, PluginMetrics metrics, MetricRegistry registry) {
    switch (kind) {
      case "kinds":
        return String.join(" ", new java.util.TreeSet<>(Protocol.KINDS));
      case "settings": {
        Map<String, String> settings = new LinkedHashMap<>();
        for (int i = 0; i + 1 < a.size(); i += 2) {
          settings.put(a.get(i), a.get(i + 1));
        }
        return Protocol.settings(settings);
      }
      case "pulse":
        return Protocol.pulse(Integer.parseInt(a.get(0)));
      case "app":
        return Protocol.app(a.get(0));
      case "rm":
        try {
          return Protocol.rm(a.get(0));
        } catch (IllegalArgumentException e) {
          return "-";
        }
      case "stop":
        return Protocol.STOP;
      case "exiting":
        return Protocol.EXITING;
      case "executor-added":
        return Protocol.executorAdded(a.get(0), a.get(1));
      case "executor-removed":
        return Protocol.executorRemoved(
            a.get(0), Boolean.parseBoolean(a.get(1)), Boolean.parseBoolean(a.get(2)), a.get(3));
      case "executor-unmonitored":
        return Protocol.executorUnmonitored(a.get(0), a.get(1));
      case "executor-agent-down":
        return Protocol.executorAgentDown(a.get(0), Long.parseLong(a.get(1)), Long.parseLong(a.get(2)), a.get(3));
      case "agent-exit-cause":
        return ArrowBeatExecutorPlugin.exitCause(Integer.parseInt(a.get(0)), a.get(1));
      case "executor-outputs-lost":
        return Protocol.executorOutputsLost(a.get(0), a.get(1), Long.parseLong(a.get(2)));
      case "executor-replacement":
        return Protocol.executorReplacement(a.get(0), Protocol.Replacement.valueOf(a.get(1)));
      case "tasks": {
        int collectors = Integer.parseInt(a.get(2));
        List<Protocol.Collector> gcs = new ArrayList<>();
        int i = 3;
        for (int n = 0; n < collectors; n++, i += 3) {
          long count = Long.parseLong(a.get(i + 1));
          gcs.add(new Protocol.Collector(a.get(i), count, Long.parseLong(a.get(i + 2))));
        }
        List<Protocol.TaskFigures> tasks = new ArrayList<>();
        for (; i + 6 < a.size(); i += 7) {
          tasks.add(new Protocol.TaskFigures(Long.parseLong(a.get(i)), Integer.parseInt(a.get(i + 1)),
              Integer.parseInt(a.get(i + 2)), Integer.parseInt(a.get(i + 3)), Integer.parseInt(a.get(i + 4)),
              Long.parseLong(a.get(i + 5)), Long.parseLong(a.get(i + 6))));
        }
        return Protocol.tasks(Long.parseLong(a.get(0)), Long.parseLong(a.get(1)), gcs, tasks);
      }
      case "stack":
        return Protocol.stack(a.get(0), a.size() > 1 ? a.get(1) : null);
      case "ready": {
        Map<String, String> info = Protocol.parseReady(a.get(0));
        return info == null ? null : new TreeMap<>(info).toString();
      }
      case "command": {
        Protocol.Command command = Protocol.parseCommand(a.get(0));
        return command == null ? null : command.toString();
      }
      case "metrics":
        return metrics.accept(a.get(0)) ? "accepted" : "refused";
      case "gauge": {
        Gauge<?> gauge = registry.getGauges().get(a.get(0));
        return gauge == null ? "absent" : String.valueOf(gauge.getValue());
      }
      case "alive": {
        Protocol.Alive alive = Protocol.parseAlive(a.get(0));
        return alive == null ? null : alive.completeUntilMs() + " " + alive.unsavedRows();
      }
      case "plugin-message":
        return Protocol.relayed(a.get(0));
      default:
        throw new IllegalArgumentException("no kind " + kind);
    }
  }
}
