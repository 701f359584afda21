package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The driver-side process (the RM) on a fake clock: its first start and the retries of a failed
 * one, its restarts after an exit or a hang on the same ports with the gap to record, the restart
 * window and backoff from its ready line, and the executor plugins' asks for its address. No
 * Spark, no process.
 */
class RmSupervisorTest {
  private static final long WALL = 1_700_000_000_000L;
  /** A ready line: address, live page, pulses every 500 ms, hung after 4 s, 3 restarts per 10 s. */
  private static final String[] READY = {
    "address=10.0.0.1:4040", "ui_url=http://10.0.0.1:8090/", "pulse_ms=500", "hang_ms=4000",
    "restart_max=3", "restart_window_ms=10000", "restart_backoff_ms=8000"
  };

  /** The driver plugin as the supervisor sees it: every start's outcome queued by the test. */
  private static final class FakePlugin implements RmSupervisor.Plugin {
    final Deque<Object> starts = new ArrayDeque<>();
    final List<Map<String, String>> settingsSeen = new ArrayList<>();
    final List<String> published = new ArrayList<>();

    @Override
    public Supervised start(Map<String, String> settings) throws Exception {
      settingsSeen.add(new LinkedHashMap<>(settings));
      Object next = starts.removeFirst();
      if (next instanceof Exception failure) {
        throw failure;
      }
      return (Supervised) next;
    }

    @Override
    public String publish(Supervised ready) {
      String address = ready.info().get("address");
      if (address == null) {
        throw new IllegalStateException("the driver-side process announced no valid address");
      }
      published.add(address);
      return address;
    }
  }

  private FakeClock clock;
  private long wall;
  private FakeScheduler scheduler;
  private FakePlugin plugin;
  private SparkExecutors executors;
  private Map<String, String> settings;
  private RmSupervisor rm;

  @BeforeEach
  void setUp() {
    clock = new FakeClock(0);
    wall = WALL;
    scheduler = new FakeScheduler(clock);
    plugin = new FakePlugin();
    executors = new SparkExecutors();
    settings = new LinkedHashMap<>(Map.of("spark.arrowbeat.rm.port", "0"));
    rm = new RmSupervisor(plugin, settings, executors, clock, () -> wall + clock.nowMs(), scheduler);
  }

  private static Sidecar.SidecarException timeout() {
    return new Sidecar.SidecarException("driver did not report ready within 30000 ms", -1);
  }

  /** The first start, ready, published; the checks running. */
  private FakeProcess running() throws Throwable {
    FakeProcess first = new FakeProcess(10, READY);
    plugin.starts.add(first);
    rm.start();
    rm.startChecks();
    assertEquals("10.0.0.1:4040", rm.publishFirst());
    return first;
  }

  @Test
  void aFirstStartIsPublishedPulsedAndCheckedEveryPulse() throws Throwable {
    FakeProcess first = running();
    assertEquals(List.of("10.0.0.1:4040"), plugin.published);
    assertEquals(500, first.pulseIntervalMs);
    assertEquals(List.of(500L), scheduler.periods);
    assertEquals("10.0.0.1:4040", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
  }

  @Test
  void aFailedFirstStartIsRetriedOnTheConfiguredPortsWithTheGapFromItsFailure() throws Throwable {
    plugin.starts.add(timeout());
    rm.start(); // not thrown: retried
    rm.startChecks();
    assertNull(rm.publishFirst()); // the executors are told the RM is pending
    assertEquals("", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
    assertEquals(List.of(1000L), scheduler.periods); // no process: checks every second
    FakeProcess late = new FakeProcess(11, READY);
    plugin.starts.add(late);
    scheduler.runUntil(999);
    assertEquals(1, plugin.settingsSeen.size()); // the backoff: 1 s after the failure
    scheduler.runUntil(1000);
    Map<String, String> retried = plugin.settingsSeen.get(1);
    assertEquals("0", retried.get("spark.arrowbeat.rm.port")); // as configured: no ready process yet
    assertFalse(retried.containsKey(RmSupervisor.RESTART_ANY_PORT));
    assertEquals(String.valueOf(WALL), retried.get(RestartGap.FROM_MS));
    assertEquals("the first start failed: driver did not report ready within 30000 ms",
        retried.get(RestartGap.CAUSE));
    assertEquals(List.of("10.0.0.1:4040"), plugin.published);
    assertEquals("10.0.0.1:4040", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
  }

  @Test
  void aFirstStartThatCannotSucceedIsThrown() {
    plugin.starts.add(new Launch.MissingInterpreterException("spark.arrowbeat.driver.python=x: no python"));
    assertThrows(Launch.MissingInterpreterException.class, rm::start);
    plugin.starts.add(new Sidecar.SidecarException("refused its settings", Supervision.NOT_STARTED));
    assertThrows(Sidecar.SidecarException.class, rm::start);
  }

  @Test
  void anExitedProcessIsRestartedAtOnceOnItsPortsWithTheGapItsLastAnswerGives() throws Throwable {
    FakeProcess first = running();
    rm.appId("app-1");
    assertEquals(List.of("app app-1"), first.sent);
    executors.added("1", "host-a");
    executors.added("2", "host-b");
    first.pulse();
    first.answer(WALL - 2000, 17);
    FakeProcess second = new FakeProcess(12, READY);
    plugin.starts.add(second);
    first.exit(1, "");
    scheduler.runDue(); // woken by the exit, not a check interval later
    Map<String, String> restart = plugin.settingsSeen.get(1);
    assertEquals("4040", restart.get("spark.arrowbeat.rm.port"));
    assertEquals("true", restart.get(RmSupervisor.RESTART_ANY_PORT));
    assertEquals("8090", restart.get("spark.arrowbeat.ui.port"));
    assertEquals("app-1", restart.get("spark.app.id"));
    assertEquals(String.valueOf(WALL - 2000), restart.get(RestartGap.FROM_MS));
    assertEquals("17", restart.get(RestartGap.UNSAVED_ROWS));
    assertEquals("exited with status 1", restart.get(RestartGap.CAUSE));
    // The new process hears of the executors alive now.
    assertEquals(List.of("executor-added 1 host-a", "executor-added 2 host-b"), second.sent);
    rm.forward("executor-removed 2 spark lost");
    assertEquals("executor-removed 2 spark lost", second.sent.get(2));
  }

  @Test
  void aHungProcessIsKilledAndRestartedWithTheCause() throws Throwable {
    FakeProcess first = running();
    first.pulse(); // at 0; never answered
    plugin.starts.add(new FakeProcess(13, READY));
    scheduler.runUntil(4000);
    assertEquals(-1, first.killedWithWaitMs); // 4 s is the bound, not past it
    scheduler.runUntil(4500);
    assertEquals(RmSupervisor.KILL_WAIT_MS, first.killedWithWaitMs);
    assertEquals("hung: no answer to the JVM's pulse for 4500 ms (bound 4000 ms); killed pid 10",
        plugin.settingsSeen.get(1).get(RestartGap.CAUSE));
    // It never answered: the gap starts at its start.
    assertEquals(String.valueOf(WALL), plugin.settingsSeen.get(1).get(RestartGap.FROM_MS));
  }

  @Test
  void restartsFollowTheWindowAndBackoffTheReadyLineAnnounced() throws Throwable {
    FakeProcess current = running();
    // Three restarts per 10 s: deaths at 1, 2, 3 s restart at once, the fourth (4 s) waits for 11 s.
    for (int i = 1; i <= 4; i++) {
      scheduler.runUntil(i * 1000L);
      FakeProcess next = new FakeProcess(20 + i, READY);
      plugin.starts.add(next);
      current.exit(1, "");
      scheduler.runDue();
      if (i < 4) {
        assertEquals(i + 1, plugin.settingsSeen.size(), "restart " + i + " at once");
        current = next;
      }
    }
    assertEquals(4, plugin.settingsSeen.size());
    scheduler.runUntil(10_999);
    assertEquals(4, plugin.settingsSeen.size());
    scheduler.runUntil(11_000);
    assertEquals(5, plugin.settingsSeen.size());
  }

  @Test
  void aFailedRestartIsRetriedAfterADoublingBackoffCappedByThePolicy() throws Throwable {
    FakeProcess first = running();
    List<Long> attempts = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      plugin.starts.add(timeout());
    }
    plugin.starts.add(new FakeProcess(30, READY));
    first.exit(1, "");
    scheduler.runDue();
    attempts.add(clock.nowMs());
    long seen = plugin.settingsSeen.size();
    for (long at = 0; at <= 60_000; at += 100) {
      scheduler.runUntil(at);
      if (plugin.settingsSeen.size() != seen) {
        seen = plugin.settingsSeen.size();
        attempts.add(clock.nowMs());
      }
    }
    // At once (0), then 1 s, 2 s, 4 s after each failure; the fourth attempt in 10 s waits for
    // the first to leave the window (10 s); then 8 s (the announced cap).
    assertEquals(List.of(0L, 1000L, 3000L, 10_000L, 18_000L, 26_000L), attempts);
    assertTrue(plugin.settingsSeen.get(1).get(RestartGap.CAUSE).startsWith("exited with status 1"));
  }

  @Test
  void aRestartOnAnotherPortIsWhatTheExecutorsAreToldWhenTheyAsk() throws Throwable {
    FakeProcess first = running();
    FakeProcess moved = new FakeProcess(40, "address=10.0.0.1:4999", "pulse_ms=500", "hang_ms=4000");
    plugin.starts.add(moved);
    first.exit(1, "");
    scheduler.runDue();
    assertEquals(List.of("10.0.0.1:4040", "10.0.0.1:4999"), plugin.published);
    assertEquals("10.0.0.1:4999", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
  }

  @Test
  void aReplacedProcesssLateAnswerIsNotTheGap() throws Throwable {
    FakeProcess first = running();
    first.answer(WALL - 5000, 3);
    FakeProcess second = new FakeProcess(50, READY);
    plugin.starts.add(second);
    first.exit(1, "");
    scheduler.runDue();
    second.answer(WALL + 1000, 4);
    first.answer(WALL - 1, 99); // late: it is gone
    plugin.starts.add(new FakeProcess(51, READY));
    second.exit(1, "");
    scheduler.runDue();
    Map<String, String> third = plugin.settingsSeen.get(2);
    assertEquals(String.valueOf(WALL + 1000), third.get(RestartGap.FROM_MS));
    assertEquals("4", third.get(RestartGap.UNSAVED_ROWS));
  }

  @Test
  void executorMessagesAreRelayedOnlyWhenWellFormedAndAProcessRuns() throws Throwable {
    String lost = "executor-outputs-lost 2 agent-exited 5";
    assertEquals(Boolean.FALSE, RmSupervisor.receive(null, lost)); // arrowbeat off
    assertEquals("", RmSupervisor.receive(null, Protocol.RM_ADDRESS_QUERY));
    FakeProcess first = running();
    assertEquals(Boolean.TRUE, RmSupervisor.receive(rm, lost));
    assertEquals(Boolean.FALSE, RmSupervisor.receive(rm, "executor-outputs-lost driver agent-exited 5"));
    assertEquals(Boolean.FALSE, RmSupervisor.receive(rm, "kill-executor 2"));
    assertEquals(Boolean.FALSE, RmSupervisor.receive(rm, 42));
    assertEquals(Boolean.FALSE, RmSupervisor.receive(rm, null));
    assertEquals(List.of(lost), first.sent);
  }

  @Test
  void anAddressThatIsNoAddressIsNeverHandedOut() throws Throwable {
    plugin.starts.add(new FakeProcess(60, "address=not an address", "pulse_ms=500"));
    rm.start();
    // The plugin publishes it (here: as is); the answer to an executor is checked again.
    rm.publishFirst();
    assertEquals("", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
  }

  @Test
  void onceTheApplicationEndsNothingIsRestarted() throws Throwable {
    FakeProcess first = running();
    rm.shuttingDown();
    first.exit(1, "");
    scheduler.runUntil(60_000);
    assertEquals(1, plugin.settingsSeen.size());
    rm.stop();
    assertEquals(Launch.STOP_GRACE_MS, first.stoppedWithGraceMs);
  }

  @Test
  void aPluginThatGivesUpAfterTheStartStopsTheProcessAtOnce() throws Throwable {
    FakeProcess first = running();
    rm.abandon();
    assertEquals(0, first.stoppedWithGraceMs);
    assertEquals("", RmSupervisor.receive(rm, Protocol.RM_ADDRESS_QUERY));
  }

  @Test
  void aRoundThatThrowsLeavesTheSupervisorRunning() throws Throwable {
    int[] asked = {0};
    FakeProcess flaky = new FakeProcess(70, READY) {
      @Override
      public boolean isAlive() {
        if (asked[0]++ == 0) {
          throw new IllegalStateException("boom");
        }
        return false; // then it is gone
      }
    };
    plugin.starts.add(flaky);
    rm.start();
    rm.startChecks();
    plugin.starts.add(new FakeProcess(71, READY));
    scheduler.runUntil(500); // the round throws
    assertEquals(1, plugin.settingsSeen.size());
    scheduler.runUntil(1000); // the next one still runs, and restarts it
    assertEquals(2, plugin.settingsSeen.size());
  }
}
