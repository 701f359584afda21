package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.function.Function;
import org.junit.jupiter.api.Test;

/**
 * What the driver-side process may ask of Spark, and what goes back: each outcome of a
 * replacement, the lost-executor follow-up only after an accepted kill, a stuck task's kill, and
 * nothing for an agent's verbs or when Spark throws.
 */
class DriverCommandsTest {
  private final List<String> calls = new ArrayList<>();
  private final List<String> toProcess = new ArrayList<>();
  private final SparkExecutors executors = new SparkExecutors();
  private Function<String, Optional<Boolean>> kill = id -> Optional.of(true);
  private Optional<Boolean> lostAnswer = Optional.of(true);
  private boolean taskThrows;
  private Function<String, Optional<Boolean>> decommission = id -> Optional.of(true);

  private final DriverCommands.Spark spark = new DriverCommands.Spark() {
    @Override
    public Optional<Boolean> killAndReplace(String executorId) {
      calls.add("kill " + executorId);
      return kill.apply(executorId);
    }

    @Override
    public Optional<Boolean> executorLost(String executorId, String message) {
      calls.add("lost " + executorId + ": " + message);
      return lostAnswer;
    }

    @Override
    public boolean killTaskAttempt(long taskId, String reason) {
      calls.add("kill-task " + taskId + ": " + reason);
      if (taskThrows) {
        throw new IllegalStateException("no such task");
      }
      return true;
    }

    @Override
    public Optional<Boolean> decommission(String executorId, String message) {
      calls.add("decommission " + executorId + ": " + message);
      return decommission.apply(executorId);
    }
  };

  /** The replacer runs each task at once, on the test's thread. */
  private final DriverCommands commands = new DriverCommands(spark, Runnable::run, executors, toProcess::add);

  private void give(String line) {
    Protocol.Command command = Protocol.parseCommand(line);
    if (command == null) {
      throw new AssertionError("not a command: " + line + " (" + Protocol.commandError(line) + ")");
    }
    commands.accept(command);
  }

  @Test
  void anAcceptedReplacementIsToldAndItsRemovalIsOneArrowbeatAskedFor() {
    give("ARROWBEAT-CMD kill-executor 4");
    assertEquals(List.of("kill 4"), calls);
    assertEquals(List.of("executor-replacement 4 accepted"), toProcess);
    assertEquals("executor-removed 4 replaced killed", executors.removed("4", "killed"));
  }

  @Test
  void aRefusedUnavailableOrFailedReplacementIsToldAndItsRemovalIsNotOurs() {
    kill = id -> switch (id) {
      case "5" -> Optional.of(false);
      case "6" -> Optional.empty();
      default -> throw new IllegalStateException("backend gone");
    };
    give("ARROWBEAT-CMD kill-executor 5");
    give("ARROWBEAT-CMD kill-executor 6");
    give("ARROWBEAT-CMD kill-executor 7");
    assertEquals(List.of("executor-replacement 5 refused", "executor-replacement 6 unavailable",
        "executor-replacement 7 refused"), toProcess);
    assertEquals("executor-removed 5 spark x", executors.removed("5", "x"));
    assertEquals("executor-removed 7 spark x", executors.removed("7", "x"));
  }

  @Test
  void aLostExecutorIsDeclaredLostOnlyOnceItsKillWasAccepted() {
    give("ARROWBEAT-CMD lost-executor 8");
    assertEquals(List.of("kill 8", "lost 8: " + DriverCommands.LOST_MESSAGE), calls);
    assertEquals(List.of("executor-replacement 8 accepted"), toProcess);
    calls.clear();
    kill = id -> Optional.of(false);
    give("ARROWBEAT-CMD lost-executor 9");
    assertEquals(List.of("kill 9"), calls); // refused: Spark's scheduler is not told
    assertEquals("executor-replacement 9 refused", toProcess.get(1));
  }

  @Test
  void aFailingOrUnavailableDeclarationStillTellsTheReplacement() {
    lostAnswer = Optional.empty();
    give("ARROWBEAT-CMD lost-executor 10");
    assertEquals(List.of("executor-replacement 10 accepted"), toProcess);
  }

  @Test
  void aDegradedExecutorIsDecommissionedAndItsRemovalIsOneArrowbeatAskedFor() {
    give("ARROWBEAT-CMD decommission-executor 11");
    assertEquals(List.of("decommission 11: " + DriverCommands.DEGRADED_MESSAGE), calls);
    assertEquals(List.of("executor-replacement 11 accepted"), toProcess);
    assertEquals("executor-removed 11 replaced decommissioned", executors.removed("11", "decommissioned"));
  }

  @Test
  void whereSparkCannotOrWillNotDecommissionItIsKilledAndReplaced() {
    decommission = id -> switch (id) {
      case "12" -> Optional.of(false);
      case "13" -> Optional.empty();
      default -> throw new IllegalStateException("backend gone");
    };
    give("ARROWBEAT-CMD decommission-executor 12");
    give("ARROWBEAT-CMD decommission-executor 13");
    give("ARROWBEAT-CMD decommission-executor 14");
    assertEquals(List.of("decommission 12: " + DriverCommands.DEGRADED_MESSAGE, "kill 12",
        "decommission 13: " + DriverCommands.DEGRADED_MESSAGE, "kill 13",
        "decommission 14: " + DriverCommands.DEGRADED_MESSAGE, "kill 14"), calls);
    assertEquals(List.of("executor-replacement 12 accepted", "executor-replacement 13 accepted",
        "executor-replacement 14 accepted"), toProcess);
    kill = id -> Optional.of(false);
    decommission = id -> Optional.of(false);
    give("ARROWBEAT-CMD decommission-executor 15");
    assertEquals("executor-replacement 15 refused", toProcess.get(3));
    assertEquals("executor-removed 15 spark x", executors.removed("15", "x"));
  }

  @Test
  void aStuckTaskIsKilledAndAFailedKillCrashesNothing() {
    give("ARROWBEAT-CMD kill-task 123456789012345678");
    assertEquals(List.of("kill-task 123456789012345678: " + DriverCommands.KILL_TASK_REASON), calls);
    taskThrows = true;
    give("ARROWBEAT-CMD kill-task 2");
    assertEquals(2, calls.size());
    assertTrue(toProcess.isEmpty());
  }

  @Test
  void anAgentsVerbsDoNothingHere() {
    give("ARROWBEAT-CMD outputs-lost files-missing");
    give("ARROWBEAT-CMD jstack 12");
    give("ARROWBEAT-CMD rm-unreachable 10.0.0.1:4040");
    assertTrue(calls.isEmpty() && toProcess.isEmpty());
  }

  @Test
  void theLogSaysWhatBecameOfAReplacement() {
    assertEquals("accepted", DriverCommands.text(Protocol.Replacement.ACCEPTED));
    assertEquals("refused by the scheduler backend", DriverCommands.text(Protocol.Replacement.REFUSED));
    assertEquals("not possible on this Spark (kill-and-replace-executor is unavailable: see the warning "
        + "at start-up)", DriverCommands.text(Protocol.Replacement.UNAVAILABLE));
  }
}
