package arrowbeat;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Predicate;
import java.util.regex.Pattern;

/**
 * Every line of the JVM &lt;-&gt; Python protocol, declared once on the JVM side (the Python side is
 * {@code spark_plugin.jvm.protocol}; {@code tests/spark_plugin/test_protocol_contract.py} runs the
 * two against each other for every line kind). Formatters take raw facts; parsers return null for
 * anything not exactly of the grammar, which the caller logs (rate-limited) and ignores.
 *
 * <p>To the child, on its stdin: the settings block, then {@code p <running tasks>}, {@code app
 * <id>}, {@code stop}, {@code exiting}; to an agent {@code rm <host:port>}, the RM's address when
 * it moved (a restarted RM that could not bind its port again); on the driver Spark's view of its executors ({@code
 * executor-...}); on an executor its running tasks ({@code tasks ...}) and a task thread's stack
 * ({@code stack ...}). From the child, on its stdout: {@code ARROWBEAT-READY}, {@code
 * ARROWBEAT-CMD} and {@code ARROWBEAT-METRICS} lines, and from the driver-side process {@code
 * ARROWBEAT-ALIVE}, its answer to each pulse. Between the plugins (Spark's RPC): an
 * executor's lost outputs and an agent that did not start, as the lines the driver plugin relays,
 * and an executor plugin's ask for the RM's address now ({@link #RM_ADDRESS_QUERY}).
 */
final class Protocol {
  private Protocol() {}

  static final Pattern EXECUTOR_ID = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,63}");
  static final Pattern REASON = Pattern.compile("[a-z][a-z-]{0,31}");
  static final Pattern TASK_ID = Pattern.compile("[0-9]{1,18}");
  /** A host as the driver-side process accepts it. */
  static final Pattern HOST = Pattern.compile("[A-Za-z0-9._:%\\[\\]-]{1,253}");
  static final int MAX_COMMAND_CHARS = 256;
  /** {@code host:port} as the driver-side process announces it (and spark.arrowbeat.rm.address). */
  static final Pattern ADDRESS = Pattern.compile("[A-Za-z0-9.\\-\\[\\]:]{1,253}:[0-9]{1,5}");

  // ---- to the child (its stdin) ---------------------------------------------------------------

  static final String STOP = "stop";
  static final String EXITING = "exiting";

  /** The settings as {@code key<TAB>value} lines closed by an empty line. */
  static String settings(Map<String, String> settings) {
    StringBuilder out = new StringBuilder();
    for (Map.Entry<String, String> e : settings.entrySet()) {
      out.append(escape(e.getKey())).append('\t').append(escape(e.getValue())).append('\n');
    }
    return out.append('\n').toString();
  }

  /** One line of text for the child: backslash, newline and tab escaped (its unescape_line). */
  static String escape(String s) {
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t");
  }

  /** The pulse that proves this JVM runs, with its running tasks. */
  static String pulse(int runningTasks) {
    return "p " + runningTasks;
  }

  static String app(String appId) {
    return "app " + appId;
  }

  /**
   * {@code rm <host:port>}: to an agent, where the RM is now (it was restarted on another port);
   * the agent registers there. Throws for anything not an {@link #ADDRESS}.
   */
  static String rm(String address) {
    if (address == null || !ADDRESS.matcher(address).matches()) {
      throw new IllegalArgumentException("not an RM address");
    }
    return "rm " + address;
  }

  /** Spark registered an executor ({@code host} already checked against {@link #HOST}). */
  static String executorAdded(String executorId, String host) {
    return "executor-added " + executorId + " " + host;
  }

  /** Spark's loss reason is free text: at most this much of it is forwarded. */
  static final int MAX_REASON_CHARS = 400;

  /**
   * Spark removed an executor: {@code facts} is what the JVM saw beyond Spark's text, {@code
   * replaced} (arrowbeat had asked Spark to kill and replace it) and {@code app-end} (the
   * application had begun to stop), comma-separated, or {@code spark} for neither; the reason is
   * Spark's, made {@link #printable} and cut.
   */
  static String executorRemoved(String executorId, boolean replaced, boolean appEnding, String reason) {
    String facts =
        replaced && appEnding ? "replaced,app-end" : replaced ? "replaced" : appEnding ? "app-end" : "spark";
    return "executor-removed " + executorId + " " + facts + " " + printable(reason, MAX_REASON_CHARS);
  }

  /** An executor's plugin said its agent did not start ({@code reason} a {@link #REASON}). */
  static String executorUnmonitored(String executorId, String reason) {
    return "executor-unmonitored " + executorId + " " + reason;
  }

  /** Longest cause an {@link #executorAgentDown} line carries (then cut by {@link #printable}). */
  static final int MAX_AGENT_DOWN_CAUSE_CHARS = 160;

  /**
   * An executor's plugin saw its agent process {@code pid} exit (or a restart of it fail) and starts
   * it again in {@code restartInMs} (0: now); {@code cause} (its exit and last log line, or why the
   * restart failed) made {@link #printable} and cut, {@code -} if empty.
   */
  static String executorAgentDown(String executorId, long pid, long restartInMs, String cause) {
    String text = cause == null || cause.isEmpty() ? "-" : cause;
    return "executor-agent-down " + executorId + " " + Math.max(0, pid) + " " + Math.max(0, restartInMs)
        + " " + printable(text, MAX_AGENT_DOWN_CAUSE_CHARS);
  }

  /** An executor's plugin said its map outputs are lost, and how many tasks it ever started. */
  static String executorOutputsLost(String executorId, String reason, long tasksStarted) {
    return "executor-outputs-lost " + executorId + " " + reason + " " + tasksStarted;
  }

  /** What became of a {@code kill-executor} command: one of {@link Replacement}'s tokens. */
  static String executorReplacement(String executorId, Replacement outcome) {
    return "executor-replacement " + executorId + " " + outcome.token;
  }

  /** What became of a request to replace an executor, as the child gets it. */
  enum Replacement {
    ACCEPTED("accepted"),
    REFUSED("refused"),
    UNAVAILABLE("unavailable");

    final String token;

    Replacement(String token) {
      this.token = token;
    }
  }

  /** A collector's totals as its MXBean gives them. */
  record Collector(String name, long count, long ms) {}

  /** A running task's figures: ids, its thread's CPU time (-1 unknown), how long it has run. */
  record TaskFigures(
      long taskId, int stage, int stageAttempt, int partition, int attempt, long cpuMs, long runningMs) {}

  /**
   * {@code tasks <process cpu ms> <jvm clock ms> <collectors> [<task>:<stage>:<stage attempt>:
   * <partition>:<attempt>:<thread cpu ms>:<running ms> ...]}: {@code <collectors>} is {@code -} or
   * {@code <name>:<count>:<ms>} per collector, comma-separated, each name {@link #percentEncoded}.
   * Every collector is listed: which of them stop the application is the child's judgement.
   */
  static String tasks(
      long processCpuMs, long jvmClockMs, List<Collector> collectors, List<TaskFigures> tasks) {
    StringBuilder line =
        new StringBuilder("tasks ").append(processCpuMs).append(' ').append(jvmClockMs).append(' ');
    if (collectors.isEmpty()) {
      line.append('-');
    }
    for (int i = 0; i < collectors.size(); i++) {
      Collector gc = collectors.get(i);
      line.append(i == 0 ? "" : ",").append(percentEncoded(gc.name())).append(':').append(gc.count())
          .append(':').append(gc.ms());
    }
    for (TaskFigures task : tasks) {
      line.append(' ').append(task.taskId()).append(':').append(task.stage()).append(':')
          .append(task.stageAttempt()).append(':').append(task.partition()).append(':')
          .append(task.attempt()).append(':').append(task.cpuMs()).append(':').append(task.runningMs());
    }
    return line.toString();
  }

  /** {@code text} with every character outside {@code [A-Za-z0-9._-]} as {@code %XX} of its UTF-8. */
  static String percentEncoded(String text) {
    StringBuilder out = new StringBuilder();
    for (byte b : text.getBytes(java.nio.charset.StandardCharsets.UTF_8)) {
      char c = (char) (b & 0xff);
      boolean plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
          || c == '.' || c == '_' || c == '-';
      out.append(plain ? String.valueOf(c) : String.format("%%%02X", b & 0xff));
    }
    return out.toString();
  }

  /** The stack of task {@code taskId}'s thread ({@link #escape}d), or {@code -} if it is not running. */
  static String stack(String taskId, String stack) {
    return "stack " + taskId + " " + (stack == null ? "-" : escape(stack));
  }

  /**
   * {@code text} as printable ASCII on one line: any other character becomes a backslash-u escape;
   * cut to {@code maxChars} (and marked so). The driver-side process escapes it again all the same.
   */
  static String printable(String text, int maxChars) {
    StringBuilder out = new StringBuilder();
    String value = text == null ? "" : text;
    for (int i = 0; i < value.length() && out.length() < maxChars; i++) {
      char c = value.charAt(i);
      out.append(c >= 0x20 && c < 0x7f ? String.valueOf(c) : String.format("\\u%04x", (int) c));
    }
    if (out.length() >= maxChars) {
      out.setLength(maxChars);
      out.append("...(cut)");
    }
    return out.toString();
  }

  // ---- from the child (its stdout) ------------------------------------------------------------

  static final String READY = "ARROWBEAT-READY";
  private static final int MAX_READY_FIELDS = 16;
  private static final Pattern READY_KEY = Pattern.compile("[a-z_]{1,32}");
  private static final Pattern READY_VALUE = Pattern.compile("[\\x21-\\x7e]{1,256}");
  /** The ready fields that carry DER as base64: a generated TLS certificate and its key. */
  static final String READY_SSL_CERT = "ssl_cert";
  static final String READY_SSL_KEY = "ssl_key_secret";
  private static final Pattern READY_BASE64 = Pattern.compile("[A-Za-z0-9+/=]{1,1024}");

  /**
   * {@code ARROWBEAT-READY k=v ...}: at most 16 fields, keys {@code [a-z_]}, values visible ASCII
   * without spaces, each bounded; null for anything else.
   */
  static Map<String, String> parseReady(String line) {
    if (line == null || !line.startsWith(READY + " ")) {
      return null;
    }
    String[] parts = line.substring(READY.length() + 1).split(" ", -1);
    if (parts.length > MAX_READY_FIELDS) {
      return null;
    }
    Map<String, String> info = new HashMap<>();
    for (String part : parts) {
      int eq = part.indexOf('=');
      String key = eq <= 0 ? "" : part.substring(0, eq);
      boolean base64 = READY_SSL_CERT.equals(key) || READY_SSL_KEY.equals(key);
      if (eq <= 0
          || !READY_KEY.matcher(key).matches()
          || !(base64 ? READY_BASE64 : READY_VALUE).matcher(part.substring(eq + 1)).matches()) {
        return null;
      }
      info.put(key, part.substring(eq + 1));
    }
    return info;
  }

  static final String COMMAND = "ARROWBEAT-CMD";
  static final String KILL_EXECUTOR = "kill-executor";
  /** A kill for an executor whose heartbeats timed out: Spark is also told it is lost. */
  static final String LOST_EXECUTOR = "lost-executor";
  /**
   * An executor slower than its peers ({@code spark.arrowbeat.onDegraded=exclude}, where {@code
   * spark.decommission.enabled} is on): Spark decommissions it, else kills and replaces it.
   */
  static final String DECOMMISSION_EXECUTOR = "decommission-executor";
  static final String OUTPUTS_LOST = "outputs-lost";
  static final String JSTACK = "jstack";
  static final String KILL_TASK = "kill-task";
  /** From an agent: it cannot reach the RM at the address given (is there a newer one?). */
  static final String RM_UNREACHABLE = "rm-unreachable";

  /** One command from a child: a known verb and its argument, already of the expected shape. */
  record Command(String verb, String argument) {
    @Override
    public String toString() {
      return verb + " " + argument;
    }
  }

  /**
   * {@code ARROWBEAT-CMD kill-executor <executor id>}, {@code ARROWBEAT-CMD lost-executor
   * <executor id>} and {@code ARROWBEAT-CMD decommission-executor <executor id>} (from the
   * driver-side process only), the id an {@link #EXECUTOR_ID}, never
   * Spark's {@code driver}; {@code ARROWBEAT-CMD outputs-lost <reason>}
   * (from an agent only, about its own executor), a {@link #REASON}; {@code ARROWBEAT-CMD jstack
   * <task>} (from an agent) and {@code ARROWBEAT-CMD kill-task <task>} (from the driver-side
   * process), a {@link #TASK_ID}; {@code ARROWBEAT-CMD rm-unreachable <host:port>} (from an agent),
   * an {@link #ADDRESS}. Null unless the line is exactly one well-formed command.
   */
  static Command parseCommand(String line) {
    if (commandError(line) != null) {
      return null;
    }
    String[] words = line.split(" ", -1);
    return new Command(words[1], words[2]);
  }

  /**
   * Why {@code line} is not a command {@link #parseCommand} takes, in a few words for the log (it
   * names a known verb, never the line's own text: the caller shows a redacted excerpt of that);
   * null if it is one.
   */
  static String commandError(String line) {
    if (line == null) {
      return "no line";
    }
    if (line.length() > MAX_COMMAND_CHARS) {
      return "longer than " + MAX_COMMAND_CHARS + " characters";
    }
    String[] words = line.split(" ", -1);
    if (!words[0].equals(COMMAND)) {
      return "it does not start with " + COMMAND;
    }
    if (words.length != 3) {
      return "not one verb and one argument after " + COMMAND;
    }
    String verb = words[1];
    String argument = words[2];
    String expected;
    if (verb.equals(KILL_EXECUTOR) || verb.equals(LOST_EXECUTOR) || verb.equals(DECOMMISSION_EXECUTOR)) {
      expected = isExecutor(argument) ? null : "an executor id (other than driver)";
    } else if (verb.equals(OUTPUTS_LOST)) {
      expected = REASON.matcher(argument).matches() ? null : "a reason ([a-z-], at most 32 characters)";
    } else if (verb.equals(JSTACK) || verb.equals(KILL_TASK)) {
      expected = TASK_ID.matcher(argument).matches() ? null : "a task attempt id (1 to 18 digits)";
    } else if (verb.equals(RM_UNREACHABLE)) {
      expected = ADDRESS.matcher(argument).matches() ? null : "an address host:port";
    } else {
      return "unknown verb";
    }
    return expected == null ? null : "the argument of " + verb + " is not " + expected;
  }

  /** An executor id of Spark's form, other than the driver's. */
  static boolean isExecutor(String id) {
    return id != null && EXECUTOR_ID.matcher(id).matches() && !id.equals("driver");
  }

  static final String METRICS = "ARROWBEAT-METRICS";
  static final int MAX_METRICS_FIELDS = 64;
  private static final Pattern SNAPSHOT = Pattern.compile("[0-9]{1,18}");
  private static final Pattern METRIC_VALUE = Pattern.compile("-?[0-9]{1,18}(\\.[0-9]{1,9})?\\+?");

  /** One field of a metrics line: the value, and whether it is an age that grows after arrival. */
  record Metric(double value, boolean age) {}

  /** A metrics line: its snapshot number and its fields, name to metric. */
  record MetricsLine(String snapshot, Map<String, Metric> fields) {}

  /**
   * {@code ARROWBEAT-METRICS <snapshot> name=value ...}: the snapshot 1-18 digits, 1-{@value
   * #MAX_METRICS_FIELDS} fields, each name {@code allowed} and given once, each value a decimal
   * number; a value ending in {@code +} is an age at send time, which grows while no line comes.
   * Null for anything else.
   */
  static MetricsLine parseMetrics(String line, Predicate<String> allowed) {
    if (line == null || !line.startsWith(METRICS + " ")) {
      return null;
    }
    String[] parts = line.substring(METRICS.length() + 1).split(" ", -1);
    if (parts.length < 2 || parts.length > MAX_METRICS_FIELDS + 1 || !SNAPSHOT.matcher(parts[0]).matches()) {
      return null;
    }
    Map<String, Metric> fields = new HashMap<>();
    for (int i = 1; i < parts.length; i++) {
      int eq = parts[i].indexOf('=');
      String name = eq <= 0 ? "" : parts[i].substring(0, eq);
      String value = eq <= 0 ? "" : parts[i].substring(eq + 1);
      if (!allowed.test(name) || !METRIC_VALUE.matcher(value).matches()) {
        return null;
      }
      boolean age = value.endsWith("+");
      double number = Double.parseDouble(age ? value.substring(0, value.length() - 1) : value);
      if (fields.put(name, new Metric(number, age)) != null) {
        return null;
      }
    }
    return new MetricsLine(parts[0], fields);
  }

  static final String ALIVE = "ARROWBEAT-ALIVE";
  private static final Pattern ALIVE_NUMBER = Pattern.compile("[0-9]{1,15}");

  /**
   * A child's answer to a pulse: it is alive (the driver-side process's RM loop turns; an agent's
   * heartbeat loop turns), its history is complete before {@code completeUntilMs} (wall clock; 0 if
   * it keeps none, as an agent) and it holds {@code unsavedRows} rows not yet committed. The
   * driver plugin hands both to a restarted driver-side process, which records the gap; the
   * executor plugin only times the answer ({@link Supervision}).
   */
  record Alive(long completeUntilMs, long unsavedRows) {}

  /** {@code ARROWBEAT-ALIVE <complete until ms> <unsaved rows>}, each 1-15 digits; null otherwise. */
  static Alive parseAlive(String line) {
    String[] words = line == null ? new String[0] : line.split(" ", -1);
    if (words.length != 3 || !words[0].equals(ALIVE)
        || !ALIVE_NUMBER.matcher(words[1]).matches() || !ALIVE_NUMBER.matcher(words[2]).matches()) {
      return null;
    }
    return new Alive(Long.parseLong(words[1]), Long.parseLong(words[2]));
  }

  // ---- between the plugins (Spark's RPC, executor to driver) ----------------------------------

  /**
   * An executor plugin's message, as the driver plugin relays it to the driver-side process: the
   * plugins send {@link #executorOutputsLost}, {@link #executorUnmonitored} and {@link
   * #executorAgentDown} lines, checked
   * again here (never {@code driver}'s outputs); null for anything else.
   */
  static String relayed(Object message) {
    String[] words = message instanceof String text && text.length() <= MAX_COMMAND_CHARS
        ? text.split(" ", -1) : new String[0];
    boolean unmonitored = words.length == 3 && words[0].equals("executor-unmonitored")
        && EXECUTOR_ID.matcher(words[1]).matches() && REASON.matcher(words[2]).matches();
    boolean lost = words.length == 4 && words[0].equals("executor-outputs-lost") && isExecutor(words[1])
        && REASON.matcher(words[2]).matches() && TASK_ID.matcher(words[3]).matches();
    return unmonitored || lost || isAgentDown(message) ? (String) message : null;
  }

  private static final Pattern AGENT_DOWN_CAUSE =
      Pattern.compile("[\\x20-\\x7e]{1," + (MAX_AGENT_DOWN_CAUSE_CHARS + 8) + "}");

  /**
   * An executor plugin's ask of the driver plugin ({@code PluginContext.ask}): the RM's address
   * now. The answer is the address, or {@code ""} while the driver-side process is down.
   */
  static final String RM_ADDRESS_QUERY = "rm-address?";

  /** The driver plugin's answer to {@link #RM_ADDRESS_QUERY}, checked: an address, else null. */
  static String address(Object answer) {
    return answer instanceof String text && ADDRESS.matcher(text).matches() ? text : null;
  }

  /** An {@link #executorAgentDown} line, checked again (it is longer than a command). */
  private static boolean isAgentDown(Object message) {
    String[] words = message instanceof String text && text.length() <= 2 * MAX_COMMAND_CHARS
        ? text.split(" ", 5) : new String[0];
    return words.length == 5 && words[0].equals("executor-agent-down") && isExecutor(words[1])
        && TASK_ID.matcher(words[2]).matches() && TASK_ID.matcher(words[3]).matches()
        && AGENT_DOWN_CAUSE.matcher(words[4]).matches();
  }

  /** The line kinds this class declares, for the contract test. */
  static final Set<String> KINDS = Set.of(
      "settings", "pulse", "app", "stop", "exiting", "executor-added", "executor-removed",
      "executor-unmonitored", "executor-agent-down", "executor-outputs-lost", "executor-replacement",
      "tasks", "stack", "rm",
      "ready", "command", "metrics", "alive", "plugin-message");
}
