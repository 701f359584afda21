package arrowbeat;

import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadInfo;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.TaskContext;

/**
 * What the executor JVM knows about its running tasks and its own pauses, for the agent.
 *
 * <p>Each task is tracked from {@code onTaskStart} to its end on the task's own thread (Spark calls
 * the plugin's task hooks on it), so the CPU time of that thread tells whether the JVM side of the
 * task advances. Once per pulse the agent gets one {@link Protocol#tasks} line: the process's CPU
 * time, the JVM's own monotonic clock (so a gap is one in the JVM's lines, not a delay of the agent
 * reading them), every garbage collector's totals (which of them pause the application is the
 * agent's judgement) and each running task's figures. A stack of a task's thread is taken only
 * when the agent asks for one ({@code jstack <task>}).
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
    List<Protocol.Collector> collectors = new ArrayList<>();
    for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
      long count = Math.max(0, gc.getCollectionCount());
      collectors.add(new Protocol.Collector(gc.getName(), count, Math.max(0, gc.getCollectionTime())));
    }
    long now = System.nanoTime();
    List<Protocol.TaskFigures> tasks = new ArrayList<>();
    for (Running task : byThread.values()) {
      if (tasks.size() >= MAX_TASKS) {
        break;
      }
      long cpuNs = threadCpuNs(task.threadId());
      tasks.add(
          new Protocol.TaskFigures(
              task.taskId(), task.stage(), task.stageAttempt(), task.partition(), task.attempt(),
              cpuNs < 0 ? -1 : cpuNs / 1_000_000, (now - task.startNanos()) / 1_000_000));
    }
    return Protocol.tasks(processCpuMs(), now / 1_000_000, collectors, tasks);
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
