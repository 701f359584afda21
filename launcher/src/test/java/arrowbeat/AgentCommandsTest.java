package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** An agent's three verbs, and every other verb refused (kill-executor above all). */
class AgentCommandsTest {
  private final List<String> done = new ArrayList<>();
  private final AgentCommands commands = new AgentCommands("3", new AgentCommands.Actions() {
    @Override
    public void outputsLost(String reason) {
      done.add("lost " + reason);
    }

    @Override
    public void rmUnreachable(String dialled) {
      done.add("ask " + dialled);
    }

    @Override
    public String stackOf(long taskId) {
      return taskId == 12 ? "at a.b(C.java:1)\n\tat d.e(F.java:2)" : null;
    }

    @Override
    public void send(String line) {
      done.add("send " + line);
    }
  });

  private void give(String line) {
    commands.accept(Protocol.parseCommand(line));
  }

  @Test
  void lostOutputsGoToTheDriver() {
    give("ARROWBEAT-CMD outputs-lost files-missing");
    assertEquals(List.of("lost files-missing"), done);
  }

  @Test
  void anUnreachableRmIsAnAskForItsAddressNow() {
    give("ARROWBEAT-CMD rm-unreachable 10.0.0.1:4040");
    assertEquals(List.of("ask 10.0.0.1:4040"), done);
  }

  @Test
  void aStackIsAnsweredEscapedOrWithADashForATaskNotRunning() {
    give("ARROWBEAT-CMD jstack 12");
    give("ARROWBEAT-CMD jstack 13");
    assertEquals(List.of("send stack 12 at a.b(C.java:1)\\n\\tat d.e(F.java:2)", "send stack 13 -"), done);
  }

  @Test
  void theDriverSideProcesssVerbsAreRefused() {
    give("ARROWBEAT-CMD kill-executor 1");
    give("ARROWBEAT-CMD lost-executor 1");
    give("ARROWBEAT-CMD kill-task 7");
    assertEquals(List.of(), done);
  }
}
