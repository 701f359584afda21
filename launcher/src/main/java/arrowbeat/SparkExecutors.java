package arrowbeat;

import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;

/**
 * Spark's own view of its executors, as the driver plugin forwards it to the driver-side process
 * ({@link Protocol#executorAdded}, {@link Protocol#executorRemoved}): which executors run now (a
 * restarted process hears them again, {@link #replay}), which arrowbeat asked Spark to replace
 * (their removal is then no crash) and whether the application was ending. Its methods return the
 * line to forward, or null for an id the driver-side process would not accept. No Spark here:
 * {@link ArrowBeatDriverPlugin}'s listener hands in the ids, hosts and reasons.
 */
final class SparkExecutors {
  /** Executors Spark runs now (id to host). */
  private final Map<String, String> live = new ConcurrentHashMap<>();
  /** Executors arrowbeat asked Spark to kill and replace, until Spark reports them removed. */
  private final Set<String> replacing = ConcurrentHashMap.newKeySet();
  private volatile boolean applicationEnding;

  /** Spark added an executor ({@code host} null or unexpected: {@code unknown}). */
  String added(String executorId, String host) {
    if (!Protocol.EXECUTOR_ID.matcher(executorId).matches()) {
      return null; // not an id the driver-side process would accept; Spark's ids always are
    }
    String shown = host != null && Protocol.HOST.matcher(host).matches() ? host : "unknown";
    live.put(executorId, shown);
    return Protocol.executorAdded(executorId, shown);
  }

  /** Spark removed an executor, for {@code reason}: with what this JVM saw besides. */
  String removed(String executorId, String reason) {
    if (!Protocol.EXECUTOR_ID.matcher(executorId).matches()) {
      return null;
    }
    live.remove(executorId);
    return Protocol.executorRemoved(executorId, replacing.remove(executorId), applicationEnding, reason);
  }

  /** The application began to stop (posted before the scheduler stops the executors). */
  void applicationEnding() {
    applicationEnding = true;
  }

  /** arrowbeat is about to ask Spark to replace {@code executorId}. */
  void replacing(String executorId) {
    replacing.add(executorId);
  }

  /** Spark did not take the replacement: its removal, if any, is not arrowbeat's. */
  void notReplaced(String executorId) {
    replacing.remove(executorId);
  }

  /** The executors alive now, as the lines that told them, for a restarted process. */
  void replay(Consumer<String> to) {
    live.forEach((id, host) -> to.accept(Protocol.executorAdded(id, host)));
  }
}
