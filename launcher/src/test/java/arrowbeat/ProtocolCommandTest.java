package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.util.Random;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Test;

/**
 * Command lines from a child, good and bad: a good one is one verb and its argument; a bad one is
 * refused with a reason that names no text of the line (the log shows a redacted excerpt), and
 * nothing a child writes makes the parser throw.
 */
class ProtocolCommandTest {
  @ParameterizedTest
  @CsvSource({
    "ARROWBEAT-CMD kill-executor 4, kill-executor, 4",
    "ARROWBEAT-CMD lost-executor exec.7_a-b, lost-executor, exec.7_a-b",
    "ARROWBEAT-CMD decommission-executor 9, decommission-executor, 9",
    "ARROWBEAT-CMD outputs-lost files-missing, outputs-lost, files-missing",
    "ARROWBEAT-CMD jstack 123456789012345678, jstack, 123456789012345678",
    "ARROWBEAT-CMD kill-task 0, kill-task, 0",
    "ARROWBEAT-CMD rm-unreachable [::1]:4040, rm-unreachable, [::1]:4040",
  })
  void aGoodLineIsItsVerbAndArgument(String line, String verb, String argument) {
    assertEquals(new Protocol.Command(verb, argument), Protocol.parseCommand(line));
    assertNull(Protocol.commandError(line));
  }

  @ParameterizedTest
  @CsvSource(
      delimiter = '|',
      value = {
        "kill-executor 4|it does not start with ARROWBEAT-CMD",
        "ARROWBEAT-CMDkill-executor 4|it does not start with ARROWBEAT-CMD",
        "ARROWBEAT-CMD kill-executor|not one verb and one argument after ARROWBEAT-CMD",
        "ARROWBEAT-CMD kill-executor 4 5|not one verb and one argument after ARROWBEAT-CMD",
        "ARROWBEAT-CMD  kill-executor 4|not one verb and one argument after ARROWBEAT-CMD",
        "ARROWBEAT-CMD kill-executor driver|the argument of kill-executor is not an executor id (other than driver)",
        "ARROWBEAT-CMD decommission-executor driver|the argument of decommission-executor is not an executor id (other than driver)",
        "ARROWBEAT-CMD lost-executor a;b|the argument of lost-executor is not an executor id (other than driver)",
        "ARROWBEAT-CMD outputs-lost Files|the argument of outputs-lost is not a reason ([a-z-], at most 32 characters)",
        "ARROWBEAT-CMD jstack 1234567890123456789|the argument of jstack is not a task attempt id (1 to 18 digits)",
        "ARROWBEAT-CMD kill-task -1|the argument of kill-task is not a task attempt id (1 to 18 digits)",
        "ARROWBEAT-CMD rm-unreachable nowhere|the argument of rm-unreachable is not an address host:port",
        "ARROWBEAT-CMD format-disk /|unknown verb",
        "ARROWBEAT-CMD KILL-EXECUTOR 4|unknown verb",
      })
  void aBadLineIsRefusedWithAReason(String line, String why) {
    assertNull(Protocol.parseCommand(line));
    assertEquals(why, Protocol.commandError(line));
  }

  @ParameterizedTest
  @ValueSource(strings = {"", " ", "ARROWBEAT-CMD", "ARROWBEAT-CMD  ", "ARROWBEAT-CMD kill-executor 4 "})
  void emptyAndShortLinesAreRefused(String line) {
    assertNull(Protocol.parseCommand(line));
    assertNotNull(Protocol.commandError(line));
  }

  @Test
  void aNullOrOverLongLineIsRefused() {
    assertNull(Protocol.parseCommand(null));
    assertEquals("no line", Protocol.commandError(null));
    String line = "ARROWBEAT-CMD outputs-lost " + "a".repeat(Protocol.MAX_COMMAND_CHARS);
    assertNull(Protocol.parseCommand(line));
    assertEquals("longer than 256 characters", Protocol.commandError(line));
  }

  /** Random lines built from the grammar's pieces: parsing never throws, and the two agree. */
  @Test
  void noLineMakesTheParserThrowAndParseAndReasonAgree() {
    String[] heads = {"ARROWBEAT-CMD", "ARROWBEAT-CMD", "ARROWBEAT-CMDX", "", "arrowbeat-cmd"};
    String[] gaps = {" ", " ", " ", "", "  ", "\t"};
    String[] verbs = {"kill-executor", "lost-executor", "outputs-lost", "jstack", "kill-task",
        "rm-unreachable", "stop", ""};
    String[] arguments = {"4", "driver", "files-missing", "10.0.0.1:4040", "99999999999999999999", "",
        "a b", "\u00e9", "x".repeat(300), "[::1]:1", "-"};
    Random random = new Random(38);
    int good = 0;
    for (int i = 0; i < 20_000; i++) {
      String line = heads[random.nextInt(heads.length)] + gaps[random.nextInt(gaps.length)]
          + verbs[random.nextInt(verbs.length)] + gaps[random.nextInt(gaps.length)]
          + arguments[random.nextInt(arguments.length)] + (random.nextInt(8) == 0 ? " " : "");
      Protocol.Command command = Protocol.parseCommand(line);
      String why = Protocol.commandError(line);
      assertEquals(command == null, why != null, line);
      good += command == null ? 0 : 1;
    }
    // Some of them are commands: the check above ran both ways.
    org.junit.jupiter.api.Assertions.assertTrue(good > 50, "good lines " + good);
  }
}
