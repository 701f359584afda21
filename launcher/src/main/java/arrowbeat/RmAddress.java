package arrowbeat;

import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Where an executor's agent finds the RM, as last learnt: the driver's settings at start (empty
 * while the driver's RM is pending), then the driver plugin's answers to {@link
 * Protocol#RM_ADDRESS_QUERY}. A restarted RM that could not bind its port again serves on another:
 * an agent that cannot reach the RM says so ({@link Protocol#RM_UNREACHABLE}), {@link #askLater}
 * asks the driver (one ask at a time, off the agent's threads) and, if the RM moved, the running
 * agent is told ({@link Protocol#rm}) and any later one starts with the new address. No Spark
 * here: the ask is handed in ({@link Driver}).
 */
final class RmAddress {
  private static final Logger LOG = LoggerFactory.getLogger(RmAddress.class);

  /** The ask of the driver plugin ({@code PluginContext.ask}: Spark's RPC, which may wait). */
  @FunctionalInterface
  interface Driver {
    Object ask(Object message) throws Exception;
  }

  private final String executorId;
  private final Driver driver;
  private final Executor asker;
  private final Consumer<String> toAgent;
  private volatile String address;
  private final AtomicBoolean asking = new AtomicBoolean();

  /**
   * {@code initial} is the driver's setting (null or empty while its RM is pending); {@code asker}
   * runs {@link #askLater}'s asks; {@code toAgent} sends a line to the running agent.
   */
  RmAddress(String executorId, String initial, Driver driver, Executor asker, Consumer<String> toAgent) {
    this.executorId = executorId;
    this.address = initial == null ? "" : initial;
    this.driver = driver;
    this.asker = asker;
    this.toAgent = toAgent;
  }

  /** The address last learnt; "" while pending. */
  String current() {
    return address;
  }

  boolean known() {
    return !address.isEmpty();
  }

  /**
   * Asks the driver plugin where the RM is now; if it moved from {@code dialled} (the address the
   * agent could not reach; "" for a first start), later agents start with the new address and the
   * running one is told. The address, or null while the RM is down or the ask failed.
   */
  String ask(String dialled) {
    Object answer;
    try {
      answer = driver.ask(Protocol.RM_ADDRESS_QUERY);
    } catch (Exception e) {
      LOG.debug("arrowbeat could not ask the driver for the RM's address: {}", e.toString());
      return null;
    }
    String now = Protocol.address(answer);
    if (now == null) {
      return null; // the RM is down (being restarted) or has not started yet
    }
    address = now;
    if (dialled.isEmpty()) {
      LOG.info("arrowbeat's RM runs at {}: starting the agent of executor {}", now, executorId);
    } else if (!now.equals(dialled)) {
      LOG.warn("arrowbeat's RM is at {} now (the agent of executor {} dialled {}); telling the agent",
          now, executorId, dialled);
      toAgent.accept(Protocol.rm(now));
    }
    return now;
  }

  /** {@link #ask} on the asker, skipped while an ask is in flight (an agent says it every second). */
  void askLater(String dialled) {
    if (!asking.compareAndSet(false, true)) {
      return;
    }
    try {
      asker.execute(
          () -> {
            try {
              ask(dialled);
            } finally {
              asking.set(false);
            }
          });
    } catch (RejectedExecutionException e) {
      asking.set(false);
    }
  }
}
