package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The command line a Python process starts with: which interpreter (the keys' and variables'
 * order), where it is resolved (an executor's working directory, the PATH), a clear error when it
 * is missing; and the settings both sides hand it.
 */
class LaunchTest {
  @TempDir Path work;

  private static Launch.Conf conf(String... keyValues) {
    Map<String, String> map = new LinkedHashMap<>();
    for (int i = 0; i < keyValues.length; i += 2) {
      map.put(keyValues[i], keyValues[i + 1]);
    }
    return map::getOrDefault;
  }

  private Path executable(String relative) throws IOException {
    Path file = work.resolve(relative);
    Files.createDirectories(file.getParent());
    Files.writeString(file, "#!/bin/sh\n");
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rwxr-xr-x"));
    return file;
  }

  @Test
  void theInterpreterComesFromTheKeysThenTheVariableThenSparksKeyThenPython3() {
    Map<String, String> env = Map.of("PYSPARK_PYTHON", "/env/python");
    Launch.Conf all = conf(Launch.DRIVER_PYTHON, "/d/python", Launch.PYTHON, "env/bin/python",
        "spark.pyspark.python", "/s/python");
    assertEquals(new Launch.Interpreter(Launch.DRIVER_PYTHON, "/d/python"), Launch.interpreter(all, true, env));
    // A packed environment's relative path exists only on executors: the driver's key is the driver's.
    assertEquals(new Launch.Interpreter(Launch.PYTHON, "env/bin/python"), Launch.interpreter(all, false, env));
    assertEquals(new Launch.Interpreter("PYSPARK_PYTHON", "/env/python"),
        Launch.interpreter(conf("spark.pyspark.python", "/s/python"), true, env));
    assertEquals(new Launch.Interpreter("spark.pyspark.python", "/s/python"),
        Launch.interpreter(conf("spark.pyspark.python", "/s/python"), false, Map.of()));
    assertEquals(new Launch.Interpreter("spark.pyspark.python", "python3"),
        Launch.interpreter(conf(Launch.PYTHON, ""), false, Map.of("PYSPARK_PYTHON", "")));
  }

  @Test
  void theCommandIsUnbufferedPythonRunningTheModule() throws IOException {
    Path python = executable("venv/bin/python");
    List<String> command = Launch.command(conf(Launch.PYTHON, "venv/bin/python"),
        "spark_plugin.processes.executor", Map.of(), work, "");
    assertEquals(List.of(python.toString(), "-u", "-m", "spark_plugin.processes.executor"), command);
  }

  @Test
  void theDriversModuleTakesTheDriversInterpreter() throws IOException {
    Path driver = executable("driver/python");
    executable("venv/bin/python");
    List<String> command = Launch.command(
        conf(Launch.DRIVER_PYTHON, driver.toString(), Launch.PYTHON, "venv/bin/python"),
        Launch.DRIVER_MODULE, Map.of(), work, "");
    assertEquals(driver.toString(), command.get(0));
  }

  @Test
  void aBareNameIsLookedUpOnThePath() throws IOException {
    executable("bin/python3");
    List<String> command = Launch.command(conf(), "m", Map.of(), work,
        "/nonexistent:" + work.resolve("bin"));
    assertEquals("python3", command.get(0)); // the OS resolves it the same way
  }

  @Test
  void aMissingInterpreterIsOneClearError() throws IOException {
    Launch.MissingInterpreterException relative = assertThrows(Launch.MissingInterpreterException.class,
        () -> Launch.command(conf(Launch.PYTHON, "env/bin/python"), "m", Map.of(), work, "/usr/bin"));
    assertEquals("spark.arrowbeat.python=env/bin/python: no executable Python at "
        + work.resolve("env/bin/python") + " (relative paths are resolved against the working directory "
        + work + ")", relative.getMessage());
    Launch.MissingInterpreterException bare = assertThrows(Launch.MissingInterpreterException.class,
        () -> Launch.command(conf(), "m", Map.of("PYSPARK_PYTHON", "nopython"), work, work.toString()));
    assertEquals("PYSPARK_PYTHON=nopython: no such executable on the PATH (" + work + ")", bare.getMessage());
    // A file that is not executable is no interpreter either.
    Path plain = work.resolve("plain");
    Files.writeString(plain, "");
    assertThrows(Launch.MissingInterpreterException.class,
        () -> Launch.command(conf(Launch.PYTHON, plain.toString()), "m", Map.of(), work, ""));
    // Nor is a start without a PATH at all.
    assertThrows(Launch.MissingInterpreterException.class,
        () -> Launch.command(conf(), "m", Map.of(), work, null));
  }

  @Test
  void settingsAreEveryArrowbeatKeyAndTheApplicationsIdentity() {
    Map<String, String> sparkConf = new LinkedHashMap<>();
    sparkConf.put("spark.arrowbeat.rm.port", "0");
    sparkConf.put("spark.executor.memory", "1g");
    sparkConf.put("spark.arrowbeat.authenticate.secret", "s3cret");
    sparkConf.put("spark.app.name", "demo");
    Map<String, String> settings = Launch.settings(sparkConf);
    assertEquals(List.of("spark.arrowbeat.rm.port", "spark.arrowbeat.authenticate.secret", "spark.app.id",
        "spark.app.name", "spark.sql.warehouse.dir"), List.copyOf(settings.keySet()));
    assertEquals("", settings.get("spark.app.id"));
    assertEquals("demo", settings.get("spark.app.name"));
  }

  @Test
  void aPulseIntervalIsReadFromTheReadyLineOrIsNone() {
    assertEquals(500, Launch.pulseMs(Map.of("pulse_ms", "500")));
    assertEquals(0, Launch.pulseMs(Map.of()));
    assertEquals(0, Launch.pulseMs(Map.of("pulse_ms", "soon")));
  }

  @Test
  void aNewSecretIs32RandomBytesInHex() {
    String one = Launch.newSecret();
    assertTrue(one.matches("[0-9a-f]{64}"), one);
    assertTrue(!one.equals(Launch.newSecret()));
  }
}
