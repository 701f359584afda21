package arrowbeat;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.RejectedExecutionException;
import org.junit.jupiter.api.Test;

/** Where an executor's agent finds the RM: the driver's setting, then its answers to an ask. */
class RmAddressTest {
  private final Deque<Object> answers = new ArrayDeque<>();
  private final List<String> toAgent = new ArrayList<>();
  private final List<Runnable> queued = new ArrayList<>();
  private int asks;

  private RmAddress address(String initial) {
    return new RmAddress("3", initial, message -> {
      asks++;
      assertEquals(Protocol.RM_ADDRESS_QUERY, message);
      Object next = answers.removeFirst();
      if (next instanceof Exception e) {
        throw e;
      }
      return next;
    }, queued::add, toAgent::add);
  }

  @Test
  void pendingUntilAnAskReturnsAnAddress() {
    RmAddress rm = address(null);
    assertFalse(rm.known());
    answers.add(""); // the driver's RM is down
    answers.add(new IllegalStateException("rpc timeout"));
    answers.add(42); // not an address: ignored
    answers.add("10.0.0.1:4040");
    assertNull(rm.ask(""));
    assertNull(rm.ask(""));
    assertNull(rm.ask(""));
    assertEquals("", rm.current());
    assertEquals("10.0.0.1:4040", rm.ask(""));
    assertTrue(rm.known());
    assertEquals("10.0.0.1:4040", rm.current());
    assertEquals(List.of(), toAgent); // a first start: no agent to tell
  }

  @Test
  void anRmThatMovedIsToldToTheAgentAndKeptForTheNextStart() {
    RmAddress rm = address("10.0.0.1:4040");
    answers.add("10.0.0.1:4040");
    assertEquals("10.0.0.1:4040", rm.ask("10.0.0.1:4040"));
    assertEquals(List.of(), toAgent); // it did not move
    answers.add("10.0.0.1:4999");
    assertEquals("10.0.0.1:4999", rm.ask("10.0.0.1:4040"));
    assertEquals(List.of("rm 10.0.0.1:4999"), toAgent);
    assertEquals("10.0.0.1:4999", rm.current());
  }

  @Test
  void oneAskAtATime() {
    RmAddress rm = address("10.0.0.1:4040");
    rm.askLater("10.0.0.1:4040");
    rm.askLater("10.0.0.1:4040"); // in flight: skipped
    assertEquals(1, queued.size());
    answers.add("10.0.0.1:4999");
    queued.remove(0).run();
    assertEquals(1, asks);
    rm.askLater("10.0.0.1:4999"); // done: the next may go
    assertEquals(1, queued.size());
  }

  @Test
  void aRefusedAskFreesTheNext() {
    boolean[] refuse = {true};
    RmAddress rm = new RmAddress("3", "10.0.0.1:4040", message -> "10.0.0.1:4040",
        task -> {
          if (refuse[0]) {
            refuse[0] = false;
            throw new RejectedExecutionException("busy");
          }
          queued.add(task);
        }, toAgent::add);
    rm.askLater("10.0.0.1:4040"); // refused: not in flight
    rm.askLater("10.0.0.1:4040");
    assertEquals(1, queued.size());
  }
}
