package arrowbeat;

import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import scala.Tuple2;

/** What both plugin sides need to launch a Python process: its command line and settings. */
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

  /** The interpreter: spark.arrowbeat.python, else PYSPARK_PYTHON, else spark.pyspark.python. */
  static List<String> command(SparkConf conf, String module) {
    String python = conf.get("spark.arrowbeat.python", "");
    if (python.isEmpty()) {
      python = System.getenv().getOrDefault("PYSPARK_PYTHON", "");
    }
    if (python.isEmpty()) {
      python = conf.get("spark.pyspark.python", "python3");
    }
    List<String> command = new ArrayList<>();
    command.add(python);
    command.add("-u");
    command.add("-m");
    command.add(module);
    return command;
  }

  /** Every spark.arrowbeat.* key plus the application's identity. */
  static Map<String, String> settings(SparkConf conf) {
    Map<String, String> settings = new LinkedHashMap<>();
    for (Tuple2<String, String> kv : conf.getAll()) {
      if (kv._1().startsWith(PREFIX)) {
        settings.put(kv._1(), kv._2());
      }
    }
    settings.put("spark.app.id", conf.get("spark.app.id", ""));
    settings.put("spark.app.name", conf.get("spark.app.name", ""));
    settings.put("spark.sql.warehouse.dir", conf.get("spark.sql.warehouse.dir", ""));
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
