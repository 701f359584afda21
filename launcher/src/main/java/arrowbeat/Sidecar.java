package arrowbeat;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One supervised Python child process.
 *
 * <p>Protocol (every line is declared in {@link Protocol}; the Python side is {@code
 * spark_plugin.jvm.sidecar}): the JVM writes the settings to the
 * child's stdin as {@code key<TAB>value} lines closed by an empty line, so secrets never appear in
 * argv or the environment. From then on the JVM writes one pulse line per pulse interval: it proves
 * this JVM is not frozen. EOF on stdin means the JVM is gone (even after SIGKILL, since the kernel
 * closes the pipe), and the child exits. A JVM that shuts down (SIGTERM, {@code System.exit}: how a
 * cluster manager ends an executor it released) first writes {@code exiting}, so the child can tell
 * that end from a crash; {@code stop} is an orderly stop by the plugin.
 *
 * <p>Two channels come back, kept apart: the child's <b>stdout is its protocol channel</b> (one
 * {@code ARROWBEAT-READY k=v ...} line, then {@link Protocol#parseCommand command} lines: the
 * child's Python side moves its own stdout onto stderr at start-up, so no print or library output
 * lands here), and its <b>stderr is its log</b>, copied line by line to the JVM's log and never
 * parsed. A log line that looks like a command is only ever logged. Every protocol line is
 * validated ({@link Protocol}): anything that is not a well-formed ready line, known command or
 * metrics line is logged (rate-limited) and ignored.
 */
final class Sidecar implements Supervised {
  private static final Logger LOG = LoggerFactory.getLogger(Sidecar.class);
  private static final int TAIL_LINES = 30;
  /** Room for a ready line carrying a generated certificate and key (base64 DER, ~1 KiB). */
  private static final int MAX_PROTOCOL_LINE_BYTES = 2048;
  private static final int MAX_LOG_LINE_BYTES = 16 * 1024;
  private static final Pattern READY_KEY_VALUE = Pattern.compile(Protocol.READY_SSL_KEY + "=[^ ]*");
  /** Environment variables the child does not inherit: secrets of Spark's or the user's. */
  private static final Pattern SECRET_ENV = Pattern.compile("(?i)secret|password|passphrase");

  private final String name;
  private final Process process;
  private final OutputStream stdin;
  private final Redactor redactor;
  private final RateLimitedLog refusals = new RateLimitedLog(LOG, 60_000);
  private final Deque<String> tail = new ArrayDeque<>();
  private final CompletableFuture<Map<String, String>> ready = new CompletableFuture<>();
  private volatile boolean stopping;
  private volatile Consumer<Protocol.Command> commands;
  private volatile java.util.function.Predicate<String> metrics;
  private volatile Runnable onUnexpectedExit = () -> {};
  private volatile Consumer<Protocol.Alive> alive;
  private volatile Runnable onPulse = () -> {};
  private Thread logPump;
  private Thread pulser;
  private final Thread exitNotice = new Thread(() -> send(Protocol.EXITING), "arrowbeat-exiting");

  private Sidecar(String name, Process process, Redactor redactor) {
    this.name = name;
    this.process = process;
    this.stdin = process.getOutputStream();
    this.redactor = redactor;
  }

  /** Starts {@code python -m module}, hands it the settings and waits for its ready line. */
  static Sidecar start(
      String name, List<String> command, Map<String, String> settings, long readyTimeoutMs)
      throws IOException, SidecarException {
    ProcessBuilder builder = new ProcessBuilder(command);
    builder.environment().keySet().removeIf(key -> SECRET_ENV.matcher(key).find());
    String workDir = System.getProperty("user.dir");
    if (workDir != null) {
      builder.directory(new File(workDir));
    }
    Sidecar sidecar = new Sidecar(name, builder.start(), new Redactor(settings));
    sidecar.startLogPump();
    sidecar.startProtocolPump();
    sidecar.writeSettings(settings);
    Runtime.getRuntime().addShutdownHook(sidecar.exitNotice);
    try {
      Map<String, String> info = sidecar.ready.get(readyTimeoutMs, TimeUnit.MILLISECONDS);
      Map<String, String> shown = new HashMap<>(info);
      shown.remove(Protocol.READY_SSL_KEY); // never logged, not even redacted
      if (shown.containsKey(Protocol.READY_SSL_CERT)) {
        String cert = shown.get(Protocol.READY_SSL_CERT);
        shown.put(Protocol.READY_SSL_CERT, "<" + cert.length() + " base64 chars>");
      }
      LOG.info("arrowbeat {} started: {}", name, sidecar.redactor.clean(shown.toString()));
      return sidecar;
    } catch (java.util.concurrent.TimeoutException e) {
      sidecar.stop(0);
      throw new SidecarException(
          name + " did not report ready within " + readyTimeoutMs + " ms" + sidecar.tailText(), -1);
    } catch (java.util.concurrent.ExecutionException | InterruptedException e) {
      sidecar.stop(0);
      Throwable cause = e.getCause() == null ? e : e.getCause();
      throw new SidecarException(
          name + " failed to start: " + cause.getMessage() + sidecar.tailText(), sidecar.exitCode());
    }
  }

  @Override
  public Map<String, String> info() {
    return ready.getNow(new HashMap<>());
  }

  @Override
  public long pid() {
    return process.pid();
  }

  private void writeSettings(Map<String, String> settings) throws IOException {
    stdin.write(Protocol.settings(settings).getBytes(StandardCharsets.UTF_8));
    stdin.flush();
  }

  /** The child's stderr, its log: copied to the JVM's log line by line, never parsed. */
  private void startLogPump() {
    logPump =
        new Thread(
            () -> {
              try (BoundedLineReader reader =
                  new BoundedLineReader(process.getErrorStream(), MAX_LOG_LINE_BYTES)) {
                String line;
                while ((line = reader.next()) != null) {
                  String shown = redactor.clean(line) + (reader.truncated() ? "...(cut)" : "");
                  remember(shown);
                  LOG.info("[arrowbeat {}] {}", name, shown);
                }
              } catch (IOException e) {
                LOG.debug("arrowbeat {} log closed: {}", name, e.toString());
              }
            },
            "arrowbeat-" + name + "-log");
    logPump.setDaemon(true);
    logPump.start();
  }

  /**
   * The child's stdout, its protocol channel: the first valid ready line completes {@link #ready};
   * after it, valid commands go to the handler. Its end (the child closed it or exited) is the
   * child's end: an unexpected one runs {@link #onUnexpectedExit}.
   */
  private void startProtocolPump() {
    Thread pump =
        new Thread(
            () -> {
              try (BoundedLineReader reader =
                  new BoundedLineReader(process.getInputStream(), MAX_PROTOCOL_LINE_BYTES)) {
                String line;
                while ((line = reader.next()) != null) {
                  onProtocolLine(line, reader.truncated());
                }
              } catch (IOException e) {
                LOG.debug("arrowbeat {} protocol channel closed: {}", name, e.toString());
              }
              awaitExit();
              forgetExitNotice();
              ready.completeExceptionally(
                  new IllegalStateException("process exited before it was ready"));
              if (!stopping) {
                LOG.warn("arrowbeat {} exited{}", name, tailText());
                if (ready.isDone() && !ready.isCompletedExceptionally()) {
                  onUnexpectedExit.run();
                }
              }
            },
            "arrowbeat-" + name + "-protocol");
    pump.setDaemon(true);
    pump.start();
  }

  /** After the protocol channel ended: the process's exit, and its last log lines read. */
  private void awaitExit() {
    try {
      process.waitFor();
      logPump.join(2000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void onProtocolLine(String line, boolean truncated) {
    if (truncated) {
      refuse("an over-long line", line);
      return;
    }
    if (!ready.isDone()) {
      Map<String, String> info = Protocol.parseReady(line);
      if (info == null) {
        refuse("a line that is not its ready line", line);
      } else {
        String key = info.get(Protocol.READY_SSL_KEY);
        if (key != null) {
          redactor.learn(key); // before anything could log it
        }
        ready.complete(info);
      }
      return;
    }
    if (line.startsWith(Protocol.ALIVE + " ")) {
      Protocol.Alive answer = Protocol.parseAlive(line);
      Consumer<Protocol.Alive> sink = alive;
      if (answer == null || sink == null) {
        refuse("a malformed alive line, or one it may not give", line);
      } else {
        sink.accept(answer);
      }
      return;
    }
    if (line.startsWith(Protocol.METRICS + " ")) {
      java.util.function.Predicate<String> sink = metrics;
      if (sink == null || !sink.test(line)) {
        refuse("a malformed metrics line, or one it may not give", line);
      }
      return;
    }
    Protocol.Command command = Protocol.parseCommand(line);
    Consumer<Protocol.Command> handler = commands;
    if (command == null) {
      refuse("a line that is not a known command (" + Protocol.commandError(line) + ")", line);
    } else if (handler == null) {
      refuse("a command, but it may give none", line);
    } else {
      try {
        handler.accept(command);
      } catch (RuntimeException e) {
        LOG.warn("arrowbeat {}: command {} failed: {}", name, command, e.toString());
      }
    }
  }

  private void refuse(String what, String line) {
    refusals.warn(
        "arrowbeat "
            + name
            + " wrote "
            + what
            + " on its protocol channel; ignored: "
            + redactor.excerpt(
                READY_KEY_VALUE.matcher(line).replaceAll(Protocol.READY_SSL_KEY + "=<redacted>"), 120));
  }

  private synchronized void remember(String line) {
    tail.addLast(line);
    while (tail.size() > TAIL_LINES) {
      tail.removeFirst();
    }
  }

  /** The child's last log line (redacted; empty if it wrote none): an exited agent's cause. */
  @Override
  public synchronized String lastLogLine() {
    return tail.isEmpty() ? "" : tail.peekLast();
  }

  private synchronized String tailText() {
    return tail.isEmpty() ? "" : "; its last output:\n  " + String.join("\n  ", tail);
  }

  /** Runs (on the protocol thread) when a child that had been ready exits without being stopped. */
  @Override
  public void onUnexpectedExit(Runnable handler) {
    onUnexpectedExit = handler;
  }

  /**
   * Valid {@link Protocol.Command}s from the child go to {@code handler}; without one (the agents), every
   * command is refused.
   */
  void onCommand(Consumer<Protocol.Command> handler) {
    commands = handler;
  }

  /**
   * {@link PluginMetrics} lines from the child go to {@code sink}, which applies a valid one and
   * returns false for anything else (then refused, as a malformed command is).
   */
  void onMetrics(java.util.function.Predicate<String> sink) {
    metrics = sink;
  }

  /** The child's answers to pulses ({@link Protocol#parseAlive}) go to {@code sink}; without one, refused. */
  @Override
  public void onAlive(Consumer<Protocol.Alive> sink) {
    alive = sink;
  }

  /** Runs on the pulse thread after each pulse written (the hang detector's start of a wait). */
  @Override
  public void onPulse(Runnable written) {
    onPulse = written;
  }

  @Override
  public boolean isAlive() {
    return process.isAlive();
  }

  /** The exit status of a child that ended; -1 while it runs. */
  @Override
  public int exitCode() {
    return process.isAlive() ? -1 : process.exitValue();
  }

  /**
   * SIGKILL for a child that stopped answering (a SIGSTOPped one too): no orderly stop, and no
   * {@link #onUnexpectedExit} (the caller restarts it). Waits up to {@code waitMs} for its end.
   */
  @Override
  public void kill(long waitMs) {
    stopping = true;
    forgetExitNotice();
    if (pulser != null) {
      pulser.interrupt();
    }
    process.destroyForcibly();
    try {
      process.waitFor(waitMs, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Writes a pulse line {@code p <running tasks>} every {@code intervalMs}; stops when the child's
   * stdin breaks.
   */
  @Override
  public void startPulses(long intervalMs, java.util.function.IntSupplier runningTasks) {
    if (intervalMs <= 0) {
      return;
    }
    pulser =
        new Thread(
            () -> {
              try {
                while (!stopping && process.isAlive()) {
                  String pulse = Protocol.pulse(runningTasks.getAsInt()) + "\n";
                  synchronized (stdin) {
                    stdin.write(pulse.getBytes(StandardCharsets.UTF_8));
                    stdin.flush();
                  }
                  onPulse.run();
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
  @Override
  public void send(String line) {
    synchronized (stdin) {
      try {
        stdin.write((line + "\n").getBytes(StandardCharsets.UTF_8));
        stdin.flush();
      } catch (IOException e) {
        LOG.debug("arrowbeat {} did not take a line: {}", name, e.toString());
      }
    }
  }

  /** Closes stdin (the child's signal to stop), then escalates to SIGTERM and SIGKILL. */
  @Override
  public void stop(long graceMs) {
    stopping = true;
    forgetExitNotice();
    if (pulser != null) {
      pulser.interrupt();
    }
    send(Protocol.STOP); // An orderly stop; EOF without it tells the child that its JVM died.
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

  /** The shutdown hook is for a live child only; during the JVM's shutdown it cannot be removed. */
  private void forgetExitNotice() {
    try {
      Runtime.getRuntime().removeShutdownHook(exitNotice);
    } catch (IllegalStateException e) {
      LOG.debug("arrowbeat {}: the JVM is shutting down", name);
    }
  }

  /** A start failure with the child's last output attached, and its exit status if it exited. */
  static final class SidecarException extends Exception {
    private final int exitStatus;

    SidecarException(String message, int exitStatus) {
      super(message);
      this.exitStatus = exitStatus;
    }

    /** The child's exit status; -1 if it did not exit (it missed the start-up timeout). */
    int exitStatus() {
      return exitStatus;
    }
  }
}
