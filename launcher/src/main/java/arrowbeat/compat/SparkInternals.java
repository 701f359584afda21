package arrowbeat.compat;

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The launcher's only way into Spark's internals ({@code private[spark]} members, which may change
 * in any minor): each is looked up once per JVM, its exact signature checked
 * ({@link CheckedMethod}), and then either called or reported unavailable, with one warning in the
 * log naming what, why and what arrowbeat does without it. Nothing here throws because an internal
 * is missing; the public plugin API ({@code SparkPlugin}, {@code PluginContext}, listeners,
 * {@code TaskContext}, {@code SparkConf}) is called directly elsewhere.
 *
 * <p>The launcher is compiled against the oldest supported Spark (see {@code
 * build_backend/launcher_classpath.txt}) and run on all of them: nothing here compares version
 * strings, the checks decide; the running version only goes into the warning.
 */
public final class SparkInternals {
  private static final Logger LOG = LoggerFactory.getLogger(SparkInternals.class);
  private static final String SPARK_ENV = "org.apache.spark.SparkEnv";
  private static final String BLOCK_MANAGER = "org.apache.spark.storage.BlockManager";
  private static final String DISK_BLOCK_MANAGER = "org.apache.spark.storage.DiskBlockManager";
  private static final String BLOCK_MANAGER_ID = "org.apache.spark.storage.BlockManagerId";
  private static final String TASK_SCHEDULER = "org.apache.spark.scheduler.TaskScheduler";
  private static final String LOSS_REASON = "org.apache.spark.scheduler.ExecutorLossReason";
  private static final String PROCESS_LOST = "org.apache.spark.scheduler.ExecutorProcessLost";
  private static final String SCHEDULER_BACKEND = "org.apache.spark.scheduler.SchedulerBackend";
  private static final String ALLOCATION_CLIENT = "org.apache.spark.ExecutorAllocationClient";
  private static final String DECOMMISSION_INFO = "org.apache.spark.scheduler.ExecutorDecommissionInfo";
  /** Settings key prefix that tells a Python process what is unavailable ({@code spark_plugin.jvm.sidecar}). */
  public static final String SETTING_PREFIX = "arrowbeat.jvm.unavailable.";
  /**
   * Fault injection for tests only: a JVM system property listing internal keys (comma-separated)
   * to treat as unavailable, so a test can run a real application through the path a future Spark
   * would take. Never set it in production.
   */
  public static final String TEST_UNAVAILABLE_PROPERTY = "arrowbeat.test.unavailableInternals";

  /** The internals the launcher uses, each with what arrowbeat does without it. */
  public enum Internal {
    /** {@code SparkEnv.blockManager().diskBlockManager().localDirs()}: the executor's local dirs. */
    EXECUTOR_LOCAL_DIRS(
        "executor-local-dirs",
        "SparkEnv.blockManager().diskBlockManager().localDirs()",
        "the agent is not told this executor's local dirs: it keeps map outputs in its default "
            + "folder and cannot read stuck tasks' Python stacks"),
    /** {@code SparkEnv.blockManager().blockManagerId().host()}: the executor's host as Spark knows it. */
    EXECUTOR_HOST(
        "executor-host",
        "SparkEnv.blockManager().blockManagerId().host()",
        "the agent's host comes from PluginContext.hostname() or this machine's own name"),
    /** {@code SparkContext.killAndReplaceExecutor(String)}: what Spark does on a heartbeat timeout. */
    KILL_AND_REPLACE_EXECUTOR(
        "kill-and-replace-executor",
        "SparkContext.killAndReplaceExecutor(String)",
        "arrowbeat cannot have Spark replace an executor: spark.arrowbeat.onHeartbeatTimeout=kill "
            + "does nothing and lost map outputs are not recomputed"),
    /**
     * {@code SparkContext.taskScheduler().executorLost(id, new ExecutorProcessLost(message, None,
     * true))}: what Spark's scheduler backend does once an executor is gone, done at once for one
     * whose heartbeats timed out (checked in Spark 4.0.1's sources and 4.2.1's classes).
     */
    EXECUTOR_LOST(
        "executor-lost",
        "SparkContext.taskScheduler().executorLost(String, new ExecutorProcessLost(String, Option, "
            + "boolean))",
        "on a heartbeat timeout arrowbeat only asks for the kill: the executor's running tasks are "
            + "resubmitted once its process is gone (a frozen JVM: after the cluster manager's "
            + "SIGTERM grace)"),
    /**
     * {@code SparkContext.schedulerBackend().decommissionExecutor(id, new
     * ExecutorDecommissionInfo(message, None), false, false)} on a backend that is an {@code
     * ExecutorAllocationClient}: what Spark does to an executor it lets go gracefully (no new task
     * is sent there; with {@code spark.storage.decommission.*} its shuffle and cached blocks move;
     * the target count is kept, so the cluster manager starts a replacement).
     */
    DECOMMISSION_EXECUTOR(
        "decommission-executor",
        "SparkContext.schedulerBackend().decommissionExecutor(String, new ExecutorDecommissionInfo("
            + "String, Option), boolean, boolean)",
        "spark.arrowbeat.onDegraded=exclude kills and replaces a degraded executor even where "
            + "spark.decommission.enabled is on (its blocks are recomputed, not moved)");

    private final String key;
    private final String calls;
    private final String consequence;

    Internal(String key, String calls, String consequence) {
      this.key = key;
      this.calls = calls;
      this.consequence = consequence;
    }

    /** The name used in logs and in the settings key ({@link #SETTING_PREFIX} + key). */
    public String key() {
      return key;
    }
  }

  private static final Map<Internal, List<CheckedMethod>> RESOLVED = new EnumMap<>(Internal.class);
  private static String version;

  private SparkInternals() {}

  private static ClassLoader sparkLoader() {
    return SparkContext.class.getClassLoader();
  }

  /** The methods {@code internal} calls in order, each on what the previous one returned. */
  private static List<CheckedMethod> lookUp(Internal internal) {
    ClassLoader loader = sparkLoader();
    List<CheckedMethod> chain = new ArrayList<>();
    String disabled = System.getProperty(TEST_UNAVAILABLE_PROPERTY, "");
    if (List.of(disabled.split(",")).contains(internal.key)) {
      chain.add(CheckedMethod.unavailable(
          internal.calls, "disabled by -D" + TEST_UNAVAILABLE_PROPERTY + " (a test)"));
      return Collections.unmodifiableList(chain);
    }
    switch (internal) {
      case EXECUTOR_LOCAL_DIRS -> {
        chain.add(CheckedMethod.find(loader, SPARK_ENV, "blockManager", false, BLOCK_MANAGER));
        chain.add(CheckedMethod.find(loader, BLOCK_MANAGER, "diskBlockManager", false, DISK_BLOCK_MANAGER));
        chain.add(CheckedMethod.find(loader, DISK_BLOCK_MANAGER, "localDirs", false, "java.io.File[]"));
      }
      case EXECUTOR_HOST -> {
        chain.add(CheckedMethod.find(loader, SPARK_ENV, "blockManager", false, BLOCK_MANAGER));
        chain.add(CheckedMethod.find(loader, BLOCK_MANAGER, "blockManagerId", false, BLOCK_MANAGER_ID));
        chain.add(CheckedMethod.find(loader, BLOCK_MANAGER_ID, "host", false, "java.lang.String"));
      }
      case KILL_AND_REPLACE_EXECUTOR -> chain.add(CheckedMethod.find(
          loader, SparkContext.class.getName(), "killAndReplaceExecutor", false, "boolean",
          "java.lang.String"));
      case EXECUTOR_LOST -> {
        chain.add(CheckedMethod.find(
            loader, SparkContext.class.getName(), "taskScheduler", false, TASK_SCHEDULER));
        chain.add(CheckedMethod.find(
            loader, TASK_SCHEDULER, "executorLost", false, "void", "java.lang.String", LOSS_REASON));
        chain.add(CheckedMethod.constructor(
            loader, PROCESS_LOST, "java.lang.String", "scala.Option", "boolean"));
      }
      case DECOMMISSION_EXECUTOR -> {
        chain.add(CheckedMethod.find(
            loader, SparkContext.class.getName(), "schedulerBackend", false, SCHEDULER_BACKEND));
        chain.add(CheckedMethod.find(loader, ALLOCATION_CLIENT, "decommissionExecutor", false, "boolean",
            "java.lang.String", DECOMMISSION_INFO, "boolean", "boolean"));
        chain.add(CheckedMethod.constructor(loader, DECOMMISSION_INFO, "java.lang.String", "scala.Option"));
      }
      default -> { } // every internal is listed above
    }
    return Collections.unmodifiableList(chain);
  }

  /** The checked chain of {@code internal}, looked up at the first call; warns once if unavailable. */
  private static synchronized List<CheckedMethod> chain(Internal internal) {
    List<CheckedMethod> chain = RESOLVED.get(internal);
    if (chain == null) {
      chain = lookUp(internal);
      RESOLVED.put(internal, chain);
      CheckedMethod broken = broken(chain);
      if (broken != null) {
        LOG.warn("arrowbeat: unavailable on Spark {}: {} ({}): {}; {}", sparkVersion(), internal.key,
            broken.signature(), broken.why(), internal.consequence);
      }
    }
    return chain;
  }

  private static CheckedMethod broken(List<CheckedMethod> chain) {
    for (CheckedMethod method : chain) {
      if (!method.available()) {
        return method;
      }
    }
    return null;
  }

  /**
   * Looks up {@code internals} (each once per JVM, with its one warning) and returns those that
   * are unavailable: key to why. Call at plugin start-up, so the warning comes first.
   */
  public static Map<String, String> unavailable(Internal... internals) {
    Map<String, String> missing = new LinkedHashMap<>();
    for (Internal internal : internals) {
      CheckedMethod broken = broken(chain(internal));
      if (broken != null) {
        missing.put(internal.key, broken.signature() + ": " + broken.why());
      }
    }
    return missing;
  }

  /** {@link #unavailable} as settings for a Python process: {@link #SETTING_PREFIX} + key to why. */
  public static Map<String, String> unavailableSettings(Internal... internals) {
    Map<String, String> settings = new LinkedHashMap<>();
    unavailable(internals).forEach((key, why) -> settings.put(SETTING_PREFIX + key, why));
    return settings;
  }

  /** Spark's version as the running Spark reports it, or {@code unknown}; for messages only. */
  public static synchronized String sparkVersion() {
    if (version == null) {
      version = "unknown";
      CheckedMethod info =
          CheckedMethod.find(sparkLoader(), "org.apache.spark.SparkBuildInfo", "spark_version", true,
              "java.lang.String");
      if (info.available()) {
        try {
          Object found = info.invoke(null);
          version = found == null ? version : found.toString();
        } catch (RuntimeException | LinkageError e) {
          LOG.debug("arrowbeat: Spark's version is unknown: {}", e.toString());
        }
      }
    }
    return version;
  }

  /** The first method's receiver: this JVM's SparkEnv's block manager, or null (none yet). */
  private static Object blockManager(List<CheckedMethod> chain) {
    SparkEnv env = SparkEnv.get();
    return env == null ? null : chain.get(0).invoke(env);
  }

  /**
   * This executor's local dirs as its block manager resolved them (PySpark hands the same to its
   * workers as SPARK_LOCAL_DIRS); empty when unavailable (warned once) or when Spark has no block
   * manager here yet. What Spark's own method throws comes out as it is.
   */
  public static Optional<List<String>> executorLocalDirs() {
    List<CheckedMethod> chain = chain(Internal.EXECUTOR_LOCAL_DIRS);
    if (broken(chain) != null) {
      return Optional.empty();
    }
    Object blockManager = blockManager(chain);
    Object disk = blockManager == null ? null : chain.get(1).invoke(blockManager);
    File[] dirs = disk == null ? null : (File[]) chain.get(2).invoke(disk);
    if (dirs == null) {
      return Optional.empty();
    }
    List<String> paths = new ArrayList<>();
    for (File dir : dirs) {
      paths.add(dir.getPath());
    }
    return Optional.of(paths);
  }

  /**
   * The executor's host as its block manager registered it; empty when unavailable (warned once)
   * or before the block manager has an id (the driver's own executor, at plugin init).
   */
  public static Optional<String> blockManagerHost() {
    List<CheckedMethod> chain = chain(Internal.EXECUTOR_HOST);
    if (broken(chain) != null) {
      return Optional.empty();
    }
    Object blockManager = blockManager(chain);
    Object id = blockManager == null ? null : chain.get(1).invoke(blockManager);
    return id == null ? Optional.empty() : Optional.ofNullable((String) chain.get(2).invoke(id));
  }

  /**
   * Asks Spark to kill {@code executorId} and start a replacement (as for an executor whose
   * heartbeats time out): whether the scheduler backend accepted; empty when unavailable (warned
   * once). What Spark's own method throws comes out as it is.
   */
  public static Optional<Boolean> killAndReplaceExecutor(SparkContext sc, String executorId) {
    List<CheckedMethod> chain = chain(Internal.KILL_AND_REPLACE_EXECUTOR);
    if (broken(chain) != null) {
      return Optional.empty();
    }
    return Optional.of(Boolean.TRUE.equals(chain.get(0).invoke(sc, executorId)));
  }

  /**
   * Tells Spark's task scheduler that {@code executorId} is lost, as its scheduler backend does once
   * an executor process is gone: the attempts running there fail with {@code ExecutorLostFailure}
   * and are resubmitted at once, and the DAG scheduler forgets the executor's map outputs when
   * they went with it. The reason is {@code ExecutorProcessLost(message, workerHost = None,
   * causedByApp = true)}, as Spark's own {@code HeartbeatReceiver} gives: {@code None} says the
   * host is not lost, only this process, so Spark unregisters this executor's map outputs (its
   * {@code fileLost}: true unless an external shuffle service serves them) and never those of the
   * other executors on the host. Whether it was called: empty when unavailable (warned once),
   * false when Spark has no task scheduler (yet). What Spark's own method throws comes out as it is.
   *
   * <p>Call it only after the scheduler backend stopped offering the executor's cores (after an
   * accepted {@link #killAndReplaceExecutor}): the task scheduler adds back an executor it is
   * offered, and a task sent to a frozen JVM would wait as long as the JVM does.
   */
  public static Optional<Boolean> executorLost(SparkContext sc, String executorId, String message) {
    List<CheckedMethod> chain = chain(Internal.EXECUTOR_LOST);
    if (broken(chain) != null) {
      return Optional.empty();
    }
    Object scheduler = chain.get(0).invoke(sc);
    if (scheduler == null) {
      return Optional.of(false);
    }
    Object reason = chain.get(2).invoke(null, message, scala.Option.empty(), true);
    chain.get(1).invoke(scheduler, executorId, reason);
    return Optional.of(true);
  }

  /**
   * Asks Spark to decommission {@code executorId} (as for an executor it lets go gracefully): no
   * new task goes there, its blocks move where {@code spark.storage.decommission.*} is on, it
   * exits once done, and the cluster manager replaces it (the target count is kept). Whether the
   * scheduler backend accepted: false when it is not an {@code ExecutorAllocationClient} (local
   * mode) or refused; empty when unavailable (warned once). What Spark's own method throws comes
   * out as it is. Only where {@code spark.decommission.enabled} is on does Spark act on it.
   */
  public static Optional<Boolean> decommissionExecutor(SparkContext sc, String executorId, String message) {
    List<CheckedMethod> chain = chain(Internal.DECOMMISSION_EXECUTOR);
    if (broken(chain) != null) {
      return Optional.empty();
    }
    Object backend = chain.get(0).invoke(sc);
    Class<?> client;
    try {
      client = Class.forName(ALLOCATION_CLIENT, false, sparkLoader());
    } catch (ClassNotFoundException e) {
      return Optional.empty(); // the chain found it: cannot happen
    }
    if (backend == null || !client.isInstance(backend)) {
      return Optional.of(false);
    }
    Object info = chain.get(2).invoke(null, message, scala.Option.empty());
    return Optional.of(Boolean.TRUE.equals(chain.get(1).invoke(backend, executorId, info, false, false)));
  }
}
