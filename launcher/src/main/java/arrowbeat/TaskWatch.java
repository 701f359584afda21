package arrowbeat;

import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadInfo;
import java.lang.management.ThreadMXBean;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.TaskContext;

/**
 * What the executor JVM knows about its running tasks and its own pauses, for the agent.
 *
 * <p>Each task is tracked from {@code onTaskStart} to its end on the task's own thread (Spark calls
 * the plugin's task hooks on it), so the CPU time of that thread tells whether the JVM side of the
 * task advances. Once per pulse the agent gets one line:
 *
 * <pre>tasks &lt;gc count&gt; &lt;gc ms&gt; &lt;process cpu ms&gt; &lt;jvm clock ms&gt; [&lt;task&gt;:&lt;stage&gt;:&lt;stage attempt&gt;:&lt;partition&gt;:&lt;attempt&gt;:&lt;thread cpu ms&gt;:&lt;running ms&gt; ...]</pre>
 *
 * <p>The GC and CPU totals let the agent say what a gap between two lines was: the collectors'
 * pause time covering it (a GC pause), nothing at all (the whole process stopped), or neither. The
 * JVM's own monotonic clock dates each line, so a gap is one in the JVM's lines, not a delay of
 * the agent reading them. Only pausing collectors count: a concurrent one's cycles ("ZGC Cycles",
 * "G1 Concurrent GC") run beside the application and stop nothing. A stack
 * of a task's thread is taken only when the agent asks for one ({@code jstack <task>}).
 */
final class TaskWatch {
  /** Most tasks one line describes: far above any executor's cores. */
  static final int MAX_TASKS = 512;
  /** Most frames of a task thread's stack sent to the agent. */
  static final int MAX_FRAMES = 40;

  private record Running(
      long taskId, int stage, int stageAttempt, int partition, int attempt, long threadId,
      long startNanos) {}

  private final Map<Long, Running> byThread = new ConcurrentHashMap<>();
  private final ThreadMXBean threads = ManagementFactory.getThreadMXBean();

  TaskWatch() {
    try {
      if (threads.isThreadCpuTimeSupported() && !threads.isThreadCpuTimeEnabled()) {
        threads.setThreadCpuTimeEnabled(true);
      }
    } catch (UnsupportedOperationException | SecurityException e) {
      // CPU times stay unknown (-1): progress is then judged on the Python side alone.
    }
  }

  /** On the task's thread, from {@code onTaskStart}. */
  void started() {
    TaskContext task = TaskContext.get();
    if (task == null) {
      return;
    }
    Thread me = Thread.currentThread();
    byThread.put(
        me.getId(),
        new Running(
            task.taskAttemptId(),
            task.stageId(),
            task.stageAttemptNumber(),
            task.partitionId(),
            task.attemptNumber(),
            me.getId(),
            System.nanoTime()));
  }

  /** On the task's thread, from {@code onTaskSucceeded} / {@code onTaskFailed}. */
  void ended() {
    byThread.remove(Thread.currentThread().getId());
  }

  /** The {@code tasks ...} line (no newline). */
  String line() {
    long gcCount = 0;
    long gcMs = 0;
    for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
      String name = gc.getName();
      if (name.contains("Cycles") || name.contains("Concurrent")) {
        continue;
      }
      gcCount += Math.max(0, gc.getCollectionCount());
      gcMs += Math.max(0, gc.getCollectionTime());
    }
    StringBuilder line =
        new StringBuilder("tasks ")
            .append(gcCount)
            .append(' ')
            .append(gcMs)
            .append(' ')
            .append(processCpuMs())
            .append(' ');
    long now = System.nanoTime();
    line.append(now / 1_000_000);
    int listed = 0;
    for (Running task : byThread.values()) {
      if (listed++ >= MAX_TASKS) {
        break;
      }
      long cpuNs = threadCpuNs(task.threadId());
      line.append(' ')
          .append(task.taskId())
          .append(':')
          .append(task.stage())
          .append(':')
          .append(task.stageAttempt())
          .append(':')
          .append(task.partition())
          .append(':')
          .append(task.attempt())
          .append(':')
          .append(cpuNs < 0 ? -1 : cpuNs / 1_000_000)
          .append(':')
          .append((now - task.startNanos()) / 1_000_000);
    }
    return line.toString();
  }

  /** The stack of task {@code taskId}'s thread, or null if that task is not running here. */
  String stackOf(long taskId) {
    for (Running task : byThread.values()) {
      if (task.taskId() != taskId) {
        continue;
      }
      ThreadInfo info = threads.getThreadInfo(task.threadId(), MAX_FRAMES);
      if (info == null || byThread.get(task.threadId()) != task) {
        return null; // the thread ended the task meanwhile: its stack is another task's
      }
      StringBuilder text =
          new StringBuilder("JVM thread \"")
              .append(info.getThreadName())
              .append("\" ")
              .append(info.getThreadState());
      if (info.getLockName() != null) {
        text.append(" on ").append(info.getLockName());
      }
      for (StackTraceElement frame : info.getStackTrace()) {
        text.append("\n  at ").append(frame);
      }
      return text.toString();
    }
    return null;
  }

  private long threadCpuNs(long threadId) {
    try {
      return threads.getThreadCpuTime(threadId);
    } catch (UnsupportedOperationException e) {
      return -1;
    }
  }

  private static long processCpuMs() {
    java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
    if (os instanceof com.sun.management.OperatingSystemMXBean hotspot) {
      long ns = hotspot.getProcessCpuTime();
      return ns < 0 ? -1 : ns / 1_000_000;
    }
    return -1;
  }
}
