package arrowbeat;

import java.util.Map;
import java.util.concurrent.RejectedExecutionException;
import java.util.function.LongSupplier;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The driver-side process (arrowbeat's RM) from its first start to the application's end, like a
 * Flink ResourceManager fail-over: on one thread ({@link Scheduler}), every check interval and at
 * once when the process exits. A process that exited, or that left a pulse unanswered for longer
 * than its hang bound ({@link Supervision}; then it is SIGKILLed first, so that it cannot keep the
 * port), is started again on the same port and with the same UI token, so agents find it where
 * they were told (they see its new epoch and register again); restarts are rate-limited by a
 * sliding window and a failed one is retried after a backoff, for as long as the application runs.
 * The new process gets the gap it must record ({@link RestartGap}). A first start that failed but
 * may succeed later (a missed start-up timeout on a loaded driver; {@link
 * Supervision#retriesStart}) is retried the same way.
 *
 * <p>No Spark here: {@link ArrowBeatDriverPlugin} hands in what only it can do ({@link Plugin}:
 * start a process with its commands wired, publish a ready one's address into the SparkConf), a
 * monotonic {@link Clock} and a wall clock, so the JUnit tests drive every decision with fakes.
 */
final class RmSupervisor {
  private static final Logger LOG = LoggerFactory.getLogger(RmSupervisor.class);
  /** Set for a restart: if the old port is taken, the RM serves on another (driver.py reads it). */
  static final String RESTART_ANY_PORT = "arrowbeat.rm.restart.anyPort";
  /** The live page's URL as the driver-side process announces it: no token, no path. */
  static final Pattern UI_URL = Pattern.compile("https?://[A-Za-z0-9.\\-\\[\\]:]{1,253}:[0-9]{1,5}/");
  /** How long a kill of a hung process waits for its end. */
  static final long KILL_WAIT_MS = 5000;

  /** What only the driver plugin can do (Spark's conf), for the supervisor. */
  interface Plugin {
    /**
     * Starts the driver-side process with {@code settings} (plus what only the driver-side process
     * gets), its commands and metrics wired; throws if it is not ready within the start-up timeout.
     */
    Supervised start(Map<String, String> settings) throws Exception;

    /**
     * A ready process's address, UI URL, certificate and pid, into the SparkConf (and the settings
     * a restart gets). Returns the address; throws {@link IllegalStateException} without a valid one.
     */
    String publish(Supervised ready);
  }

  private final Plugin plugin;
  /** The settings every start gets; a restart adds its port, the gap and the application id. */
  private final Map<String, String> settings;
  private final SparkExecutors executors;
  private final Clock clock;
  private final LongSupplier wallMs;
  private final Scheduler scheduler;
  /** Hang and restart decisions (pure; this class acts on them). */
  private final Supervision supervision = new Supervision(Supervision.Policy.DEFAULT);
  private final RestartGap gap = new RestartGap();
  private volatile Supervised sidecar;
  /** The current process's last answer, and its start (wall clock ms): the gap a restart records. */
  private volatile Protocol.Alive lastAnswer;
  /** The ready line of the last process that was ready: address, UI URL, supervision numbers. */
  private volatile Map<String, String> lastInfo = Map.of();
  private long startedWallMs;
  private int restarts;
  private long restartWaitLogged = -1;
  /** Whether a driver-side process was ever ready (else a restart is a retried first start). */
  private volatile boolean everStarted;
  private volatile String appId;
  private volatile boolean shuttingDown;

  RmSupervisor(
      Plugin plugin, Map<String, String> settings, SparkExecutors executors, Clock clock,
      LongSupplier wallMs, Scheduler scheduler) {
    this.plugin = plugin;
    this.settings = settings;
    this.executors = executors;
    this.clock = clock;
    this.wallMs = wallMs;
    this.scheduler = scheduler;
  }

  /**
   * The first start. One that failed but may succeed later is retried by {@link #supervise} (the
   * executors' agents start once it runs); one that cannot is thrown to the plugin.
   */
  void start() throws Throwable {
    try {
      launch();
    } catch (Throwable first) {
      if (!Supervision.retriesStart(first)) {
        throw first;
      }
      // A loaded driver that missed the start-up timeout, say: retried like a restart.
      supervision.attempting(clock.nowMs());
      supervision.failed(clock.nowMs());
      gap.firstStartFailed(wallMs.getAsLong(), first.getMessage()); // nothing is monitored until one runs
      LOG.error("arrowbeat's driver-side process did not start; it is started again (rate-limited as "
          + "restarts are) and the executors' agents start once it runs: {}", first.getMessage());
    }
  }

  /** The checks every interval, from now on. */
  void startChecks() {
    scheduler.every(this::supervise, checkMs());
  }

  /** The first start's address, published; null while no process runs (the first start failed). */
  String publishFirst() {
    Supervised current = sidecar;
    return current == null ? null : publish(current);
  }

  private String publish(Supervised ready) {
    String address = plugin.publish(ready);
    everStarted = true;
    return address;
  }

  private void launch() throws Exception {
    long launching = wallMs.getAsLong();
    Supervised started = plugin.start(settings);
    lastAnswer = null;
    startedWallMs = launching;
    supervision.launched(Supervision.Policy.from(started.info()), clock.nowMs());
    started.onAlive(
        answer -> {
          if (sidecar == started) { // a late line of a replaced process changes nothing
            lastAnswer = answer;
            supervision.answered();
          }
        });
    started.onPulse(() -> supervision.pulsed(clock.nowMs()));
    // Off the protocol thread: the supervisor restarts it (now, or when the rate limit allows).
    started.onUnexpectedExit(this::wake);
    sidecar = started;
    lastInfo = started.info();
    started.startPulses(Launch.pulseMs(started.info()), () -> 0);
    // A restarted process knows nothing of Spark's executors yet: tell it those alive now.
    executors.replay(started::send);
  }

  /** The application's id (known only after the plugin's init): a restart gets it; told now. */
  void appId(String id) {
    appId = id;
    forward(Protocol.app(id));
  }

  /** One line to the driver-side process running now, if any. */
  void forward(String line) {
    Supervised current = sidecar;
    if (current != null) {
      current.send(line);
    }
  }

  /**
   * An executor plugin's message to the driver plugin ({@code rm} null when arrowbeat is off):
   * the RM's address now ({@link Protocol#RM_ADDRESS_QUERY}; "" while no process is ready), or a
   * line relayed to the driver-side process ({@link Protocol#relayed}: true if it got it; anything
   * malformed is logged and ignored).
   */
  static Object receive(RmSupervisor rm, Object message) {
    Supervised current = rm == null ? null : rm.sidecar;
    if (Protocol.RM_ADDRESS_QUERY.equals(message)) { // an executor plugin: where is the RM now?
      String address = current == null || !rm.everStarted ? null : current.info().get("address");
      return address != null && Protocol.ADDRESS.matcher(address).matches() ? address : "";
    }
    String line = Protocol.relayed(message);
    if (line == null) {
      LOG.warn("arrowbeat driver plugin ignored a malformed message from an executor");
      return Boolean.FALSE;
    }
    if (current == null) {
      return Boolean.FALSE;
    }
    current.send(line);
    return Boolean.TRUE;
  }

  /** How often the supervisor checks: every pulse interval, within 100 ms to 1 s. */
  long checkMs() {
    Supervised current = sidecar;
    return Supervision.checkMs(current == null ? 1000 : Launch.pulseMs(current.info()));
  }

  private void wake() {
    if (!shuttingDown) {
      try {
        scheduler.schedule(this::supervise, 0);
      } catch (RejectedExecutionException e) {
        LOG.debug("arrowbeat supervisor stopped: {}", e.toString());
      }
    }
  }

  /** One round of supervision (the scheduler's thread); it outlives anything a round throws. */
  void supervise() {
    try {
      superviseOnce();
    } catch (Throwable t) {
      LOG.error("arrowbeat's supervision of its driver-side process failed this round: {}", t.toString());
    }
  }

  private void superviseOnce() {
    if (shuttingDown) {
      return;
    }
    Supervised current = sidecar;
    long now = clock.nowMs();
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
        current.kill(KILL_WAIT_MS);
      } else {
        cause = "exited with status " + current.exitCode();
      }
      retire(current, cause);
    }
    if (sidecar != null) {
      return;
    }
    long at = supervision.nextRestartAt(clock.nowMs());
    if (at > clock.nowMs()) {
      if (restartWaitLogged != at) {
        restartWaitLogged = at;
        LOG.warn("arrowbeat's driver-side process is down; the next restart waits {} ms (at most {} "
            + "restarts per {} ms, and a backoff after a failed one)", at - clock.nowMs(),
            supervision.policy().maxRestarts(), supervision.policy().windowMs());
      }
      return;
    }
    restart();
  }

  /** The previous process is gone: what its successor must record as the gap. */
  private void retire(Supervised gone, String cause) {
    sidecar = null;
    gap.retire(lastAnswer, startedWallMs, cause);
    LOG.warn("arrowbeat's driver-side process (pid {}) {}", gone.pid(), cause);
  }

  /**
   * What a restart changes in the settings: the last ready process's port (another if it is
   * taken: agents ask for the new address) and UI port (same token: the logged URL stays valid),
   * the application id once known, and the gap. Before any process was ready (a retried first
   * start), the configured ports.
   */
  static void restartSettings(
      Map<String, String> settings, Map<String, String> lastInfo, String appId, RestartGap gap) {
    String address = lastInfo.get("address");
    if (address != null) {
      settings.put("spark.arrowbeat.rm.port", address.substring(address.lastIndexOf(':') + 1));
      settings.put(RESTART_ANY_PORT, "true");
    }
    String ui = lastInfo.get("ui_url");
    if (ui != null && UI_URL.matcher(ui).matches()) {
      settings.put("spark.arrowbeat.ui.port", ui.substring(ui.lastIndexOf(':') + 1, ui.length() - 1));
    }
    if (appId != null) {
      settings.put("spark.app.id", appId);
    }
    gap.into(settings);
  }

  /** One restart attempt ({@link #restartSettings}); a failure is retried after the backoff. */
  private void restart() {
    Map<String, String> info = lastInfo;
    supervision.attempting(clock.nowMs());
    restarts++;
    try {
      String address = info.get("address");
      restartSettings(settings, info, appId, gap);
      LOG.warn("{} arrowbeat's driver-side process on {} (attempt {})",
          everStarted ? "restarting" : "starting", address == null ? "its configured port" : address,
          restarts);
      launch();
      supervision.succeeded();
      restartWaitLogged = -1;
      boolean first = !everStarted;
      String now = publish(sidecar);
      if (first) {
        LOG.warn("arrowbeat's driver-side process runs on {} after a failed first start; executors' "
            + "agents start once they ask for its address", now);
      } else if (!now.equals(address)) {
        LOG.warn("arrowbeat's driver-side process could not bind {} again and serves on {}: each "
            + "executor's agent is told when it asks (it does while it cannot reach the RM)", address, now);
      }
    } catch (Throwable t) {
      supervision.failed(clock.nowMs());
      LOG.error("arrowbeat's driver-side process could not be {} (retried in {} ms): {}",
          everStarted ? "restarted" : "started",
          Math.max(0, supervision.nextRestartAt(clock.nowMs()) - clock.nowMs()), t.getMessage());
    }
  }

  /** The plugin's init failed after a start: the process is stopped at once. */
  void abandon() {
    Supervised current = sidecar;
    if (current != null) {
      current.stop(0);
      sidecar = null;
    }
  }

  /** The application ends: no round acts from now on (called before the scheduler stops). */
  void shuttingDown() {
    shuttingDown = true;
  }

  /** Stops the running process (after {@link #shuttingDown}). */
  void stop() {
    Supervised current = sidecar;
    if (current != null) {
      try {
        current.stop(Launch.STOP_GRACE_MS);
      } catch (Throwable t) {
        LOG.warn("arrowbeat driver-side process did not stop cleanly: {}", t.toString());
      }
      sidecar = null;
    }
  }
}
