package arrowbeat;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * What the JVM logs of a child (its log lines, its ready line, a refused protocol line) passes
 * through here: every secret the child was handed is replaced by {@code <redacted>}, and control
 * characters (and Unicode's invisible line and direction marks) are escaped, so a line from the
 * child stays one line of the JVM's log and cannot disguise itself. A second line of defence: the
 * Python side never logs the secret either.
 */
final class Redactor {
  /** Setting keys whose values are secrets (Spark's default {@code spark.redaction.regex}). */
  static final Pattern SECRET_KEY = Pattern.compile("(?i)secret|password|token|access[.]?key|account[.]key");

  private static final int MIN_SECRET_CHARS = 6;
  private final List<String> secrets = new CopyOnWriteArrayList<>();

  Redactor(Map<String, String> settings) {
    for (Map.Entry<String, String> e : settings.entrySet()) {
      String value = e.getValue();
      if (value != null
          && value.length() >= MIN_SECRET_CHARS
          && SECRET_KEY.matcher(e.getKey()).find()) {
        secrets.add(value);
      }
    }
  }

  /** Adds a secret the child announced (a generated TLS key): redacted from here on. */
  void learn(String secret) {
    if (secret != null && secret.length() >= MIN_SECRET_CHARS && !secrets.contains(secret)) {
      secrets.add(secret);
    }
  }

  /** {@code text} with every secret replaced and every control or invisible mark escaped. */
  String clean(String text) {
    String out = text;
    for (String secret : secrets) {
      out = out.replace(secret, "<redacted>");
    }
    return escapeControls(out);
  }

  /** {@link #clean}, cut to {@code maxChars} for a warning about a refused line. */
  String excerpt(String text, int maxChars) {
    String cleaned = clean(text);
    return cleaned.length() <= maxChars ? cleaned : cleaned.substring(0, maxChars) + "...(cut)";
  }

  static String escapeControls(String text) {
    StringBuilder out = null;
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      boolean unsafe =
          (Character.isISOControl(c) && c != '\t')
              || c == '\u2028'
              || c == '\u2029'
              || (c >= '\u202a' && c <= '\u202e')
              || (c >= '\u2066' && c <= '\u2069');
      if (unsafe && out == null) {
        out = new StringBuilder(text.length() + 16).append(text, 0, i);
      }
      if (out != null) {
        if (unsafe) {
          out.append(String.format("\\u%04x", (int) c));
        } else {
          out.append(c);
        }
      }
    }
    return out == null ? text : out.toString();
  }
}
