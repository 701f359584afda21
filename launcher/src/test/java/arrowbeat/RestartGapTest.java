package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The gap a restarted driver-side process records, in each case a process can end in. */
class RestartGapTest {
  private static Map<String, String> settings(RestartGap gap) {
    Map<String, String> out = new HashMap<>();
    gap.into(out);
    return out;
  }

  private static Map<String, String> expected(long fromMs, long rows, String cause) {
    return Map.of(RestartGap.FROM_MS, String.valueOf(fromMs), RestartGap.UNSAVED_ROWS,
        String.valueOf(rows), RestartGap.CAUSE, cause);
  }

  @Test
  void noGapYetSaysUnknown() {
    assertEquals(expected(0, 0, "unknown"), settings(new RestartGap()));
  }

  @Test
  void aProcessThatAnsweredLeavesAGapFromItsCompleteHistory() {
    RestartGap gap = new RestartGap();
    gap.retire(new Protocol.Alive(5000, 12), 1000, "exited with status 1");
    assertEquals(expected(5000, 12, "exited with status 1"), settings(gap));
  }

  @Test
  void aProcessThatNeverAnsweredLeavesAGapFromItsStart() {
    RestartGap gap = new RestartGap();
    gap.retire(null, 1000, "exited with status 1");
    assertEquals(expected(1000, 0, "exited with status 1"), settings(gap));
  }

  @Test
  void aProcessThatKeptNoHistoryLeavesNoStartTime() {
    RestartGap gap = new RestartGap();
    gap.retire(new Protocol.Alive(0, 0), 1000, "hung");
    assertEquals(expected(0, 0, "hung"), settings(gap));
  }

  @Test
  void aRestartedProcessThatNeverCommittedTheGapItCarriedContinuesIt() {
    RestartGap gap = new RestartGap();
    gap.retire(new Protocol.Alive(5000, 12), 1000, "exited with status 1");
    // The next one answered, but its history is still complete only to the gap's start.
    gap.retire(new Protocol.Alive(5000, 20), 6000, "exited with status 9");
    assertEquals(expected(5000, 20, "exited with status 1; then the restarted process exited with status 9"),
        settings(gap));
    gap.retire(null, 9000, "hung");
    assertEquals(
        expected(5000, 20, "exited with status 1; then the restarted process exited with status 9; "
            + "then the restarted process hung"),
        settings(gap));
  }

  @Test
  void aRestartedProcessThatCommittedTheGapStartsANewOne() {
    RestartGap gap = new RestartGap();
    gap.retire(new Protocol.Alive(5000, 12), 1000, "exited with status 1");
    gap.retire(new Protocol.Alive(8000, 3), 6000, "hung");
    assertEquals(expected(8000, 3, "hung"), settings(gap));
  }

  @Test
  void aFailedFirstStartIsAGapFromItsFailure() {
    RestartGap gap = new RestartGap();
    gap.firstStartFailed(4242, "did not report ready");
    assertEquals(expected(4242, 0, "the first start failed: did not report ready"), settings(gap));
    gap.retire(null, 5000, "exited with status 1"); // the retried one died before it answered
    assertEquals(expected(4242, 0, "the first start failed: did not report ready; then the restarted "
        + "process exited with status 1"), settings(gap));
  }

  @Test
  void aLongCauseKeepsItsEnd() {
    RestartGap gap = new RestartGap();
    gap.retire(null, 1, "x".repeat(400) + " the end");
    String cause = settings(gap).get(RestartGap.CAUSE);
    assertEquals(RestartGap.MAX_CAUSE_CHARS, cause.length());
    assertTrue(cause.startsWith("...") && cause.endsWith(" the end"), cause);
  }
}
