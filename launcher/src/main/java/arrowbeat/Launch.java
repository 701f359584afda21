package arrowbeat;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import scala.Tuple2;

/**
 * What both plugin sides need to launch a Python process: its command line and settings. Each
 * decision takes its inputs as plain values ({@link Conf}, the environment, the working
 * directory, the search path), so the JUnit tests check it without Spark; the {@link SparkConf}
 * overloads only read Spark's conf and this process's environment.
 */
final class Launch {
  static final String PREFIX = "spark.arrowbeat.";
  static final String SECRET = "spark.arrowbeat.authenticate.secret";
  /** The TLS certificate the driver-side process generated (ready field {@code ssl_cert}). */
  static final String SSL_GENERATED_CERT = "spark.arrowbeat.ssl.generatedCert";
  /** Its private key (ready field {@code ssl_key_secret}): as secret as {@link #SECRET}. */
  static final String SSL_GENERATED_KEY = "spark.arrowbeat.ssl.generatedKeySecret";
  static final String RM_ADDRESS = "spark.arrowbeat.rm.address";
  static final String STARTUP_TIMEOUT = "spark.arrowbeat.startupTimeout";
  static final long STOP_GRACE_MS = 5000;

  private Launch() {}

  static final String PYTHON = "spark.arrowbeat.python";
  static final String DRIVER_PYTHON = "spark.arrowbeat.driver.python";
  /** The driver-side process's module: it takes {@link #DRIVER_PYTHON} first. */
  static final String DRIVER_MODULE = "spark_plugin.processes.driver";

  /** A setting's value, or {@code fallback} when it is unset ({@code SparkConf.get(key, fallback)}). */
  @FunctionalInterface
  interface Conf {
    String get(String key, String fallback);
  }

  /** An interpreter as configured, and where it came from (a key or a variable) for messages. */
  record Interpreter(String source, String path) {}

  /** No interpreter at the configured path here: the process is not started; the message says why. */
  static final class MissingInterpreterException extends IllegalStateException {
    MissingInterpreterException(String message) {
      super(message);
    }
  }

  /**
   * {@code python -u -m module}, with the interpreter resolved where it will run: see {@link
   * #interpreter} and {@link #resolve}. Throws {@link MissingInterpreterException} (one line naming
   * the key, the path and this process's working directory) when it does not exist here.
   */
  static List<String> command(SparkConf conf, String module) {
    return command(
        conf::get, module, System.getenv(), Path.of(System.getProperty("user.dir", ".")),
        System.getenv("PATH"));
  }

  /**
   * {@link #command(SparkConf, String)} from plain values: {@code env} this process's environment,
   * {@code workDir} the child's working directory, {@code searchPath} the PATH.
   */
  static List<String> command(
      Conf conf, String module, Map<String, String> env, Path workDir, String searchPath) {
    Interpreter interpreter = interpreter(conf, DRIVER_MODULE.equals(module), env);
    String python = resolve(interpreter, workDir, searchPath);
    List<String> command = new ArrayList<>();
    command.add(python);
    command.add("-u");
    command.add("-m");
    command.add(module);
    return command;
  }

  /**
   * The interpreter: for the driver-side process spark.arrowbeat.driver.python first (a packed
   * environment's relative path in spark.arrowbeat.python exists only on executors); then
   * spark.arrowbeat.python, else PYSPARK_PYTHON, else spark.pyspark.python, else python3.
   */
  static Interpreter interpreter(Conf conf, boolean driver, Map<String, String> env) {
    if (driver && !conf.get(DRIVER_PYTHON, "").isEmpty()) {
      return new Interpreter(DRIVER_PYTHON, conf.get(DRIVER_PYTHON, ""));
    }
    if (!conf.get(PYTHON, "").isEmpty()) {
      return new Interpreter(PYTHON, conf.get(PYTHON, ""));
    }
    String fromEnv = env.getOrDefault("PYSPARK_PYTHON", "");
    if (!fromEnv.isEmpty()) {
      return new Interpreter("PYSPARK_PYTHON", fromEnv);
    }
    return new Interpreter("spark.pyspark.python", conf.get("spark.pyspark.python", "python3"));
  }

  /**
   * The interpreter's path as this process will start it. A path with a slash is taken relative to
   * {@code workDir} (the working directory the child is started in: an executor's own, where Spark
   * unpacks {@code --archives}) and must be an executable file there; a bare name must be one on
   * {@code searchPath}. Checked here so a missing interpreter is one clear log line, not a failed
   * start with a stack trace.
   */
  static String resolve(Interpreter interpreter, Path workDir, String searchPath) {
    String path = interpreter.path();
    if (path.contains("/")) {
      Path resolved = workDir.resolve(path);
      if (!Files.isRegularFile(resolved) || !Files.isExecutable(resolved)) {
        throw new MissingInterpreterException(
            String.format(
                "%s=%s: no executable Python at %s (relative paths are resolved against the "
                    + "working directory %s)",
                interpreter.source(), path, resolved, workDir));
      }
      return resolved.toString();
    }
    for (String dir : (searchPath == null ? "" : searchPath).split(File.pathSeparator)) {
      if (!dir.isEmpty() && Files.isExecutable(Path.of(dir, path))) {
        return path;
      }
    }
    throw new MissingInterpreterException(
        String.format("%s=%s: no such executable on the PATH (%s)", interpreter.source(), path, searchPath));
  }

  /** Every spark.arrowbeat.* key plus the application's identity. */
  static Map<String, String> settings(SparkConf conf) {
    Map<String, String> all = new LinkedHashMap<>();
    for (Tuple2<String, String> kv : conf.getAll()) {
      all.put(kv._1(), kv._2());
    }
    return settings(all);
  }

  /** {@link #settings(SparkConf)} of a conf's entries, in their order. */
  static Map<String, String> settings(Map<String, String> conf) {
    Map<String, String> settings = new LinkedHashMap<>();
    conf.forEach(
        (key, value) -> {
          if (key.startsWith(PREFIX)) {
            settings.put(key, value);
          }
        });
    settings.put("spark.app.id", conf.getOrDefault("spark.app.id", ""));
    settings.put("spark.app.name", conf.getOrDefault("spark.app.name", ""));
    settings.put("spark.sql.warehouse.dir", conf.getOrDefault("spark.sql.warehouse.dir", ""));
    return settings;
  }

  static long startupTimeoutMs(SparkConf conf) {
    try {
      return conf.getTimeAsMs(STARTUP_TIMEOUT, "30s");
    } catch (RuntimeException e) {
      return 30_000; // The Python side names the bad value; here it must not stop the launch.
    }
  }

  static String newSecret() {
    byte[] bytes = new byte[32];
    new SecureRandom().nextBytes(bytes);
    return HexFormat.of().formatHex(bytes);
  }

  static long pulseMs(Map<String, String> readyInfo) {
    try {
      return Long.parseLong(readyInfo.getOrDefault("pulse_ms", "0"));
    } catch (NumberFormatException e) {
      return 0;
    }
  }
}
