package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The executor's agent on a fake clock: its first start and the retries of a failed one, its
 * restarts after an exit or a hang, the five-starts-per-five-minutes window and the backoff of a
 * failed restart, and what the driver hears of each. No Spark, no process: {@link FakeProcess}
 * agents, a {@link FakeScheduler} in place of the restarter thread.
 */
class AgentSupervisorTest {
  private static final String EXECUTOR = "3";
  /** An agent's ready line: pulses every 500 ms, hung after 5 s without an answer. */
  private static final String[] READY = {"pulse_ms=500", "hang_ms=5000"};

  /** The executor plugin, as the supervisor sees it: every start's outcome queued by the test. */
  private static final class FakePlugin implements AgentSupervisor.Plugin {
    final Deque<Object> launches = new ArrayDeque<>();
    final Deque<String> rmAnswers = new ArrayDeque<>();
    boolean rmKnown = true;
    int launched;
    int asks;
    final List<String> told = new ArrayList<>();
    final List<String> lost = new ArrayList<>();
    final List<String> lostLater = new ArrayList<>();
    final List<Throwable> notStarted = new ArrayList<>();
    final List<Supervised> firstStarted = new ArrayList<>();
    Runnable duringLaunch = () -> {};

    @Override
    public Supervised launch() throws Exception {
      launched++;
      duringLaunch.run();
      Object next = launches.removeFirst();
      if (next instanceof Exception failure) {
        throw failure;
      }
      return (Supervised) next;
    }

    @Override
    public boolean rmKnown() {
      return rmKnown;
    }

    @Override
    public String askRmAddress() {
      asks++;
      String answer = rmAnswers.isEmpty() ? null : rmAnswers.removeFirst();
      if (answer != null) {
        rmKnown = true;
      }
      return answer;
    }

    @Override
    public void tellDriver(String line) {
      told.add(line);
    }

    @Override
    public void reportLost(String reason) {
      lost.add(reason);
    }

    @Override
    public void reportLostLater(String reason) {
      lostLater.add(reason);
    }

    @Override
    public void notStarted(Throwable why) {
      notStarted.add(why);
    }

    @Override
    public void firstStarted(Supervised agent) {
      firstStarted.add(agent);
    }
  }

  private FakeClock clock;
  private FakeScheduler scheduler;
  private FakePlugin plugin;
  private AgentSupervisor supervisor;

  @BeforeEach
  void setUp() {
    clock = new FakeClock(1_000_000);
    scheduler = new FakeScheduler(clock);
    plugin = new FakePlugin();
    supervisor = new AgentSupervisor(EXECUTOR, plugin, clock, scheduler, () -> 2, () -> 7);
  }

  private static Sidecar.SidecarException timeout() {
    return new Sidecar.SidecarException("agent-3 did not report ready within 30000 ms", -1);
  }

  private long t(long offsetMs) {
    return 1_000_000 + offsetMs;
  }

  @Test
  void aFirstStartRunsTheAgentPulsesItAndStartsTheChecksOnce() throws Throwable {
    FakeProcess agent = new FakeProcess(101, READY);
    plugin.launches.add(agent);
    supervisor.start();
    assertSame(agent, supervisor.current());
    assertEquals(500, agent.pulseIntervalMs);
    assertEquals(List.of(agent), plugin.firstStarted);
    assertEquals(List.of(500L), scheduler.periods); // a hang check every pulse interval
    assertEquals(0, scheduler.pendingOnce());
    assertTrue(plugin.told.isEmpty() && plugin.notStarted.isEmpty());
  }

  @Test
  void aFailedFirstStartIsToldAndRetriedAfterTheBackoff() throws Throwable {
    FakeProcess agent = new FakeProcess(102, READY);
    plugin.launches.add(timeout());
    plugin.launches.add(agent);
    supervisor.start();
    assertNull(supervisor.current());
    assertEquals(1, plugin.notStarted.size()); // the driver shows the executor unmonitored now
    assertEquals(List.of(1000L), scheduler.delays); // 1 s after one failure
    scheduler.runUntil(t(999));
    assertEquals(1, plugin.launched);
    scheduler.runUntil(t(1000));
    assertEquals(2, plugin.launched);
    assertSame(agent, supervisor.current());
    assertEquals(List.of(agent), plugin.firstStarted);
  }

  @Test
  void aFirstStartThatCannotSucceedIsThrownAndNeverRetried() {
    plugin.launches.add(new Launch.MissingInterpreterException("spark.arrowbeat.python=x: no such executable"));
    assertThrows(Launch.MissingInterpreterException.class, supervisor::start);
    plugin.launches.add(new Sidecar.SidecarException("refused its settings", Supervision.NOT_STARTED));
    assertThrows(Sidecar.SidecarException.class, supervisor::start);
    assertEquals(0, scheduler.pendingOnce());
    assertTrue(plugin.notStarted.isEmpty()); // the plugin tells it, once, as it gives up
  }

  @Test
  void aRetriedFirstStartStopsAtAFailureThatCannotSucceed() throws Throwable {
    plugin.launches.add(timeout());
    plugin.launches.add(timeout());
    plugin.launches.add(new Sidecar.SidecarException("refused its settings", Supervision.NOT_STARTED));
    supervisor.start();
    scheduler.runUntil(t(60_000));
    assertEquals(3, plugin.launched);
    assertEquals(List.of(1000L, 2000L), scheduler.delays); // the backoff doubled, then no more
    assertEquals(2, plugin.notStarted.size());
    assertNull(supervisor.current());
  }

  @Test
  void whileTheRmIsPendingTheAgentStartsOnceAnAskReturnsItsAddress() throws Throwable {
    plugin.rmKnown = false; // and no answer queued: each ask finds the RM down
    FakeProcess agent = new FakeProcess(103, READY);
    plugin.launches.add(agent);
    supervisor.start();
    assertEquals(List.of(0L), scheduler.delays); // the first ask at once
    scheduler.runUntil(t(0));
    scheduler.runUntil(t(1000));
    scheduler.runUntil(t(3000));
    assertEquals(3, plugin.asks);
    assertEquals(0, plugin.launched);
    assertEquals(List.of(0L, 1000L, 2000L, 4000L), scheduler.delays); // backoff only
    plugin.rmAnswers.add("10.0.0.1:4040");
    scheduler.runUntil(t(7000));
    assertEquals(1, plugin.launched);
    assertSame(agent, supervisor.current());
    assertTrue(plugin.notStarted.isEmpty()); // a pending RM is no failed start
  }

  @Test
  void asksWhileTheRmIsPendingCountNoStartAgainstTheWindow() throws Throwable {
    plugin.rmKnown = false;
    supervisor.start();
    scheduler.runUntil(t(200_000)); // many asks, all unanswered
    assertTrue(plugin.asks >= 8, "asks " + plugin.asks);
    plugin.rmAnswers.add("10.0.0.1:4040");
    FakeProcess agent = new FakeProcess(104, READY);
    plugin.launches.add(agent);
    scheduler.runUntil(t(400_000));
    assertSame(agent, supervisor.current());
    // Five exits in a row now restart at once: no start was counted while the RM was pending.
    for (int i = 0; i < 4; i++) {
      FakeProcess next = new FakeProcess(110 + i, READY);
      plugin.launches.add(next);
      ((FakeProcess) supervisor.current()).exit(1, "boom");
      scheduler.runDue();
      assertSame(next, supervisor.current());
    }
    assertTrue(plugin.told.stream().allMatch(line -> line.split(" ")[3].equals("0")), plugin.told.toString());
  }

  @Test
  void anExitedAgentIsToldToTheDriverReportedAndRestartedAtOnce() throws Throwable {
    FakeProcess agent = new FakeProcess(105, READY);
    FakeProcess second = new FakeProcess(106, READY);
    plugin.launches.add(agent);
    plugin.launches.add(second);
    supervisor.start();
    agent.exit(137, "ignored: killed");
    assertEquals(List.of("executor-agent-down 3 105 0 agent exited (killed by signal 9)"), plugin.told);
    assertEquals(List.of("agent-exited"), plugin.lost);
    scheduler.runDue();
    assertSame(second, supervisor.current());
    assertEquals(1, plugin.firstStarted.size()); // the checks started once, with the first agent
    assertEquals(List.of(500L), scheduler.periods);
  }

  @Test
  void anAgentThatGaveUpIsToldWithItsLastLogLine() throws Throwable {
    FakeProcess agent = new FakeProcess(107, READY);
    plugin.launches.add(agent);
    plugin.launches.add(new FakeProcess(108, READY));
    supervisor.start();
    agent.exit(3, "the RM refused this executor's registration");
    assertEquals(
        List.of("executor-agent-down 3 107 0 agent exited (status 3): the RM refused this executor's registration"),
        plugin.told);
  }

  @Test
  void theSixthStartInFiveMinutesWaitsForTheOldestToLeaveTheWindow() throws Throwable {
    FakeProcess agent = new FakeProcess(200, READY);
    plugin.launches.add(agent);
    supervisor.start(); // the first start is not a restart: not counted
    for (int i = 1; i <= 5; i++) {
      scheduler.runUntil(t(i * 10_000L));
      FakeProcess next = new FakeProcess(200 + i, READY);
      plugin.launches.add(next);
      ((FakeProcess) supervisor.current()).exit(1, "");
      scheduler.runDue();
      assertSame(next, supervisor.current(), "restart " + i + " is at once");
    }
    // Restarts started at 10, 20, 30, 40 and 50 s: the sixth waits until 10 s + 5 min.
    scheduler.runUntil(t(60_000));
    FakeProcess sixth = new FakeProcess(206, READY);
    plugin.launches.add(sixth);
    ((FakeProcess) supervisor.current()).exit(1, "");
    String down = plugin.told.get(plugin.told.size() - 1);
    assertEquals("executor-agent-down 3 205 250000 agent exited (status 1)", down);
    scheduler.runUntil(t(309_999));
    assertEquals(6, plugin.launched);
    scheduler.runUntil(t(310_000));
    assertEquals(7, plugin.launched);
    assertSame(sixth, supervisor.current());
    // Refilled: later, with the window's starts gone, a restart is at once again.
    scheduler.runUntil(t(700_000));
    plugin.launches.add(new FakeProcess(207, READY));
    sixth.exit(1, "");
    assertTrue(plugin.told.get(plugin.told.size() - 1).startsWith("executor-agent-down 3 206 0 "));
  }

  @Test
  void aFailedRestartIsToldAndRetriedWithADoublingCappedBackoff() throws Throwable {
    FakeProcess agent = new FakeProcess(300, READY);
    plugin.launches.add(agent);
    supervisor.start();
    for (int i = 0; i < 7; i++) {
      plugin.launches.add(timeout());
    }
    FakeProcess back = new FakeProcess(301, READY);
    plugin.launches.add(back);
    agent.exit(1, "");
    scheduler.runUntil(t(600_000));
    assertSame(back, supervisor.current());
    List<String> delays = plugin.told.stream().map(line -> line.split(" ")[3]).toList();
    // At once, then 1, 2, 4, 8 s after each failure; the fifth attempt in five minutes (at 15 s)
    // makes the next wait for the first (at 0 s) to leave the window; then the 30 s cap.
    assertEquals(List.of("0", "1000", "2000", "4000", "8000", "285000", "30000", "30000"), delays);
    assertTrue(plugin.told.get(1).endsWith(
        "agent restart failed: agent-3 did not report ready within 30000 ms"), plugin.told.get(1));
    assertEquals(9, plugin.launched);
  }

  @Test
  void aHungAgentIsKilledReportedOnceAndRestarted() throws Throwable {
    FakeProcess agent = new FakeProcess(400, READY);
    FakeProcess second = new FakeProcess(401, READY);
    plugin.launches.add(agent);
    plugin.launches.add(second);
    supervisor.start();
    agent.pulse(); // at 0; never answered
    scheduler.runUntil(t(5000));
    assertEquals(-1, agent.killedWithWaitMs); // 5 s is the bound, not past it
    scheduler.runUntil(t(5500));
    assertEquals(AgentSupervisor.KILL_WAIT_MS, agent.killedWithWaitMs);
    assertEquals(List.of("executor-agent-down 3 400 0 " + AgentSupervisor.hungCause(5500, 5000)), plugin.told);
    assertEquals(List.of("agent-hung"), plugin.lostLater);
    // Its exit, seen after the kill, is the same report: not a second one.
    agent.exit(137, "");
    assertEquals(1, plugin.told.size());
    assertTrue(plugin.lost.isEmpty());
    scheduler.runDue();
    assertSame(second, supervisor.current());
  }

  @Test
  void answeredPulsesNeverConvict() throws Throwable {
    FakeProcess agent = new FakeProcess(500, READY);
    plugin.launches.add(agent);
    supervisor.start();
    for (long at = 0; at < 120_000; at += 500) {
      scheduler.runUntil(t(at));
      agent.pulse();
      scheduler.runUntil(t(at + 250));
      agent.answer(0, 0);
    }
    assertEquals(-1, agent.killedWithWaitMs);
    assertTrue(plugin.told.isEmpty());
  }

  @Test
  void aCheckThatRunsLateBecauseThisJvmWasPausedConvictsNobody() throws Throwable {
    FakeProcess agent = new FakeProcess(600, READY);
    plugin.launches.add(agent);
    supervisor.start();
    agent.pulse(); // at 0; the JVM then freezes for 30 s before it reads the answer
    scheduler.runUntil(t(500));
    clock.set(t(30_500));
    scheduler.runUntil(t(30_500)); // the first check after the pause: late, judges nothing
    assertEquals(-1, agent.killedWithWaitMs);
    agent.answer(0, 0); // read after the thaw
    scheduler.runUntil(t(60_000));
    assertEquals(-1, agent.killedWithWaitMs);
    // Unanswered from the thaw on: convicted a bound after the late check, not at once.
    agent.pulse();
    scheduler.runUntil(t(65_000));
    assertEquals(-1, agent.killedWithWaitMs);
    scheduler.runUntil(t(65_500));
    assertEquals(AgentSupervisor.KILL_WAIT_MS, agent.killedWithWaitMs);
  }

  @Test
  void aReplacedAgentsLateLinesChangeNothing() throws Throwable {
    FakeProcess agent = new FakeProcess(700, READY);
    FakeProcess second = new FakeProcess(701, READY);
    plugin.launches.add(agent);
    plugin.launches.add(second);
    supervisor.start();
    agent.exit(1, "");
    scheduler.runDue();
    second.pulse(); // the new agent's pulse, unanswered
    scheduler.runUntil(t(3000));
    agent.answer(0, 0); // a late answer of the old one does not end the new one's wait
    agent.pulse();
    scheduler.runUntil(t(5500));
    assertEquals(AgentSupervisor.KILL_WAIT_MS, second.killedWithWaitMs);
  }

  @Test
  void anAgentWithoutAHangBoundIsNeverCalledHung() throws Throwable {
    FakeProcess agent = new FakeProcess(800, "pulse_ms=500");
    plugin.launches.add(agent);
    supervisor.start();
    agent.pulse();
    scheduler.runUntil(t(600_000));
    assertEquals(-1, agent.killedWithWaitMs);
  }

  @Test
  void afterShutdownNothingIsToldOrRestarted() throws Throwable {
    FakeProcess agent = new FakeProcess(900, READY);
    plugin.launches.add(agent);
    supervisor.start();
    assertSame(agent, supervisor.shutdown());
    agent.exit(143, "");
    scheduler.runUntil(t(600_000));
    assertTrue(plugin.told.isEmpty() && plugin.lost.isEmpty());
    assertEquals(1, plugin.launched);
    assertNull(supervisor.current());
  }

  @Test
  void theJvmsShutdownMakesAnAgentsEndNoCrash() throws Throwable {
    FakeProcess agent = new FakeProcess(901, READY);
    plugin.launches.add(agent);
    supervisor.start();
    supervisor.shuttingDown(); // the shutdown hook: the agent stays for the plugin's stop
    agent.exit(0, "");
    scheduler.runUntil(t(60_000));
    assertTrue(plugin.told.isEmpty());
    assertSame(agent, supervisor.current());
  }

  @Test
  void anAgentStartedAsTheExecutorShutsDownIsStoppedAtOnce() throws Throwable {
    FakeProcess agent = new FakeProcess(902, READY);
    FakeProcess late = new FakeProcess(903, READY);
    plugin.launches.add(agent);
    plugin.launches.add(late);
    supervisor.start();
    agent.exit(1, "");
    plugin.duringLaunch = supervisor::shutdown; // Spark's shutdown while the restart runs
    scheduler.runDue();
    assertEquals(0, late.stoppedWithGraceMs);
    assertNull(supervisor.current());
  }

  @Test
  void aStartFailureOfThePluginStopsAnAgentThatStarted() throws Throwable {
    FakeProcess agent = new FakeProcess(904, READY);
    plugin.launches.add(agent);
    supervisor.start();
    supervisor.abandon();
    assertEquals(0, agent.stoppedWithGraceMs);
    assertNull(supervisor.current());
  }

  @Test
  void linesGoToTheRunningAgent() throws Throwable {
    supervisor.send("rm 10.0.0.2:4041"); // none yet: dropped, no error
    FakeProcess agent = new FakeProcess(905, READY);
    plugin.launches.add(agent);
    supervisor.start();
    supervisor.send("rm 10.0.0.2:4041");
    assertEquals(List.of("rm 10.0.0.2:4041"), agent.sent);
  }

  @Test
  void causesSayTheSignalOrTheStatusAndLastLine() {
    assertEquals("agent exited (killed by signal 9)", AgentSupervisor.exitCause(137, "anything"));
    assertEquals("agent exited (status 1)", AgentSupervisor.exitCause(1, ""));
    assertEquals("agent exited (status 1)", AgentSupervisor.exitCause(1, null));
    assertEquals("agent exited (status 160): x", AgentSupervisor.exitCause(160, "x"));
    assertEquals("agent hung: no answer to the JVM's pulse for 5500 ms (bound 5000 ms); killed",
        AgentSupervisor.hungCause(5500, 5000));
    assertEquals(AgentSupervisor.exitCause(3, "y"), ArrowBeatExecutorPlugin.exitCause(3, "y"));
  }
}
