package arrowbeat;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One supervised Python child process.
 *
 * <p>Protocol (the Python side is {@code spark_plugin.sidecar}): the JVM writes the settings to the
 * child's stdin as {@code key<TAB>value} lines closed by an empty line, so secrets never appear in
 * argv or the environment. The child answers with one stdout line {@code ARROWBEAT-READY k=v ...}.
 * From then on the JVM writes one pulse line per pulse interval: it proves this JVM is not frozen.
 * EOF on stdin means the JVM is gone (even after SIGKILL, since the kernel closes the pipe), and the
 * child exits. Everything else the child prints is copied to the JVM's log.
 */
final class Sidecar {
  static final String READY = "ARROWBEAT-READY";
  static final String COMMAND = "ARROWBEAT-CMD ";
  private static final Logger LOG = LoggerFactory.getLogger(Sidecar.class);
  private static final int TAIL_LINES = 30;

  private final String name;
  private final Process process;
  private final OutputStream stdin;
  private final Deque<String> tail = new ArrayDeque<>();
  private final CompletableFuture<Map<String, String>> ready = new CompletableFuture<>();
  private volatile boolean stopping;
  private volatile java.util.function.Consumer<String> commands = line -> {};
  private volatile Runnable onUnexpectedExit = () -> {};
  private Thread pulser;

  private Sidecar(String name, Process process) {
    this.name = name;
    this.process = process;
    this.stdin = process.getOutputStream();
  }

  /** Starts {@code python -m module}, hands it the settings and waits for its ready line. */
  static Sidecar start(
      String name, List<String> command, Map<String, String> settings, long readyTimeoutMs)
      throws IOException, SidecarException {
    ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
    String workDir = System.getProperty("user.dir");
    if (workDir != null) {
      builder.directory(new File(workDir));
    }
    Sidecar sidecar = new Sidecar(name, builder.start());
    sidecar.startOutputPump();
    sidecar.writeSettings(settings);
    try {
      Map<String, String> info = sidecar.ready.get(readyTimeoutMs, TimeUnit.MILLISECONDS);
      LOG.info("arrowbeat {} started: {}", name, info);
      return sidecar;
    } catch (java.util.concurrent.TimeoutException e) {
      sidecar.stop(0);
      throw new SidecarException(
          name + " did not report ready within " + readyTimeoutMs + " ms" + sidecar.tailText());
    } catch (java.util.concurrent.ExecutionException | InterruptedException e) {
      sidecar.stop(0);
      Throwable cause = e.getCause() == null ? e : e.getCause();
      throw new SidecarException(name + " failed to start: " + cause.getMessage() + sidecar.tailText());
    }
  }

  Map<String, String> info() {
    return ready.getNow(new HashMap<>());
  }

  long pid() {
    return process.pid();
  }

  private void writeSettings(Map<String, String> settings) throws IOException {
    StringBuilder out = new StringBuilder();
    for (Map.Entry<String, String> e : settings.entrySet()) {
      out.append(escape(e.getKey())).append('\t').append(escape(e.getValue())).append('\n');
    }
    out.append('\n');
    stdin.write(out.toString().getBytes(StandardCharsets.UTF_8));
    stdin.flush();
  }

  private static String escape(String s) {
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t");
  }

  /** Copies the child's output to the log; the first ready line completes {@link #ready}. */
  private void startOutputPump() {
    Thread pump =
        new Thread(
            () -> {
              try (BufferedReader reader =
                  new BufferedReader(
                      new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = reader.readLine()) != null) {
                  if (!ready.isDone() && line.startsWith(READY)) {
                    ready.complete(parseReady(line));
                    continue;
                  }
                  if (line.startsWith(COMMAND)) {
                    commands.accept(line.substring(COMMAND.length()).trim());
                    continue;
                  }
                  remember(line);
                  LOG.info("[arrowbeat {}] {}", name, line);
                }
              } catch (IOException e) {
                LOG.debug("arrowbeat {} output closed: {}", name, e.toString());
              }
              ready.completeExceptionally(
                  new IllegalStateException("process exited before it was ready"));
              if (!stopping) {
                LOG.warn("arrowbeat {} exited{}", name, tailText());
                if (ready.isDone() && !ready.isCompletedExceptionally()) {
                  onUnexpectedExit.run();
                }
              }
            },
            "arrowbeat-" + name + "-output");
    pump.setDaemon(true);
    pump.start();
  }

  private synchronized void remember(String line) {
    tail.addLast(line);
    while (tail.size() > TAIL_LINES) {
      tail.removeFirst();
    }
  }

  private synchronized String tailText() {
    return tail.isEmpty() ? "" : "; its last output:\n  " + String.join("\n  ", tail);
  }

  private static Map<String, String> parseReady(String line) {
    Map<String, String> info = new HashMap<>();
    for (String part : line.substring(READY.length()).trim().split(" ")) {
      int eq = part.indexOf('=');
      if (eq > 0) {
        info.put(part.substring(0, eq), part.substring(eq + 1));
      }
    }
    return info;
  }

  /** Runs (on the output thread) when a child that had been ready exits without being stopped. */
  void onUnexpectedExit(Runnable handler) {
    onUnexpectedExit = handler;
  }

  /** Lines {@code ARROWBEAT-CMD <words>} from the child go to {@code handler}. */
  void onCommand(java.util.function.Consumer<String> handler) {
    commands = handler;
  }

  /**
   * Writes a pulse line {@code p <running tasks>} every {@code intervalMs}; stops when the child's
   * stdin breaks.
   */
  void startPulses(long intervalMs, java.util.function.IntSupplier runningTasks) {
    if (intervalMs <= 0) {
      return;
    }
    pulser =
        new Thread(
            () -> {
              try {
                while (!stopping && process.isAlive()) {
                  String pulse = "p " + runningTasks.getAsInt() + "\n";
                  synchronized (stdin) {
                    stdin.write(pulse.getBytes(StandardCharsets.UTF_8));
                    stdin.flush();
                  }
                  Thread.sleep(intervalMs);
                }
              } catch (IOException | InterruptedException e) {
                LOG.debug("arrowbeat {} pulses stopped: {}", name, e.toString());
              }
            },
            "arrowbeat-" + name + "-pulse");
    pulser.setDaemon(true);
    pulser.start();
  }

  /** Sends one line to the child (between pulses; the pulse thread writes under the same lock). */
  void send(String line) {
    synchronized (stdin) {
      try {
        stdin.write((line + "\n").getBytes(StandardCharsets.UTF_8));
        stdin.flush();
      } catch (IOException e) {
        LOG.debug("arrowbeat {} did not take {}: {}", name, line, e.toString());
      }
    }
  }

  /** Closes stdin (the child's signal to stop), then escalates to SIGTERM and SIGKILL. */
  void stop(long graceMs) {
    stopping = true;
    if (pulser != null) {
      pulser.interrupt();
    }
    send("stop"); // An orderly stop; EOF without it tells the child that its JVM died.
    try {
      stdin.close();
    } catch (IOException e) {
      LOG.debug("arrowbeat {} stdin close: {}", name, e.toString());
    }
    try {
      if (!process.waitFor(graceMs, TimeUnit.MILLISECONDS)) {
        process.destroy();
        if (!process.waitFor(2, TimeUnit.SECONDS)) {
          process.destroyForcibly();
          process.waitFor(2, TimeUnit.SECONDS);
        }
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }

  /** A start failure with the child's last output attached. */
  static final class SidecarException extends Exception {
    SidecarException(String message) {
      super(message);
    }
  }
}
