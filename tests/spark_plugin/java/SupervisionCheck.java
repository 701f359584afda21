package arrowbeat;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * The driver plugin's supervision decisions ({@link Supervision}) on a fake clock, driven line by
 * line from stdin for tests/spark_plugin/test_supervision.py. Each request is words separated by
 * spaces, every time a fake monotonic millisecond reading; each gets one answer line:
 *
 * <pre>
 * policy HANG_MS MAX WINDOW_MS BACKOFF_MAX_MS  -> ok     (a process announced these; launched at 0)
 * from-ready [k=v ...]                         -> the policy read from ready fields
 * pulse T | answer                             -> ok
 * hung T CHECK_MS                              -> true | false
 * next T                                       -> the earliest restart time at T
 * attempt T | failed T | succeeded             -> ok
 * backoff FAILURES                             -> the delay after that many failures
 * retries-start timeout | exit STATUS | missing -> true | false (is a failed start retried?)
 * </pre>
 */
public final class SupervisionCheck {
  public static void main(String[] args) throws Exception {
    Supervision supervision = new Supervision(Supervision.Policy.DEFAULT);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String request;
    while ((request = in.readLine()) != null) {
      String[] w = request.trim().split(" +");
      String answer = "ok";
      switch (w[0]) {
        case "policy" -> supervision.launched(
            new Supervision.Policy(Long.parseLong(w[1]), Integer.parseInt(w[2]), Long.parseLong(w[3]),
                Long.parseLong(w[4])), 0);
        case "from-ready" -> {
          java.util.Map<String, String> info = new java.util.HashMap<>();
          for (int i = 1; i < w.length; i++) {
            String[] kv = w[i].split("=", 2);
            info.put(kv[0], kv[1]);
          }
          answer = Supervision.Policy.from(info).toString();
        }
        case "pulse" -> supervision.pulsed(Long.parseLong(w[1]));
        case "answer" -> supervision.answered();
        case "hung" -> answer = String.valueOf(supervision.hung(Long.parseLong(w[1]), Long.parseLong(w[2])));
        case "next" -> answer = String.valueOf(supervision.nextRestartAt(Long.parseLong(w[1])));
        case "attempt" -> supervision.attempting(Long.parseLong(w[1]));
        case "failed" -> supervision.failed(Long.parseLong(w[1]));
        case "succeeded" -> supervision.succeeded();
        case "backoff" -> answer = String.valueOf(supervision.backoffMs(Integer.parseInt(w[1])));
        case "retries-start" -> {
          Throwable failure = switch (w[1]) {
            case "timeout" -> new Sidecar.SidecarException("did not report ready", -1);
            case "exit" -> new Sidecar.SidecarException("exited", Integer.parseInt(w[2]));
            case "missing" -> new Launch.MissingInterpreterException("no python");
            default -> throw new IllegalArgumentException("no failure " + w[1]);
          };
          answer = String.valueOf(Supervision.retriesStart(failure));
        }
        default -> throw new IllegalArgumentException("no request " + w[0]);
      }
      System.out.println(answer);
    }
  }
}
