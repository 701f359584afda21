package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * {@link Supervision}'s arithmetic on fake times: the restart budget (a sliding window that
 * refills, never a cap for life), the backoff of failed attempts, the hang bound and the late
 * check, which failed starts are retried, and how often a supervisor checks.
 */
class SupervisionTest {
  private static Supervision budget(int max, long windowMs, long backoffMaxMs) {
    Supervision supervision = new Supervision(Supervision.Policy.DEFAULT);
    supervision.launched(new Supervision.Policy(5000, max, windowMs, backoffMaxMs), 0);
    return supervision;
  }

  @Test
  void theBudgetIsExhaustedWithinTheWindowAndRefillsAsAttemptsLeaveIt() {
    Supervision s = budget(3, 10_000, 30_000);
    for (long at : new long[] {0, 100, 200}) {
      assertEquals(at, s.nextRestartAt(at));
      s.attempting(at);
      s.succeeded();
    }
    assertEquals(10_000, s.nextRestartAt(300)); // exhausted: the oldest leaves at 10 s
    assertEquals(10_000, s.nextRestartAt(9_999));
    assertEquals(10_000, s.nextRestartAt(10_000)); // refilled by one
    s.attempting(10_000);
    assertEquals(10_100, s.nextRestartAt(10_050));
    assertEquals(500_000, s.nextRestartAt(500_000)); // all gone: free again
  }

  @Test
  void aFailedAttemptBacksOffDoublingUpToTheCapAndASuccessForgetsIt() {
    Supervision s = budget(100, 600_000, 3000);
    s.attempting(0);
    s.failed(0);
    assertEquals(1000, s.nextRestartAt(0));
    s.attempting(1000);
    s.failed(1000);
    assertEquals(3000, s.nextRestartAt(1000));
    s.attempting(3000);
    s.failed(3000);
    assertEquals(6000, s.nextRestartAt(3000)); // 4 s capped at 3 s
    s.attempting(6000);
    s.succeeded();
    assertEquals(6000, s.nextRestartAt(6000));
    assertEquals(1000, s.backoffMs(1));
    assertEquals(2000, s.backoffMs(2));
    assertEquals(3000, s.backoffMs(60)); // no overflow
  }

  @Test
  void aPulseUnansweredPastTheBoundIsAHangAndAnAnswerEndsTheWait() {
    Supervision s = budget(10, 600_000, 30_000);
    s.pulsed(0);
    s.pulsed(500); // the wait started at the first unanswered one
    for (long at = 500; at <= 5000; at += 500) {
      assertFalse(s.hung(at, 500), "at " + at);
    }
    assertTrue(s.hung(5500, 500));
    assertEquals(5500, s.silentMs(5500));
    s.answered();
    assertFalse(s.hung(6000, 500));
    assertEquals(0, s.silentMs(6000));
  }

  @Test
  void aLateCheckJudgesNothingAndStartsTheWaitAgain() {
    Supervision s = budget(10, 600_000, 30_000);
    s.pulsed(0);
    assertFalse(s.hung(500, 500));
    assertFalse(s.hung(30_500, 500)); // 30 s after the previous check: this JVM was paused
    for (long at = 31_000; at <= 35_500; at += 500) {
      assertFalse(s.hung(at, 500), "at " + at); // within the bound from the late check
    }
    assertTrue(s.hung(36_000, 500));
  }

  @Test
  void withoutAnAnnouncedBoundNothingIsEverHung() {
    Supervision s = new Supervision(Supervision.Policy.DEFAULT);
    s.launched(Supervision.Policy.from(Map.of("pulse_ms", "500")), 0);
    s.pulsed(0);
    for (long at = 500; at < 600_000; at += 500) {
      assertFalse(s.hung(at, 500));
    }
    assertEquals(new Supervision.Policy(4000, 3, 600_000, 30_000), Supervision.Policy.from(Map.of(
        "hang_ms", "4000", "restart_max", "3", "restart_window_ms", "x", "restart_backoff_ms", "-1")));
  }

  @Test
  void aFailedStartIsRetriedUnlessItCannotSucceed() {
    assertTrue(Supervision.retriesStart(new Sidecar.SidecarException("did not report ready", -1)));
    assertTrue(Supervision.retriesStart(new Sidecar.SidecarException("exited", 1)));
    assertTrue(Supervision.retriesStart(new Sidecar.SidecarException("exited", 137)));
    assertTrue(Supervision.retriesStart(new java.io.IOException("fork failed")));
    assertFalse(Supervision.retriesStart(new Sidecar.SidecarException("refused", Supervision.NOT_STARTED)));
    assertFalse(Supervision.retriesStart(new Launch.MissingInterpreterException("no python")));
  }

  @Test
  void aSupervisorChecksEveryPulseWithin100MsAndASecond() {
    assertEquals(500, Supervision.checkMs(500));
    assertEquals(100, Supervision.checkMs(20));
    assertEquals(1000, Supervision.checkMs(5000));
    assertEquals(1000, Supervision.checkMs(0));
    assertEquals(1000, Supervision.checkMs(-1));
  }
}
