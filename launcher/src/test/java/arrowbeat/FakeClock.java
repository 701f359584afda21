package arrowbeat;

/** A {@link Clock} moved by hand. */
final class FakeClock implements Clock {
  private long now;

  FakeClock(long start) {
    now = start;
  }

  @Override
  public long nowMs() {
    return now;
  }

  void set(long ms) {
    if (ms < now) {
      throw new IllegalArgumentException("a monotonic clock never goes back");
    }
    now = ms;
  }
}
