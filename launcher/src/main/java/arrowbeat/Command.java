package arrowbeat;

import java.util.regex.Pattern;

/**
 * One command from the driver-side process, parsed from one line of its protocol channel (its
 * stdout, which carries nothing else: its logs go to stderr). Only known verbs with arguments of
 * the expected shape become a command; {@link #parse} returns null for anything else, which the
 * caller logs (rate-limited) and ignores.
 *
 * <p>The grammar: {@code ARROWBEAT-CMD kill-executor <executor id>} (from the driver-side process
 * only), the id 1-64 characters of {@code [A-Za-z0-9._-]} starting with a letter or digit, never
 * Spark's {@code driver}; and {@code ARROWBEAT-CMD outputs-lost <reason>} (from an agent only, about
 * its own executor), the reason 1-32 characters of {@code [a-z-]}; {@code ARROWBEAT-CMD jstack <task>}
 * (from an agent: the stack of one of its executor's running tasks) and {@code ARROWBEAT-CMD
 * kill-task <task>} (from the driver-side process: a stuck task attempt), the task attempt id 1-18
 * digits.
 */
record Command(String verb, String argument) {
  static final String PREFIX = "ARROWBEAT-CMD";
  static final String KILL_EXECUTOR = "kill-executor";
  static final String OUTPUTS_LOST = "outputs-lost";
  static final String JSTACK = "jstack";
  static final String KILL_TASK = "kill-task";
  static final Pattern TASK_ID = Pattern.compile("[0-9]{1,18}");
  static final Pattern REASON = Pattern.compile("[a-z][a-z-]{0,31}");
  static final int MAX_LINE_CHARS = 256;
  static final Pattern EXECUTOR_ID = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,63}");

  /** The command on {@code line}, or null if the line is not exactly one well-formed command. */
  static Command parse(String line) {
    if (line == null || line.length() > MAX_LINE_CHARS) {
      return null;
    }
    String[] words = line.split(" ", -1);
    if (words.length != 3 || !words[0].equals(PREFIX)) {
      return null;
    }
    if (words[1].equals(KILL_EXECUTOR)
        && EXECUTOR_ID.matcher(words[2]).matches()
        && !words[2].equals("driver")) {
      return new Command(KILL_EXECUTOR, words[2]);
    }
    if (words[1].equals(OUTPUTS_LOST) && REASON.matcher(words[2]).matches()) {
      return new Command(OUTPUTS_LOST, words[2]);
    }
    if ((words[1].equals(JSTACK) || words[1].equals(KILL_TASK))
        && TASK_ID.matcher(words[2]).matches()) {
      return new Command(words[1], words[2]);
    }
    return null;
  }

  @Override
  public String toString() {
    return verb + " " + argument;
  }
}
