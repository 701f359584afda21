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

  /** Executors Spark runs now (id to host): replayed to a restarted driver-side process. */
  private final Map<String, String> liveExecutors = new java.util.concurrent.ConcurrentHashMap<>();
  /** Executors arrowbeat asked Spark to kill and replace, until Spark reports them removed. */
  private final java.util.Set<String> replacing = java.util.concurrent.ConcurrentHashMap.newKeySet();
  private volatile boolean applicationEnding;
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
    String cert = info.get(Protocol.READY_SSL_CERT);
    String key = info.get(Protocol.READY_SSL_KEY);
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
    liveExecutors.forEach((id, host) -> started.send(Protocol.executorAdded(id, host)));
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
   * ({@link Protocol}): which executors Spark added, so that one whose agent never registers is
   * shown unmonitored, and which it removed, with Spark's reason and what this JVM saw besides
   * (arrowbeat had asked for the removal; the application was ending), so that the driver-side
   * process can tell an executor let go on purpose (idle, decommissioned, replaced) from a crash.
   * Runs on Spark's listener bus thread: it only writes a line.
   */
  private final class ExecutorListener extends SparkListener {
    @Override
    public void onExecutorAdded(SparkListenerExecutorAdded added) {
      String id = added.executorId();
      if (!Protocol.EXECUTOR_ID.matcher(id).matches()) {
        return; // not an id the driver-side process would accept; Spark's ids always are
      }
      String host = added.executorInfo() == null ? "" : added.executorInfo().executorHost();
      host = host != null && Protocol.HOST.matcher(host).matches() ? host : "unknown";
      liveExecutors.put(id, host);
      forward(Protocol.executorAdded(id, host));
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
      String id = removed.executorId();
      if (!Protocol.EXECUTOR_ID.matcher(id).matches()) {
        return;
      }
      liveExecutors.remove(id);
      forward(Protocol.executorRemoved(id, replacing.remove(id), applicationEnding, removed.reason()));
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd end) {
      applicationEnding = true; // posted before the scheduler stops the executors
    }
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
      current.send(Protocol.app(appId));
    }
  }

  /**
   * An executor plugin's message ({@link Protocol#relayed}): its agent did not start (the executor
   * is then shown unmonitored at once rather than after the registration bound), or its arrowbeat
   * map outputs are lost (its agent died, or their files vanished). Both are facts for the
   * driver-side process, which decides what follows: for lost outputs, whether Spark must forget
   * what the executor ran ({@code kill-executor}, as for a lost executor), so that it recomputes
   * those map partitions instead of failing readers until their retries run out. True if the
   * driver-side process got the message; anything but a well-formed message is logged and ignored.
   */
  @Override
  public Object receive(Object message) {
    String line = Protocol.relayed(message);
    if (line == null) {
      LOG.warn("arrowbeat driver plugin ignored a malformed message from an executor");
      return Boolean.FALSE;
    }
    Sidecar current = sidecar;
    if (current == null) {
      return Boolean.FALSE;
    }
    current.send(line);
    return Boolean.TRUE;
  }

  /**
   * The actions the driver-side process may ask of Spark: {@code kill-executor <id>} (with
   * {@code spark.arrowbeat.onHeartbeatTimeout=kill}, or for an executor whose map outputs are lost)
   * and {@code kill-task <task attempt id>} ({@code spark.arrowbeat.onStuckTask=kill}). Only
   * commands from the driver-side process's protocol channel get here, already validated ({@link
   * Protocol#parseCommand}). What became of a replacement goes back to it ({@link
   * Protocol#executorReplacement}): it charged its budget for lost outputs and refunds a refused one.
   */
  private void handle(SparkContext sc, Protocol.Command command) {
    if (Protocol.KILL_EXECUTOR.equals(command.verb())) {
      String executorId = command.argument();
      // Off the protocol pump: a kill waits on the cluster manager (Spark's HeartbeatReceiver
      // kills from its own thread for the same reason).
      replacer.execute(
          () -> {
            Protocol.Replacement outcome = replace(sc, executorId);
            LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", executorId, text(outcome));
            forward(Protocol.executorReplacement(executorId, outcome));
          });
    } else if (Protocol.KILL_TASK.equals(command.verb())) {
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
  private Protocol.Replacement replace(SparkContext context, String executorId) {
    replacing.add(executorId);
    Protocol.Replacement outcome = Protocol.Replacement.REFUSED;
    try {
      outcome = SparkInternals.killAndReplaceExecutor(context, executorId)
          .map(accepted -> accepted ? Protocol.Replacement.ACCEPTED : Protocol.Replacement.REFUSED)
          .orElse(Protocol.Replacement.UNAVAILABLE);
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: replacing executor {} failed: {}", executorId, e.toString());
    }
    if (outcome != Protocol.Replacement.ACCEPTED) {
      replacing.remove(executorId);
    }
    return outcome;
  }

  /** What became of a request to replace an executor, as the log says it. */
  private static String text(Protocol.Replacement outcome) {
    return switch (outcome) {
      case ACCEPTED -> "accepted";
      case REFUSED -> "refused by the scheduler backend";
      case UNAVAILABLE -> "not possible on this Spark (" + Internal.KILL_AND_REPLACE_EXECUTOR.key()
          + " is unavailable: see the warning at start-up)";
    };
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
