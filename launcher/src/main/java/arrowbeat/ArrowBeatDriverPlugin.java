package arrowbeat;

import java.util.HashMap;
import java.util.Map;
import java.util.regex.Pattern;
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
  /** Restarts of a driver-side process that died; past this, arrowbeat stays off. */
  private static final int MAX_RESTARTS = 5;
  /** {@code host:port} as the driver-side process announces it (and spark.arrowbeat.rm.address). */
  private static final Pattern ADDRESS = Pattern.compile("[A-Za-z0-9.\\-\\[\\]:]{1,253}:[0-9]{1,5}");

  /** Replacements for lost map outputs allowed per {@link #LOST_WINDOW_MS}: an agent that dies on
   * every new executor must not make Spark replace executors forever. */
  private static final int MAX_LOST_REPLACEMENTS = 5;
  private static final long LOST_WINDOW_MS = 600_000;
  private static final String LOST = "arrowbeat-outputs-lost";
  private final java.util.ArrayDeque<Long> lostReplacements = new java.util.ArrayDeque<>();
  private final java.util.concurrent.ExecutorService replacer =
      java.util.concurrent.Executors.newSingleThreadExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "arrowbeat-replace-executor");
            thread.setDaemon(true);
            return thread;
          });

  private volatile Sidecar sidecar;
  private volatile boolean shuttingDown;
  private SparkContext sc;
  private SparkConf conf;
  private Map<String, String> settings;
  private String appId;
  private int restarts;

  @Override
  public Map<String, String> init(SparkContext sc, PluginContext ctx) {
    Map<String, String> executorSettings = new HashMap<>();
    try {
      this.sc = sc;
      conf = ctx.conf();
      settings = Launch.settings(conf);
      settings.put("spark.driver.host", conf.get("spark.driver.host", ""));
      String secret = settings.get(Launch.SECRET);
      if (secret == null || secret.isEmpty()) {
        secret = Launch.newSecret();
        settings.put(Launch.SECRET, secret);
      }
      launch();
      String address = sidecar.info().get("address");
      if (address == null || !ADDRESS.matcher(address).matches()) {
        throw new IllegalStateException("the driver-side process announced no valid address");
      }
      conf.set(Launch.RM_ADDRESS, address);
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

  private void launch() throws Exception {
    Sidecar started =
        Sidecar.start(
            "driver",
            Launch.command(conf, "spark_plugin.driver"),
            settings,
            Launch.startupTimeoutMs(conf));
    started.onCommand(command -> handle(sc, command));
    started.onUnexpectedExit(this::restart);
    started.startPulses(Launch.pulseMs(started.info()), () -> 0);
    sidecar = started;
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
          boolean accepted = false;
          try {
            accepted = context.killAndReplaceExecutor(words[1]);
          } catch (RuntimeException e) {
            LOG.warn("arrowbeat: replacing executor {} failed: {}", words[1], e.toString());
          }
          if (!accepted) { // only replacements that happen use up the budget
            synchronized (lostReplacements) {
              lostReplacements.removeLastOccurrence(charged);
            }
          }
          LOG.warn("arrowbeat: executor {} lost its map outputs ({}); asked Spark to replace it: {}",
              words[1], words[2], accepted ? "accepted" : "refused by the scheduler backend");
        });
    return Boolean.TRUE;
  }

  /**
   * The one action the ResourceManager may ask of Spark, when the user enabled it
   * ({@code spark.arrowbeat.onHeartbeatTimeout=kill}): {@code kill-executor <id>}. Only commands
   * from the driver-side process's protocol channel get here, already validated ({@link Command}).
   */
  private static void handle(SparkContext sc, Command command) {
    if (Command.KILL_EXECUTOR.equals(command.verb())) {
      boolean accepted = sc.killAndReplaceExecutor(command.argument());
      LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", command.argument(),
          accepted ? "accepted" : "refused by the scheduler backend");
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
