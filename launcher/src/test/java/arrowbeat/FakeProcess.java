package arrowbeat;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.function.IntSupplier;

/** A {@link Supervised} child with no process: the test fires its answers, pulses and exit. */
class FakeProcess implements Supervised {
  private final long pid;
  private final Map<String, String> info;
  boolean alive = true;
  int exitCode = -1;
  String lastLogLine = "";
  final List<String> sent = new ArrayList<>();
  long killedWithWaitMs = -1;
  long stoppedWithGraceMs = -1;
  long pulseIntervalMs = -1;
  private Consumer<Protocol.Alive> aliveSink;
  private Runnable pulseSink = () -> {};
  private Runnable exitHandler = () -> {};

  /** {@code ready} as {@code key=value} words, as in a ready line. */
  FakeProcess(long pid, String... ready) {
    this.pid = pid;
    this.info = new HashMap<>();
    for (String field : ready) {
      String[] kv = field.split("=", 2);
      info.put(kv[0], kv[1]);
    }
  }

  /** The child answers a pulse (complete until, unsaved rows). */
  void answer(long completeUntilMs, long unsavedRows) {
    if (aliveSink == null) {
      throw new IllegalStateException("no one reads its answers");
    }
    aliveSink.accept(new Protocol.Alive(completeUntilMs, unsavedRows));
  }

  /** The JVM wrote a pulse to it. */
  void pulse() {
    pulseSink.run();
  }

  /** It exits on its own with {@code code}, its last log line {@code line}. */
  void exit(int code, String line) {
    alive = false;
    exitCode = code;
    lastLogLine = line;
    exitHandler.run();
  }

  @Override
  public long pid() {
    return pid;
  }

  @Override
  public Map<String, String> info() {
    return info;
  }

  @Override
  public boolean isAlive() {
    return alive;
  }

  @Override
  public int exitCode() {
    return alive ? -1 : exitCode;
  }

  @Override
  public String lastLogLine() {
    return lastLogLine;
  }

  @Override
  public void send(String line) {
    sent.add(line);
  }

  @Override
  public void kill(long waitMs) {
    killedWithWaitMs = waitMs;
    alive = false;
    exitCode = 137;
  }

  @Override
  public void stop(long graceMs) {
    stoppedWithGraceMs = graceMs;
    alive = false;
    exitCode = 0;
  }

  @Override
  public void onAlive(Consumer<Protocol.Alive> sink) {
    aliveSink = sink;
  }

  @Override
  public void onPulse(Runnable written) {
    pulseSink = written;
  }

  @Override
  public void onUnexpectedExit(Runnable handler) {
    exitHandler = handler;
  }

  @Override
  public void startPulses(long intervalMs, IntSupplier runningTasks) {
    pulseIntervalMs = intervalMs;
  }
}
