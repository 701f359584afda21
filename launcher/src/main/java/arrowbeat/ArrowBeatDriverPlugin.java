package arrowbeat;

import arrowbeat.compat.SparkInternals;
import arrowbeat.compat.SparkInternals.Internal;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
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
 *
 * <p>The address can change: a restarted process that cannot bind its port again (another process
 * took it meanwhile) serves on a free one. Executor plugins ask for the address now ({@link
 * Protocol#RM_ADDRESS_QUERY}, over Spark's RPC, the way the first one reached them) when their
 * agent cannot reach the RM, and hand it on. A first start that failed but may succeed later (a
 * missed start-up timeout on a loaded driver; {@link Supervision#retriesStart}) is retried like a
 * restart; the executors are told that the RM is pending and ask for its address the same way.
 *
 * <p>This class keeps Spark's callbacks and the wiring only: the supervision of the process is
 * {@link RmSupervisor}'s, the commands it may give {@link DriverCommands}'s, Spark's view of its
 * executors {@link SparkExecutors}'s (plain classes, tested by JUnit on fake clocks).
 */
public final class ArrowBeatDriverPlugin implements DriverPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatDriverPlugin.class);
  /** To the executors, instead of an address: the RM is not up yet, ask for its address later. */
  static final String RM_PENDING = "arrowbeat.rm.pending";
  static final String UI_URL_KEY = "spark.arrowbeat.ui.url";
  /** The running Spark's version, for the driver-side process's support check. */
  static final String SPARK_VERSION = "arrowbeat.spark.version";

  private final SparkExecutors executors = new SparkExecutors();
  /** Spark's kills, off the protocol pump (a kill waits on the cluster manager). */
  private final ExecutorService replacer = daemonThread("arrowbeat-replace-executor");
  /** One thread checks the driver-side process and restarts it: never two restarts at once. */
  private final ScheduledExecutorService supervisor =
      Executors.newSingleThreadScheduledExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "arrowbeat-driver-supervisor");
            thread.setDaemon(true);
            return thread;
          });
  /** The gauges in Spark's metrics system; the driver-side process feeds them (and a restarted one). */
  private PluginMetrics metrics;
  private SparkConf conf;
  private Map<String, String> settings;
  /** The driver-side internals this Spark lacks, for the driver-side process (key to why). */
  private Map<String, String> unavailable = Map.of();
  /** The driver-side process's supervisor; null while arrowbeat is off. */
  private volatile RmSupervisor rm;

  /** Can this jar's plugin run on Spark {@code version} at all (Spark 4 or later)? */
  static boolean runsOn(String version) {
    java.util.regex.Matcher major = Pattern.compile("^(\\d+)\\.").matcher(version);
    return major.find() && Integer.parseInt(major.group(1)) >= 4;
  }

  private static ExecutorService daemonThread(String name) {
    return Executors.newSingleThreadExecutor(
        runnable -> {
          Thread thread = new Thread(runnable, name);
          thread.setDaemon(true);
          return thread;
        });
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
      conf = ctx.conf();
      // Looked up first: the one warning about a missing internal comes before anything it affects.
      unavailable =
          SparkInternals.unavailableSettings(
              Internal.KILL_AND_REPLACE_EXECUTOR, Internal.EXECUTOR_LOST, Internal.DECOMMISSION_EXECUTOR);
      LOG.info("arrowbeat driver plugin on Spark {}: {}", SparkInternals.sparkVersion(),
          unavailable.isEmpty()
              ? "every Spark internal it uses was found"
              : "unavailable: "
                  + String.join(", ", unavailable.keySet()).replace(SparkInternals.SETTING_PREFIX, ""));
      settings = Launch.settings(conf);
      settings.put(SPARK_VERSION, sc.version());
      settings.put("spark.driver.host", conf.get("spark.driver.host", ""));
      settings.put("spark.dynamicAllocation.enabled", conf.get("spark.dynamicAllocation.enabled", "false"));
      settings.put("spark.decommission.enabled", conf.get("spark.decommission.enabled", "false"));
      String secret = settings.get(Launch.SECRET);
      if (secret == null || secret.isEmpty()) {
        secret = Launch.newSecret();
        settings.put(Launch.SECRET, secret);
      }
      metrics = PluginMetrics.forDriver(ctx.metricRegistry());
      DriverCommands commands =
          new DriverCommands(sparkActions(sc), replacer, executors, line -> rm.forward(line));
      rm = new RmSupervisor(
          new RmSupervisor.Plugin() {
            @Override
            public Supervised start(Map<String, String> with) throws Exception {
              Sidecar started =
                  Sidecar.start(
                      "driver",
                      Launch.command(conf, Launch.DRIVER_MODULE),
                      driverSideSettings(with),
                      Launch.startupTimeoutMs(conf));
              started.onCommand(commands);
              started.onMetrics(metrics::accept);
              return started;
            }

            @Override
            public String publish(Supervised ready) {
              return published(ready);
            }
          },
          settings, executors, Clock.SYSTEM, System::currentTimeMillis, Scheduler.of(supervisor));
      rm.start();
      rm.startChecks();
      sc.addSparkListener(new ExecutorListener());
      // Driver-side code of this application may query the RM; Spark redacts "secret" keys.
      conf.set(Launch.SECRET, secret);
      String address = rm.publishFirst();
      executorSettings.putAll(settings);
      if (address == null) {
        executorSettings.put(RM_PENDING, "true");
      } else {
        executorSettings.put(Launch.RM_ADDRESS, address);
      }
    } catch (Throwable t) {
      LOG.error("arrowbeat is off for this application: the driver-side process did not start: {}",
          t.getMessage());
      if (rm != null) {
        rm.abandon();
      }
    }
    return executorSettings;
  }

  /** Spark's calls for {@link DriverCommands}. */
  private static DriverCommands.Spark sparkActions(SparkContext sc) {
    return new DriverCommands.Spark() {
      @Override
      public java.util.Optional<Boolean> killAndReplace(String executorId) {
        return SparkInternals.killAndReplaceExecutor(sc, executorId);
      }

      @Override
      public java.util.Optional<Boolean> executorLost(String executorId, String message) {
        return SparkInternals.executorLost(sc, executorId, message);
      }

      @Override
      public boolean killTaskAttempt(long taskId, String reason) {
        return sc.killTaskAttempt(taskId, true, reason);
      }

      @Override
      public java.util.Optional<Boolean> decommission(String executorId, String message) {
        return SparkInternals.decommissionExecutor(sc, executorId, message);
      }
    };
  }

  /**
   * A ready process's address, UI URL, certificate and pid, into the SparkConf (and the settings a
   * restart gets): at its first start, and again when a restart moved it. Returns the address.
   */
  private String published(Supervised ready) {
    String address = ready.info().get("address");
    if (address == null || !Protocol.ADDRESS.matcher(address).matches()) {
      throw new IllegalStateException("the driver-side process announced no valid address");
    }
    conf.set(Launch.RM_ADDRESS, address);
    publishUiUrl(ready.info());
    publishGeneratedTls(ready.info());
    conf.set("spark.arrowbeat.driver.pid", String.valueOf(ready.pid()));
    return address;
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
    if (url != null && RmSupervisor.UI_URL.matcher(url).matches()) {
      conf.set(UI_URL_KEY, url);
      LOG.info("arrowbeat live page at {} (the driver-side process logs it with its access token)", url);
    }
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
   * ({@link SparkExecutors}): which executors Spark added, so that one whose agent never registers
   * is shown unmonitored, and which it removed, with Spark's reason and what this JVM saw besides
   * (arrowbeat had asked for the removal; the application was ending), so that the driver-side
   * process can tell an executor let go on purpose (idle, decommissioned, replaced) from a crash.
   * Runs on Spark's listener bus thread: it only writes a line.
   */
  private final class ExecutorListener extends SparkListener {
    @Override
    public void onExecutorAdded(SparkListenerExecutorAdded added) {
      String host = added.executorInfo() == null ? "" : added.executorInfo().executorHost();
      forward(executors.added(added.executorId(), host));
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
      forward(executors.removed(removed.executorId(), removed.reason()));
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd end) {
      executors.applicationEnding(); // posted before the scheduler stops the executors
    }
  }

  private void forward(String line) {
    RmSupervisor current = rm;
    if (line != null && current != null) {
      current.forward(line);
    }
  }

  /** The application id exists only after {@link #init}; the driver-side process needs it for history. */
  @Override
  public void registerMetrics(String appId, PluginContext pluginContext) {
    RmSupervisor current = rm;
    if (current != null) {
      current.appId(appId);
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
   * An executor plugin may also ask where the RM is now ({@link Protocol#RM_ADDRESS_QUERY}).
   */
  @Override
  public Object receive(Object message) {
    return RmSupervisor.receive(rm, message);
  }

  @Override
  public void shutdown() {
    RmSupervisor current = rm;
    if (current != null) {
      current.shuttingDown();
    }
    supervisor.shutdownNow();
    replacer.shutdownNow();
    if (current != null) {
      current.stop();
    }
  }
}
