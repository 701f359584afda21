package arrowbeat;

import java.util.Map;

/**
 * The gap a restarted driver-side process must record in its history ({@code
 * spark_plugin.history.gaps}): from when nothing was monitored (the old process's complete
 * history ended, from its last answer to a pulse), how many rows it held uncommitted, and why.
 * Carried from one process to the next until one records it; pure, so the JUnit tests check each
 * case (a process that answered, one that never did, one that never committed the gap it carried).
 */
final class RestartGap {
  /** Settings a restarted driver-side process gets: the gap it records ({@code history.gaps}). */
  static final String FROM_MS = "arrowbeat.rm.restart.fromMs";
  static final String UNSAVED_ROWS = "arrowbeat.rm.restart.unsavedRows";
  static final String CAUSE = "arrowbeat.rm.restart.cause";
  static final int MAX_CAUSE_CHARS = 300;

  private long fromMs;
  private long unsavedRows;
  /** {@code null}: no gap carried yet. */
  private String cause;

  /** The first start failed at {@code wallNowMs}: nothing is monitored from then until one runs. */
  void firstStartFailed(long wallNowMs, String message) {
    fromMs = wallNowMs;
    cause = "the first start failed: " + message;
  }

  /**
   * A process is gone ({@code cause}); {@code lastAnswer} its last answer (null if none) and
   * {@code startedWallMs} its start (wall clock ms): what its successor must record.
   */
  void retire(Protocol.Alive lastAnswer, long startedWallMs, String why) {
    boolean carried = cause != null;
    if (lastAnswer != null && lastAnswer.completeUntilMs() > 0
        && !(carried && lastAnswer.completeUntilMs() == fromMs)) {
      fromMs = lastAnswer.completeUntilMs();
      unsavedRows = lastAnswer.unsavedRows();
      cause = why;
    } else if (carried) { // it never committed the gap it carried: the gap goes on, from its start
      unsavedRows = lastAnswer == null ? unsavedRows : lastAnswer.unsavedRows();
      cause = cause + "; then the restarted process " + why;
    } else { // it never answered (or kept no history): the gap starts at its start at the latest
      fromMs = lastAnswer == null ? startedWallMs : 0;
      unsavedRows = 0;
      cause = why;
    }
    if (cause.length() > MAX_CAUSE_CHARS) {
      cause = "..." + cause.substring(cause.length() - MAX_CAUSE_CHARS + 3);
    }
  }

  /** The gap's settings, into a restart's {@code settings}. */
  void into(Map<String, String> settings) {
    settings.put(FROM_MS, String.valueOf(fromMs));
    settings.put(UNSAVED_ROWS, String.valueOf(unsavedRows));
    settings.put(CAUSE, cause == null ? "unknown" : cause);
  }
}
