package arrowbeat;

import arrowbeat.compat.SparkInternals;
import arrowbeat.compat.SparkInternals.Internal;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
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
 */
public final class ArrowBeatDriverPlugin implements DriverPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ArrowBeatDriverPlugin.class);
  /** Settings a restarted driver-side process gets: the gap it records ({@code history.gaps}). */
  static final String GAP_FROM_MS = "arrowbeat.rm.restart.fromMs";
  static final String GAP_UNSAVED_ROWS = "arrowbeat.rm.restart.unsavedRows";
  static final String GAP_CAUSE = "arrowbeat.rm.restart.cause";
  /** Set for a restart: if the old port is taken, the RM serves on another (driver.py reads it). */
  static final String RESTART_ANY_PORT = "arrowbeat.rm.restart.anyPort";
  /** To the executors, instead of an address: the RM is not up yet, ask for its address later. */
  static final String RM_PENDING = "arrowbeat.rm.pending";
  private static final int MAX_CAUSE_CHARS = 300;
  /** {@code host:port} as the driver-side process announces it (and spark.arrowbeat.rm.address). */
  private static final Pattern ADDRESS = Protocol.ADDRESS;
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
  /** Hang and restart decisions (pure; the supervisor thread acts on them). */
  private final Supervision supervision = new Supervision(Supervision.Policy.DEFAULT);
  /** One thread checks the driver-side process and restarts it: never two restarts at once. */
  private final java.util.concurrent.ScheduledExecutorService supervisor =
      java.util.concurrent.Executors.newSingleThreadScheduledExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "arrowbeat-driver-supervisor");
            thread.setDaemon(true);
            return thread;
          });
  /** The current process's last answer, and its start (wall clock ms): the gap a restart records. */
  private volatile Protocol.Alive lastAnswer;
  /** The ready line of the last process that was ready: address, UI URL, supervision numbers. */
  private volatile Map<String, String> lastInfo = Map.of();
  private long startedWallMs;
  /** The gap carried to the next start, kept until a process answers: {@code null} cause = none. */
  private long gapFromMs;
  private long gapUnsavedRows;
  private String gapCause;
  private int restarts;
  private long restartWaitLogged = -1;
  /** Whether a driver-side process was ever ready (else a restart is a retried first start). */
  private volatile boolean everStarted;

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
      unavailable =
          SparkInternals.unavailableSettings(Internal.KILL_AND_REPLACE_EXECUTOR, Internal.EXECUTOR_LOST);
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
      try {
        launch();
      } catch (Throwable first) {
        if (!Supervision.retriesStart(first)) {
          throw first;
        }
        // A loaded driver that missed the start-up timeout, say: retried like a restart.
        supervision.attempting(nowMs());
        supervision.failed(nowMs());
        gapFromMs = System.currentTimeMillis(); // nothing is monitored from here until one runs
        gapCause = "the first start failed: " + first.getMessage();
        LOG.error("arrowbeat's driver-side process did not start; it is started again (rate-limited as "
            + "restarts are) and the executors' agents start once it runs: {}", first.getMessage());
      }
      long checkMs = checkMs();
      supervisor.scheduleWithFixedDelay(this::supervise, checkMs, checkMs, java.util.concurrent.TimeUnit.MILLISECONDS);
      sc.addSparkListener(new ExecutorListener());
      // Driver-side code of this application may query the RM; Spark redacts "secret" keys.
      conf.set(Launch.SECRET, secret);
      Sidecar current = sidecar;
      String address = current == null ? null : published(current);
      executorSettings.putAll(settings);
      if (address == null) {
        executorSettings.put(RM_PENDING, "true");
      } else {
        executorSettings.put(Launch.RM_ADDRESS, address);
      }
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
   * A ready process's address, UI URL, certificate and pid, into the SparkConf (and the settings a
   * restart gets): at its first start, and again when a restart moved it. Returns the address.
   */
  private String published(Sidecar ready) {
    String address = ready.info().get("address");
    if (address == null || !ADDRESS.matcher(address).matches()) {
      throw new IllegalStateException("the driver-side process announced no valid address");
    }
    conf.set(Launch.RM_ADDRESS, address);
    publishUiUrl(ready.info());
    publishGeneratedTls(ready.info());
    conf.set("spark.arrowbeat.driver.pid", String.valueOf(ready.pid()));
    everStarted = true;
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
    if (url != null && UI_URL.matcher(url).matches()) {
      conf.set(UI_URL_KEY, url);
      LOG.info("arrowbeat live page at {} (the driver-side process logs it with its access token)", url);
    }
  }

  private void launch() throws Exception {
    long launching = System.currentTimeMillis();
    Sidecar started =
        Sidecar.start(
            "driver",
            Launch.command(conf, "spark_plugin.processes.driver"),
            driverSideSettings(settings),
            Launch.startupTimeoutMs(conf));
    started.onCommand(command -> handle(sc, command));
    started.onMetrics(metrics::accept);
    lastAnswer = null;
    startedWallMs = launching;
    supervision.launched(Supervision.Policy.from(started.info()), nowMs());
    started.onAlive(
        answer -> {
          if (sidecar == started) { // a late line of a replaced process changes nothing
            lastAnswer = answer;
            supervision.answered();
          }
        });
    started.onPulse(() -> supervision.pulsed(nowMs()));
    // Off the protocol thread: the supervisor restarts it (now, or when the rate limit allows).
    started.onUnexpectedExit(() -> wake());
    sidecar = started;
    lastInfo = started.info();
    started.startPulses(Launch.pulseMs(started.info()), () -> 0);
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

  private static long nowMs() {
    return System.nanoTime() / 1_000_000;
  }

  /** How often the supervisor checks: every pulse interval, within 100 ms to 1 s. */
  private long checkMs() {
    Sidecar current = sidecar;
    long pulseMs = current == null ? 1000 : Launch.pulseMs(current.info());
    return Math.max(100, Math.min(1000, pulseMs <= 0 ? 1000 : pulseMs));
  }

  private void wake() {
    if (!shuttingDown) {
      try {
        supervisor.execute(this::supervise);
      } catch (java.util.concurrent.RejectedExecutionException e) {
        LOG.debug("arrowbeat supervisor stopped: {}", e.toString());
      }
    }
  }

  /**
   * Supervision, like a Flink ResourceManager fail-over: on the supervisor thread, every check
   * interval and at once when the driver-side process exits. A process that exited, or that left a
   * pulse unanswered for longer than the hang bound ({@link Supervision}; then it is SIGKILLed by
   * pid first, so that it cannot keep the port), is started again on the same port and with the
   * same UI token, so agents find it where they were told (they see its new epoch and register
   * again); restarts are rate-limited by a sliding window and a failed one is retried after a
   * backoff, for as long as the application runs. The new process gets the gap it must record
   * ({@code spark_plugin.history.gaps}): where the old one's complete history ended and how many
   * rows it held uncommitted, from its last answer.
   */
  private void supervise() {
    try {
      superviseOnce();
    } catch (Throwable t) { // the supervisor must outlive anything one round throws
      LOG.error("arrowbeat's supervision of its driver-side process failed this round: {}", t.toString());
    }
  }

  private void superviseOnce() {
    if (shuttingDown) {
      return;
    }
    Sidecar current = sidecar;
    long now = nowMs();
    if (current != null) {
      String cause;
      if (current.isAlive()) {
        if (!supervision.hung(now, checkMs())) {
          return;
        }
        cause = "hung: no answer to the JVM's pulse for " + supervision.silentMs(now)
            + " ms (bound " + supervision.policy().hangMs() + " ms); killed pid " + current.pid();
        LOG.error("arrowbeat's driver-side process (pid {}) is hung: no answer to the pulse for {} ms; "
            + "killing and restarting it", current.pid(), supervision.silentMs(now));
        current.kill(5000);
      } else {
        cause = "exited with status " + current.exitCode();
      }
      retire(current, cause);
    }
    if (sidecar != null || settings == null || appFailed()) {
      return;
    }
    long at = supervision.nextRestartAt(nowMs());
    if (at > nowMs()) {
      if (restartWaitLogged != at) {
        restartWaitLogged = at;
        LOG.warn("arrowbeat's driver-side process is down; the next restart waits {} ms (at most {} "
            + "restarts per {} ms, and a backoff after a failed one)", at - nowMs(),
            supervision.policy().maxRestarts(), supervision.policy().windowMs());
      }
      return;
    }
    restart();
  }

  /** The previous process is gone: what its successor must record as the gap. */
  private void retire(Sidecar gone, String cause) {
    sidecar = null;
    Protocol.Alive answer = lastAnswer;
    boolean carried = gapCause != null;
    if (answer != null && answer.completeUntilMs() > 0 && !(carried && answer.completeUntilMs() == gapFromMs)) {
      gapFromMs = answer.completeUntilMs();
      gapUnsavedRows = answer.unsavedRows();
      gapCause = cause;
    } else if (carried) { // it never committed the gap it carried: the gap goes on, from its start
      gapUnsavedRows = answer == null ? gapUnsavedRows : answer.unsavedRows();
      gapCause = gapCause + "; then the restarted process " + cause;
    } else { // it never answered (or kept no history): the gap starts at its start at the latest
      gapFromMs = answer == null ? startedWallMs : 0;
      gapUnsavedRows = 0;
      gapCause = cause;
    }
    if (gapCause.length() > MAX_CAUSE_CHARS) {
      gapCause = "..." + gapCause.substring(gapCause.length() - MAX_CAUSE_CHARS + 3);
    }
    LOG.warn("arrowbeat's driver-side process (pid {}) {}", gone.pid(), cause);
  }

  /** Without an application context (init failed) there is nothing to supervise. */
  private boolean appFailed() {
    return conf == null || metrics == null;
  }

  /**
   * One restart attempt, on the same port (another if it is taken: agents ask for the new address)
   * and UI port; a failure is retried after the backoff. Before any process was ready, a retried
   * first start, on the configured ports.
   */
  private void restart() {
    Map<String, String> info = lastInfo;
    supervision.attempting(nowMs());
    restarts++;
    try {
      String address = info.get("address");
      if (address != null) {
        settings.put("spark.arrowbeat.rm.port", address.substring(address.lastIndexOf(':') + 1));
        settings.put(RESTART_ANY_PORT, "true");
      }
      String ui = info.get("ui_url");
      if (ui != null && UI_URL.matcher(ui).matches()) { // same port, same token: the logged URL stays valid
        settings.put("spark.arrowbeat.ui.port", ui.substring(ui.lastIndexOf(':') + 1, ui.length() - 1));
      }
      if (appId != null) {
        settings.put("spark.app.id", appId);
      }
      settings.put(GAP_FROM_MS, String.valueOf(gapFromMs));
      settings.put(GAP_UNSAVED_ROWS, String.valueOf(gapUnsavedRows));
      settings.put(GAP_CAUSE, gapCause == null ? "unknown" : gapCause);
      LOG.warn("{} arrowbeat's driver-side process on {} (attempt {})",
          everStarted ? "restarting" : "starting", address == null ? "its configured port" : address,
          restarts);
      launch();
      supervision.succeeded();
      restartWaitLogged = -1;
      boolean first = !everStarted;
      String now = published(sidecar);
      if (first) {
        LOG.warn("arrowbeat's driver-side process runs on {} after a failed first start; executors' "
            + "agents start once they ask for its address", now);
      } else if (!now.equals(address)) {
        LOG.warn("arrowbeat's driver-side process could not bind {} again and serves on {}: each "
            + "executor's agent is told when it asks (it does while it cannot reach the RM)", address, now);
      }
    } catch (Throwable t) {
      supervision.failed(nowMs());
      LOG.error("arrowbeat's driver-side process could not be {} (retried in {} ms): {}",
          everStarted ? "restarted" : "started", Math.max(0, supervision.nextRestartAt(nowMs()) - nowMs()),
          t.getMessage());
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
    if (Protocol.RM_ADDRESS_QUERY.equals(message)) { // an executor plugin: where is the RM now?
      Sidecar current = sidecar;
      String address = current == null || !everStarted ? null : current.info().get("address");
      return address != null && ADDRESS.matcher(address).matches() ? address : "";
    }
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
   * The actions the driver-side process may ask of Spark: {@code kill-executor <id>} (for an
   * executor whose map outputs are lost), {@code lost-executor <id>} (a heartbeat timeout with
   * {@code spark.arrowbeat.onHeartbeatTimeout=kill}: the same kill, then {@link #declareLost})
   * and {@code kill-task <task attempt id>} ({@code spark.arrowbeat.onStuckTask=kill}). Only
   * commands from the driver-side process's protocol channel get here, already validated ({@link
   * Protocol#parseCommand}). What became of a replacement goes back to it ({@link
   * Protocol#executorReplacement}): it charged its budget for lost outputs and refunds a refused one.
   */
  private void handle(SparkContext sc, Protocol.Command command) {
    if (Protocol.KILL_EXECUTOR.equals(command.verb()) || Protocol.LOST_EXECUTOR.equals(command.verb())) {
      String executorId = command.argument();
      boolean lost = Protocol.LOST_EXECUTOR.equals(command.verb());
      // Off the protocol pump: a kill waits on the cluster manager (Spark's HeartbeatReceiver
      // kills from its own thread for the same reason).
      replacer.execute(
          () -> {
            Protocol.Replacement outcome = replace(sc, executorId);
            LOG.warn("arrowbeat asked Spark to kill and replace executor {}: {}", executorId, text(outcome));
            if (lost && outcome == Protocol.Replacement.ACCEPTED) {
              declareLost(sc, executorId);
            }
            forward(Protocol.executorReplacement(executorId, outcome));
          });
    } else if (Protocol.KILL_TASK.equals(command.verb())) {
      long taskId = Long.parseLong(command.argument());
      // Off the protocol pump: killTaskAttempt takes the task scheduler's lock.
      replacer.execute(() -> killTask(sc, taskId));
    }
  }

  /**
   * {@code lost-executor} (a heartbeat timeout with {@code onHeartbeatTimeout=kill}), once the kill
   * was accepted: Spark's task scheduler is told the executor is lost, so the attempts running
   * there are resubmitted now rather than when the process is gone (a frozen JVM cannot act on
   * the cluster manager's SIGTERM; the Worker waits out its grace before SIGKILL). After the kill,
   * as Spark's own HeartbeatReceiver does (kill, then the backend's removal with the same
   * reason): an accepted kill has marked the executor pending removal, so its cores are no longer
   * offered, and the task scheduler, which adds back any executor it is offered, cannot send a
   * task to the frozen JVM meanwhile. Its map outputs are forgotten as for any lost process
   * ({@link SparkInternals#executorLost}).
   */
  private static void declareLost(SparkContext sc, String executorId) {
    try {
      Optional<Boolean> told = SparkInternals.executorLost(
          sc, executorId, "arrowbeat: executor heartbeats timed out (spark.arrowbeat.onHeartbeatTimeout=kill)");
      LOG.warn("arrowbeat told Spark's scheduler that executor {} is lost: {}", executorId,
          told.map(done -> done ? "its tasks are resubmitted now" : "no task scheduler")
              .orElse("not possible on this Spark (" + Internal.EXECUTOR_LOST.key()
                  + " is unavailable: see the warning at start-up)"));
    } catch (RuntimeException e) {
      LOG.warn("arrowbeat: telling Spark executor {} is lost failed: {}", executorId, e.toString());
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
    supervisor.shutdownNow();
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
