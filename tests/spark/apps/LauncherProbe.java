import arrowbeat.compat.CheckedMethod;
import arrowbeat.compat.SparkInternals;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Executable;
import java.lang.reflect.Method;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Test probe for tests/spark/test_launcher_compat.py, run with the launcher jar and the running
 * pyspark's jars on the class path. One mode per argument:
 *
 * <ul>
 *   <li>{@code links}: reads {@code owner name descriptor} lines (the Spark, Scala, metrics and
 *       slf4j members the launcher's bytecode refers to, as javap shows them) and prints {@code
 *       MISSING ...} for each that this JVM's classes do not have with that exact descriptor
 *       (inherited members count, as the JVM resolves them); then {@code CHECKED <n>}.
 *   <li>{@code overrides <class>...}: for each launcher class, every method it declares under the
 *       name of a method of a Spark supertype must match one of that supertype's signatures (else
 *       Spark would never call it): prints {@code NOT-OVERRIDING ...}; then {@code CHECKED <n>}.
 *   <li>{@code internals}: {@code SparkInternals.unavailable} of every internal, as {@code
 *       UNAVAILABLE <key> <why>} lines; then {@code VERSION <spark version>}.
 *   <li>{@code checks}: {@code CheckedMethod.find} on JDK classes, one {@code CASE <name> <ok|why>}
 *       line per case, and an invocation.
 * </ul>
 */
public final class LauncherProbe {
  private LauncherProbe() {}

  public static void main(String[] args) throws Exception {
    switch (args[0]) {
      case "links" -> links();
      case "overrides" -> overrides(List.of(args).subList(1, args.length));
      case "internals" -> internals();
      case "checks" -> checks();
      default -> throw new IllegalArgumentException(args[0]);
    }
  }

  private static void links() throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    int checked = 0;
    String line;
    while ((line = in.readLine()) != null) {
      String[] parts = line.trim().split(" ");
      if (parts.length != 3) {
        continue;
      }
      checked++;
      String why = resolve(parts[0].replace('/', '.'), parts[1], parts[2]);
      if (why != null) {
        System.out.println("MISSING " + parts[0] + "." + parts[1] + parts[2] + " (" + why + ")");
      }
    }
    System.out.println("CHECKED " + checked);
  }

  /**
   * Null when a call to {@code owner.name} with {@code descriptor} links here, as the JVM resolves
   * it (inherited members count; no other member's types are loaded); else why not.
   */
  private static String resolve(String owner, String name, String descriptor) {
    ClassLoader loader = LauncherProbe.class.getClassLoader();
    Class<?> type;
    try {
      type = Class.forName(owner, false, loader);
    } catch (ClassNotFoundException | LinkageError e) {
      return "no class " + owner;
    }
    if (name.equals("CLASS")) {
      return null;
    }
    MethodHandles.Lookup lookup = MethodHandles.publicLookup();
    try {
      if (!descriptor.startsWith("(")) {
        Class<?> field = MethodType.fromMethodDescriptorString("()" + descriptor, loader).returnType();
        try {
          lookup.findGetter(type, name, field);
        } catch (NoSuchFieldException | IllegalAccessException e) {
          lookup.findStaticGetter(type, name, field);
        }
        return null;
      }
      MethodType method = MethodType.fromMethodDescriptorString(descriptor, loader);
      if (name.equals("<init>")) {
        type.getDeclaredConstructor(method.parameterArray());
        return null;
      }
      try {
        lookup.findVirtual(type, name, method);
      } catch (NoSuchMethodException | IllegalAccessException e) {
        lookup.findStatic(type, name, method);
      }
      return null;
    } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
      return e.toString();
    }
  }

  /** {@code type}, its superclasses and all their interfaces, nearest first. */
  private static List<Class<?>> hierarchy(Class<?> type) {
    List<Class<?>> out = new ArrayList<>();
    Set<Class<?>> seen = new HashSet<>();
    Deque<Class<?>> todo = new ArrayDeque<>(List.of(type));
    while (!todo.isEmpty()) {
      Class<?> c = todo.removeFirst();
      if (!seen.add(c)) {
        continue;
      }
      out.add(c);
      if (c.getSuperclass() != null) {
        todo.addLast(c.getSuperclass());
      }
      todo.addAll(List.of(c.getInterfaces()));
    }
    return out;
  }

  private static String descriptor(Executable e, Class<?> returns) {
    StringBuilder out = new StringBuilder("(");
    for (Class<?> p : e.getParameterTypes()) {
      out.append(type(p));
    }
    return out.append(')').append(type(returns)).toString();
  }

  private static String type(Class<?> c) {
    if (c.isArray()) {
      return c.getName().replace('.', '/');
    }
    if (c.isPrimitive()) {
      return switch (c.getName()) {
        case "void" -> "V";
        case "boolean" -> "Z";
        case "byte" -> "B";
        case "char" -> "C";
        case "short" -> "S";
        case "int" -> "I";
        case "long" -> "J";
        case "float" -> "F";
        default -> "D";
      };
    }
    return "L" + c.getName().replace('.', '/') + ";";
  }

  private static void overrides(List<String> classes) throws Exception {
    int checked = 0;
    for (String name : classes) {
      Class<?> ours = Class.forName(name, false, LauncherProbe.class.getClassLoader());
      for (Class<?> spark : hierarchy(ours)) {
        if (!spark.getName().startsWith("org.apache.spark.")) {
          continue;
        }
        for (Method mine : ours.getDeclaredMethods()) {
          List<String> theirs = new ArrayList<>();
          for (Method m : spark.getMethods()) {
            if (m.getName().equals(mine.getName())) {
              theirs.add(descriptor(m, m.getReturnType()));
            }
          }
          if (theirs.isEmpty()) {
            continue;
          }
          checked++;
          String own = descriptor(mine, mine.getReturnType());
          boolean matches = theirs.stream().anyMatch(d -> d.substring(0, d.indexOf(')') + 1)
              .equals(own.substring(0, own.indexOf(')') + 1)));
          if (!matches && !mine.isSynthetic()) {
            System.out.println("NOT-OVERRIDING " + name + "." + mine.getName() + own + " (" + spark.getName()
                + " has " + theirs + ")");
          }
        }
      }
    }
    System.out.println("CHECKED " + checked);
  }

  private static void internals() {
    Map<String, String> missing = SparkInternals.unavailable(SparkInternals.Internal.values());
    missing.forEach((key, why) -> System.out.println("UNAVAILABLE " + key + " " + why));
    System.out.println("VERSION " + SparkInternals.sparkVersion());
  }

  private static void report(String name, CheckedMethod method) {
    System.out.println("CASE " + name + " " + (method.available() ? "ok" : method.why()));
  }

  private static void checks() {
    ClassLoader loader = LauncherProbe.class.getClassLoader();
    String str = "java.lang.String";
    report("exact", CheckedMethod.find(loader, str, "length", false, "int"));
    report("wrong-return", CheckedMethod.find(loader, str, "length", false, "long"));
    report("no-method", CheckedMethod.find(loader, str, "lengthInBytes", false, "int"));
    report("wrong-params", CheckedMethod.find(loader, str, "charAt", false, "char", "long"));
    report("static-expected", CheckedMethod.find(loader, str, "length", true, "int"));
    report("instance-expected", CheckedMethod.find(loader, str, "valueOf", false, str, "int"));
    report("no-class", CheckedMethod.find(loader, "java.lang.NoSuchThing", "run", false, "void"));
    report("non-public-class", CheckedMethod.find(loader, "java.lang.StringLatin1", "hashCode", true, "int",
        "byte[]"));
    report("supertype-return", CheckedMethod.find(loader, "java.lang.StringBuilder", "append", false,
        "java.lang.Appendable", str));
    report("inherited", CheckedMethod.find(loader, "java.lang.StringBuilder", "hashCode", false, "int"));
    report("array-return", CheckedMethod.find(loader, str, "split", false, "java.lang.String[]", str));
    CheckedMethod length = CheckedMethod.find(loader, str, "length", false, "int");
    System.out.println("INVOKE " + length.invoke("four"));
    CheckedMethod missing = CheckedMethod.find(loader, str, "lengthInBytes", false, "int");
    try {
      missing.invoke("four");
      System.out.println("INVOKE-MISSING called");
    } catch (IllegalStateException e) {
      System.out.println("INVOKE-MISSING refused");
    }
    CheckedMethod charAt = CheckedMethod.find(loader, str, "charAt", false, "char", "int");
    try {
      charAt.invoke("four", 9);
      System.out.println("INVOKE-THROWS nothing");
    } catch (StringIndexOutOfBoundsException e) {
      System.out.println("INVOKE-THROWS " + e.getClass().getSimpleName());
    }
  }
}
