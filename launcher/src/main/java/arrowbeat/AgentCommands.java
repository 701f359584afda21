package arrowbeat;

import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What an executor's agent may ask of its JVM, and nothing else: its executor's map outputs are
 * gone ({@link Protocol#OUTPUTS_LOST}), it wants the stack of one running task's thread ({@link
 * Protocol#JSTACK}), or it cannot reach the RM at an address ({@link Protocol#RM_UNREACHABLE}).
 * Any other verb, {@code kill-executor} included, is refused with a warning. The lines reach here
 * already parsed ({@link Protocol#parseCommand}: a malformed one is refused by {@link Sidecar});
 * the actions are handed in ({@link Actions}), so the JUnit tests run every route without Spark.
 */
final class AgentCommands implements Consumer<Protocol.Command> {
  private static final Logger LOG = LoggerFactory.getLogger(AgentCommands.class);

  /** What the executor plugin does for a command. */
  interface Actions {
    /** Tell the driver, off the agent's protocol thread, that this executor's outputs are lost. */
    void outputsLost(String reason);

    /** Ask the driver, off the protocol thread, whether the RM moved from {@code dialled}. */
    void rmUnreachable(String dialled);

    /** The stack of task {@code taskId}'s thread, or null if it is not running. */
    String stackOf(long taskId);

    /** One line to the agent. */
    void send(String line);
  }

  private final String executorId;
  private final Actions actions;

  AgentCommands(String executorId, Actions actions) {
    this.executorId = executorId;
    this.actions = actions;
  }

  @Override
  public void accept(Protocol.Command command) {
    if (Protocol.OUTPUTS_LOST.equals(command.verb())) {
      LOG.error("arrowbeat map outputs of executor {} are lost ({}); telling the driver, which "
          + "has Spark replace the executor so their map partitions are recomputed", executorId,
          command.argument());
      actions.outputsLost(command.argument());
    } else if (Protocol.RM_UNREACHABLE.equals(command.verb())) {
      actions.rmUnreachable(command.argument()); // did the RM move? (a restart on another port)
    } else if (Protocol.JSTACK.equals(command.verb())) {
      String stack = actions.stackOf(Long.parseLong(command.argument()));
      actions.send(Protocol.stack(command.argument(), stack));
    } else {
      LOG.warn("arrowbeat agent of executor {} may not give command {}; ignored",
          executorId, command.verb());
    }
  }
}
