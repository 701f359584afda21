/**
 * A long stop-the-world garbage collection on demand, for tests: called on an executor through
 * Spark SQL's {@code java_method('GcPause', 'pause', n)}, it builds a live chain of {@code n} small
 * objects, then runs a full collection (a serial collector must mark all of them in one pause).
 * Compiled by the test that uses it, never shipped.
 */
public final class GcPause {
  private static Object[] keep;

  private GcPause() {}

  /** Returns how long the full collection took, in milliseconds. */
  public static long pause(int count) {
    Object[] nodes = new Object[count];
    for (int i = 0; i < count; i++) {
      nodes[i] = new Object[] {i > 0 ? nodes[i - 1] : null};
    }
    keep = nodes;
    long start = System.nanoTime();
    System.gc();
    long took = (System.nanoTime() - start) / 1_000_000;
    keep = null;
    return took;
  }
}
