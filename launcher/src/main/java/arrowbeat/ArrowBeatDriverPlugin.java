package arrowbeat;

import arrowbeat.compat.SparkInternals;
import arrowbeat.compat.SparkInternals.Internal;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.scheduler.SparkListenerExecutorAdded;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Starts {@code python -m spark_plugin.processes.driver} (arrowbeat's ResourceManager) and publishes its
 * address and the application's secret to every executor through the map {@link #init} returns,
 * and forwards Spark's own view of its executors to it ({@link ExecutorListener}). Never throws: a
 * failure is logged and the application runs on without arrowbeat.
 */
public final class ArrowBeatDriverPlugin implements DriverPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatDriverPlugin.class);
  /** Restarts of a driver-side process that died; past this, arrowbeat stays off. */
  private static final int MAX_RESTARTS = 5;
  /** {@code host:port} as the driver-side process announces it (and spark.arrowbeat.rm.address). */
  private static final Pattern ADDRESS = Pattern.compile("[A-Za-z0-9.\\-\\[\\]:]{1,253}:[0-9]{1,5}");
  /** The live page's URL as the driver-side process announces it: no token, no path. */
  private static final Pattern UI_URL = Pattern.compile("https?://[A-Za-z0-9.\\-\\[\\]:]{1,253}:[0-9]{1,5}/");
  static final String UI_URL_KEY = "spark.arrowbeat.ui.url";

  /** Replacements for lost map outputs allowed per {@link #LOST_WINDOW_MS}: an agent that dies on
   * every new executor must not make Spark replace executors forever. */
  private static final int MAX_LOST_REPLACEMENTS = 5;
  private static final long LOST_WINDOW_MS = 600_000;
  private static final String LOST = "arrowbeat-outputs-lost";
  private static final String AGENT_NOT_STARTED = "arrowbeat-agent-not-started";
  /** Spark's loss reason is free text: at most this much of it is forwarded. */
  static final int MAX_REASON_CHARS = 400;
  /** A host as the driver-side process accepts it ({@code spark_plugin.monitoring.driver_spark_view}). */
  private static final Pattern HOST = Pattern.compile("[A-Za-z0-9._:%\\[\\]-]{1,253}");
  /** Executors Spark runs now (id to host): replayed to a restarted driver-side process. */
  private final Map<String, String> liveExecutors = new java.util.concurrent.ConcurrentHashMap<>();
  /** Executors arrowbeat asked Spark to kill and replace, until Spark reports them removed. */
  private final java.util.Set<String> replacing = java.util.concurrent.ConcurrentHashMap.newKeySet();
  private volatile boolean applicationEnding;
  private final java.util.ArrayDeque<Long> lostReplacements = new java.util.ArrayDeque<>();
  private final java.util.concurrent.ExecutorService replacer =
      java.util.concurrent.Executors.newSingleThreadExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "arrowbeat-replace-executor");
            thread.setDaemon(true);
            return thread;
          });

  private volatile Sidecar sidecar;
  /** The gauges in Spark's metrics system; the driver-side process feeds them (and a restarted one). */
  private PluginMetrics metrics;
  private volatile boolean shuttingDown;
  private SparkContext sc;
  private SparkConf conf;
  private Map<String, String> settings;
  /** The driver-side internals this Spark lacks, for the driver-side process (key to why). */
  private Map<String, String> unavailable = Map.of();
  private String appId;
  private int restarts;

  /** The running Spark's version, for the driver-side process's support check. */
  static final String SPARK_VERSION = "arrowbeat.spark.version";

  /** Can this jar's plugin run on Spark {@code version} at all (Spark 4 or later)? */
  static boolean runsOn(String version) {
    java.util.regex.Matcher major = Pattern.compile("^(\\d+)\\.").matcher(version);
    return major.find() && Integer.parseInt(major.group(1)) >= 4;
  }

  @Override
  public Map<String, String> init(SparkContext sc, PluginContext ctx) {
    Map<String, String> executorSettings = new HashMap<>();
    if (!runsOn(sc.version())) {
      // Before anything Spark 4-specific is touched. The supported minors are Python's to judge
      // (spark_plugin/compat/versions.py, told the version below); a Spark before 4 cannot host
      // this jar's plugin at all (Scala 2.13, Spark 4's plugin API).
      LOG.error("arrowbeat supports Spark 4.0 to 4.3; this is Spark {}: arrowbeat stays off for this "
          + "application (its jobs run as without it)", sc.version());
      return executorSettings;
    }
    try {
      this.sc = sc;
      conf = ctx.conf();
      // Looked up first: the one warning about a missing internal comes before anything it affects.
      unavailable = SparkInternals.unavailableSettings(Internal.KILL_AND_REPLACE_EXECUTOR);
      LOG.info("arrowbeat driver plugin on Spark {}: {}", SparkInternals.sparkVersion(),
          unavailable.isEmpty()
              ? "every Spark internal it uses was found"
              : "unavailable: "
                  + String.join(", ", unavailable.keySet()).replace(SparkInternals.SETTING_PREFIX, ""));
      settings = Launch.settings(conf);
      settings.put(SPARK_VERSION, sc.version());
      settings.put("spark.driver.host", conf.get("spark.driver.host", ""));
      settings.put("spark.dynamicAllocation.enabled", conf.get("spark.dynamicAllocation.enabled", "false"));
      String secret = settings.get(Launch.SECRET);
      if (secret == null || secret.isEmpty()) {
        secret = Launch.newSecret();
        settings.put(Launch.SECRET, secret);
      }
      metrics = PluginMetrics.forDriver(ctx.metricRegistry());
      launch();
      sc.addSparkListener(new ExecutorListener());
      String address = sidecar.info().get("address");
      if (address == null || !ADDRESS.matcher(address).matches()) {
        throw new IllegalStateException("the driver-side process announced no valid address");
      }
      conf.set(Launch.RM_ADDRESS, address);
      publishUiUrl(sidecar.info());
      publishGeneratedTls(sidecar.info());
      // Driver-side code of this application may query the RM; Spark redacts "secret" keys.
      conf.set(Launch.SECRET, secret);
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

  /**
   * A certificate the driver-side process generated ({@code spark.arrowbeat.ssl.enabled} without
   * configured files) goes where the secret goes: the executors' settings (through {@link #init}'s
   * map), a restarted driver-side process's settings (so it serves the same certificate), and the
   * driver's SparkConf for the application's own shuffle code. Spark redacts the key's name.
   */
  private void publishGeneratedTls(Map<String, String> info) {
    String cert = info.get(Sidecar.READY_SSL_CERT);
    String key = info.get(Sidecar.READY_SSL_KEY);
    if (cert == null || key == null) {
      return;
    }
    settings.put(Launch.SSL_GENERATED_CERT, cert);
    settings.put(Launch.SSL_GENERATED_KEY, key);
    conf.set(Launch.SSL_GENERATED_CERT, cert);
    conf.set(Launch.SSL_GENERATED_KEY, key);
  }

  /**
   * The live page's URL, without its token (the Environment page shows the SparkConf to every UI
   * user), goes into the SparkConf as {@code spark.arrowbeat.ui.url}: a DriverPlugin cannot add a
   * Spark UI tab without Spark's internal API, so the Environment page is where UI users find it.
   */
  private void publishUiUrl(Map<String, String> info) {
    String url = info.get("ui_url");
    if (url != null && UI_URL.matcher(url).matches()) {
      conf.set(UI_URL_KEY, url);
      LOG.info("arrowbeat live page at {} (the driver-side process logs it with its access token)", url);
    }
  }

  private void launch() throws Exception {
    Sidecar started =
        Sidecar.start(
            "driver",
            Launch.command(conf, "spark_plugin.processes.driver"),
            driverSideSettings(settings),
            Launch.startupTimeoutMs(conf));
    started.onCommand(command -> handle(sc, command));
    started.onMetrics(metrics::accept);
    started.onUnexpectedExit(this::restart);
    started.startPulses(Launch.pulseMs(started.info()), () -> 0);
    sidecar = started;
    // A restarted process knows nothing of Spark's executors yet: tell it those alive now.
    liveExecutors.forEach((id, host) -> started.send(addedLine(id, host)));
  }

  /**
   * The driver-side process writes the history tables, maybe to s3a/abfss/gs/hdfs: it gets the
   * application's {@code spark.hadoop.*} storage settings (credentials among them; the Sidecar's
   * Redactor learns them from this map), and which driver-side Spark internals are unavailable
   * ({@link SparkInternals#SETTING_PREFIX}). The executors get neither: {@link #init} hands them
   * {@link #settings} without these.
   */
  private Map<String, String> driverSideSettings(Map<String, String> base) {
    Map<String, String> all = new java.util.LinkedHashMap<>(base);
    for (scala.Tuple2<String, String> kv : conf.getAll()) {
      if (kv._1().startsWith("spark.hadoop.")) {
        all.put(kv._1(), kv._2());
      }
    }
    all.putAll(unavailable);
    return all;
  }

  /**
   * Spark's own view of its executors, forwarded to the driver-side process as lines on its stdin
   * (the grammar is {@code spark_plugin.monitoring.driver_spark_view}'s): which executors Spark added, so that one
   * whose agent never registers is shown unmonitored, and which it removed and why, so that an
   * executor let go on purpose (idle, decommissioned, replaced) is not recorded as a crash. Runs
   * on Spark's listener bus thread: it only writes a line.
   */
  private final class ExecutorListener extends SparkListener {
    @Override
    public void onExecutorAdded(SparkListenerExecutorAdded added) {
      String id = added.executorId();
      if (!Command.EXECUTOR_ID.matcher(id).matches()) {
        return; // not an id the driver-side process would accept; Spark's ids always are
      }
      String host = added.executorInfo() == null ? "" : added.executorInfo().executorHost();
      host = host != null && HOST.matcher(host).matches() ? host : "unknown";
      liveExecutors.put(id, host);
      forward(addedLine(id, host));
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
      String id = removed.executorId();
      if (!Command.EXECUTOR_ID.matcher(id).matches()) {
        return;
      }
      liveExecutors.remove(id);
      boolean replaced = replacing.remove(id);
      String cause = applicationEnding ? "app-end" : replaced ? "replaced" : "spark";
      forward(removedLine(id, cause, removed.reason()));
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd end) {
      applicationEnding = true; // posted before the scheduler stops the executors
    }
  }

  static String addedLine(String executorId, String host) {
    return "executor-added " + executorId + " " + host;
  }

  static String removedLine(String executorId, String cause, String reason) {
    return "executor-removed " + executorId + " " + cause + " " + printable(reason, MAX_REASON_CHARS);
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

  private void forward(String line) {
    Sidecar current = sidecar;
    if (current != null) {
      current.send(line);
    }
  }

  /**
   * Supervision: a driver-side process that died is started again on the same port, so agents
   * find it where they were told; it recovers the executors it knew from the history tables.
   */
  private synchronized void restart() {
    if (shuttingDown) {
      return;
    }
    if (++restarts > MAX_RESTARTS) {
      LOG.error("arrowbeat's driver-side process died {} times; arrowbeat stays off", MAX_RESTARTS);
      return;
    }
    try {
      String address = sidecar.info().get("address");
      settings.put("spark.arrowbeat.rm.port", address.substring(address.lastIndexOf(':') + 1));
      String ui = sidecar.info().get("ui_url");
      if (ui != null && UI_URL.matcher(ui).matches()) { // same port, same token: the logged URL stays valid
        settings.put("spark.arrowbeat.ui.port", ui.substring(ui.lastIndexOf(':') + 1, ui.length() - 1));
      }
      if (appId != null) {
        settings.put("spark.app.id", appId);
      }
      LOG.warn("restarting arrowbeat's driver-side process on {} (restart {})", address, restarts);
      launch();
      conf.set("spark.arrowbeat.driver.pid", String.valueOf(sidecar.pid()));
    } catch (Throwable t) {
      LOG.error("arrowbeat's driver-side process could not be restarted: {}", t.getMessage());
    }
  }

  /** The application id exists only after {@link #init}; the driver-side process needs it for history. */
  @Override
  public void registerMetrics(String appId, PluginContext pluginContext) {
    this.appId = appId;
    Sidecar current = sidecar;
    if (current != null) {
      current.send("app " + appId);
    }
  }

  /** What an executor plugin sends when its map outputs are lost ({@link #receive} reads it). */
  static String lostMessage(String executorId, String reason) {
    return LOST + " " + executorId + " " + reason;
  }

  /**
   * What an executor plugin sends when its agent could not start ({@code reason}: {@link
   * Command#REASON}, e.g. {@code interpreter-missing}); the executor is then shown unmonitored at
   * once rather than after the registration bound.
   */
  static String agentNotStartedMessage(String executorId, String reason) {
    return AGENT_NOT_STARTED + " " + executorId + " " + reason;
  }

  /**
   * An executor's arrowbeat map outputs are lost (its agent died, or their files vanished): Spark
   * must forget what it ran there, as for a lost executor, so it recomputes those map partitions
   * instead of failing readers until their retries run out. Kill-and-replace is what Spark itself
   * does with an executor whose heartbeats time out. Anything but a well-formed message is logged
   * and ignored.
   */
  @Override
  public Object receive(Object message) {
    String[] words = message instanceof String text && text.length() <= Command.MAX_LINE_CHARS
        ? text.split(" ", -1) : new String[0];
    if (words.length == 3
        && AGENT_NOT_STARTED.equals(words[0])
        && Command.EXECUTOR_ID.matcher(words[1]).matches()
        && Command.REASON.matcher(words[2]).matches()) {
      forward("executor-unmonitored " + words[1] + " " + words[2]);
      return Boolean.TRUE;
    }
    if (words.length != 3
        || !LOST.equals(words[0])
        || !Command.EXECUTOR_ID.matcher(words[1]).matches()
        || "driver".equals(words[1])
        || !Command.REASON.matcher(words[2]).matches()) {
      LOG.warn("arrowbeat driver plugin ignored a malformed message from an executor");
      return Boolean.FALSE;
    }
    SparkContext context = sc;
    if (context == null) {
      return Boolean.FALSE;
    }
    Long charged;
    synchronized (lostReplacements) {
      long now = System.currentTimeMillis();
      while (!lostReplacements.isEmpty() && now - lostReplacements.peekFirst() > LOST_WINDOW_MS) {
        lostReplacements.removeFirst();
      }
      if (lostReplacements.size() >= MAX_LOST_REPLACEMENTS) {
        LOG.error("arrowbeat: executor {} lost its map outputs ({}), but {} executors were already "
            + "replaced for that in the last {} s; not replacing it (readers of its outputs will "
            + "fail)", words[1], words[2], lostReplacements.size(), LOST_WINDOW_MS / 1000);
        return Boolean.FALSE;
      }
      charged = now;
      lostReplacements.addLast(charged);
    }
    // Off the RPC thread that delivered the message: a kill waits on the cluster manager (Spark's
    // HeartbeatReceiver kills from its own thread for the same reason).
    replacer.execute(
        () -> {
          Replacement outcome = replace(context, words[1]);
          if (outcome != Replacement.ACCEPTED) { // only replacements that happen use up the budget
            synchronized (lostReplacements) {
              lostReplacements.removeLastOccurrence(charged);
            }
          }
          LOG.warn("arrowbeat: executor {} lost its map outputs ({}); asked Spark to replace it: {}",
              words[1], words[2], outcome.text);
        });
    return Boolean.TRUE;
  }

  /**
   * The actions the driver-side process may ask of Spark, when the user enabled them: {@code
   * kill-executor <id>} ({@code spark.arrowbeat.onHeartbeatTimeout=kill}) and {@code kill-task
   * <task attempt id>} ({@code spark.arrowbeat.onStuckTask=kill}). Only commands
   * from the driver-side process's protocol channel get here, already validated ({@link Command}).
   */
  private void handle(SparkContext sc, Command command) {
    if (Command.KILL_EXECUTOR.equals(command.verb())) {
      LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", command.argument(),
          replace(sc, command.argument()).text);
    } else if (Command.KILL_TASK.equals(command.verb())) {
      long taskId = Long.parseLong(command.argument());
      // Off the protocol pump: killTaskAttempt takes the task scheduler's lock.
      replacer.execute(() -> killTask(sc, taskId));
    }
  }

  /**
   * {@code spark.arrowbeat.onStuckTask=kill}: a task attempt made no progress for the stuck-task
   * timeout; Spark kills it and, as for any killed attempt, runs the task again.
   */
  private static void killTask(SparkContext sc, long taskId) {
    try {
      boolean killed =
          sc.killTaskAttempt(taskId, true, "arrowbeat: no progress for spark.arrowbeat.stuckTask.timeout");
      LOG.warn("arrowbeat asked Spark to kill stuck task attempt {}: {}", taskId,
          killed ? "accepted" : "not running any more");
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: killing task attempt {} failed: {}", taskId, e.toString());
    }
  }

  /**
   * Kill-and-replace, remembered so that Spark's removal of the executor is recorded as a
   * replacement arrowbeat asked for, not as a crash.
   */
  private Replacement replace(SparkContext context, String executorId) {
    replacing.add(executorId);
    Replacement outcome = Replacement.REFUSED;
    try {
      outcome = SparkInternals.killAndReplaceExecutor(context, executorId)
          .map(accepted -> accepted ? Replacement.ACCEPTED : Replacement.REFUSED)
          .orElse(Replacement.UNAVAILABLE);
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: replacing executor {} failed: {}", executorId, e.toString());
    }
    if (outcome != Replacement.ACCEPTED) {
      replacing.remove(executorId);
    }
    return outcome;
  }

  /** What became of a request to replace an executor, as the log says it. */
  private enum Replacement {
    ACCEPTED("accepted"),
    REFUSED("refused by the scheduler backend"),
    UNAVAILABLE("not possible on this Spark (" + Internal.KILL_AND_REPLACE_EXECUTOR.key()
        + " is unavailable: see the warning at start-up)");

    private final String text;

    Replacement(String text) {
      this.text = text;
    }
  }

  @Override
  public void shutdown() {
    shuttingDown = true;
    replacer.shutdownNow();
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
