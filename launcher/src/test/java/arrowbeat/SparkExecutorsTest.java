package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Spark's view of its executors, as the driver-side process hears it. */
class SparkExecutorsTest {
  @Test
  void addedAndRemovedExecutorsAreLinesAndTheLiveOnesAreReplayed() {
    SparkExecutors executors = new SparkExecutors();
    assertEquals("executor-added 1 host-a", executors.added("1", "host-a"));
    assertEquals("executor-added 2 unknown", executors.added("2", null));
    assertEquals("executor-added 3 unknown", executors.added("3", "bad host"));
    assertEquals("executor-removed 3 spark Command exited with code 1",
        executors.removed("3", "Command exited with code 1"));
    List<String> replayed = new ArrayList<>();
    executors.replay(replayed::add);
    replayed.sort(null);
    assertEquals(List.of("executor-added 1 host-a", "executor-added 2 unknown"), replayed);
  }

  @Test
  void anIdTheDriverSideProcessWouldRefuseIsNotForwarded() {
    SparkExecutors executors = new SparkExecutors();
    assertNull(executors.added("no spaces allowed", "h"));
    assertNull(executors.removed("", "gone"));
    List<String> replayed = new ArrayList<>();
    executors.replay(replayed::add);
    assertEquals(List.of(), replayed);
  }

  @Test
  void aRemovalSaysWhetherArrowbeatAskedForItAndWhetherTheApplicationWasEnding() {
    SparkExecutors executors = new SparkExecutors();
    executors.replacing("4");
    assertEquals("executor-removed 4 replaced killed", executors.removed("4", "killed"));
    assertEquals("executor-removed 4 spark killed", executors.removed("4", "killed")); // once
    executors.replacing("5");
    executors.notReplaced("5"); // Spark did not take it
    assertEquals("executor-removed 5 spark lost", executors.removed("5", "lost"));
    executors.applicationEnding();
    executors.replacing("6");
    assertEquals("executor-removed 6 replaced,app-end x", executors.removed("6", "x"));
    assertEquals("executor-removed 7 app-end x", executors.removed("7", "x"));
  }

  @Test
  void sparksReasonIsMadePrintableAndCut() {
    String line = new SparkExecutors().removed("8", "line one\nline two" + "y".repeat(500));
    assertTrue(line.startsWith("executor-removed 8 spark line one\\u000aline twoyyy"), line);
    assertTrue(line.endsWith("...(cut)"), line);
  }
}
