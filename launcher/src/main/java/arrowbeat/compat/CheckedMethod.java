package arrowbeat.compat;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.List;

/**
 * One method of a class the launcher must not link against at compile time (a Spark internal that
 * may change between minors), found once and checked against the exact signature the launcher was
 * written for: owner class, name, parameter types, return type, static or not. Either it is
 * {@link #available()} and {@link #invoke} calls it, or {@link #why()} says what did not match.
 * Looking up never throws: a launcher that threw here would take the plugin's init with it, and
 * Spark relaunches forever an executor whose plugin init throws.
 *
 * <p>The lookup resolves the one member as the JVM links a call ({@link MethodHandles#publicLookup}):
 * reflection over a class's whole method list ({@code Class.getMethod}) would load every type any
 * of its methods mentions, and Spark 4.3's {@code SparkEnv} mentions classes that are not on an
 * executor's class path.
 */
public final class CheckedMethod {
  private static final Class<?>[] PRIMITIVES = {
    boolean.class, byte.class, char.class, short.class, int.class, long.class, float.class,
    double.class, void.class
  };

  private final String signature;
  private final MethodHandle handle;
  private final boolean isStatic;
  private final String why;

  private CheckedMethod(String signature, MethodHandle handle, boolean isStatic, String why) {
    this.signature = signature;
    this.handle = handle;
    this.isStatic = isStatic;
    this.why = why;
  }

  /**
   * {@code owner.name(params)} returning exactly {@code returns}, static or not, looked up in
   * {@code loader}. Types are binary names ({@code java.lang.String}, {@code boolean}, {@code
   * java.io.File[]}).
   */
  public static CheckedMethod find(
      ClassLoader loader, String owner, String name, boolean isStatic, String returns, String... params) {
    String signature =
        (isStatic ? "static " : "") + simple(owner) + "." + name + "(" + simpleList(params) + ") -> "
            + simple(returns);
    try {
      Class<?> type = load(loader, owner);
      if (type == null) {
        return unavailable(signature, "class " + owner + " is not there");
      }
      if (!Modifier.isPublic(type.getModifiers())) {
        return unavailable(signature, "class " + owner + " is not public");
      }
      Class<?> result = load(loader, returns);
      if (result == null) {
        return unavailable(signature, "return type " + returns + " is not there");
      }
      Class<?>[] parameterTypes = new Class<?>[params.length];
      for (int i = 0; i < params.length; i++) {
        parameterTypes[i] = load(loader, params[i]);
        if (parameterTypes[i] == null) {
          return unavailable(signature, "parameter type " + params[i] + " is not there");
        }
      }
      MethodType methodType = MethodType.methodType(result, parameterTypes);
      MethodHandle found = resolve(type, name, methodType, isStatic);
      if (found != null) {
        return new CheckedMethod(signature, found, isStatic, null);
      }
      if (resolve(type, name, methodType, !isStatic) != null) {
        return unavailable(signature, name + " is " + (isStatic ? "an instance method" : "static"));
      }
      return unavailable(signature, "no public " + simple(returns) + " " + name + "(" + simpleList(params)
          + ") on " + owner + sameName(type, name));
    } catch (LinkageError | RuntimeException e) { // a class that fails to link is not there either
      return unavailable(signature, "looking it up failed: " + e);
    }
  }

  /**
   * The public constructor {@code owner(params)}, looked up in {@code loader}; {@link #invoke} calls
   * it with a null target and returns the new object. Types as for {@link #find}.
   */
  public static CheckedMethod constructor(ClassLoader loader, String owner, String... params) {
    String signature = "new " + simple(owner) + "(" + simpleList(params) + ")";
    try {
      Class<?> type = load(loader, owner);
      if (type == null) {
        return unavailable(signature, "class " + owner + " is not there");
      }
      if (!Modifier.isPublic(type.getModifiers())) {
        return unavailable(signature, "class " + owner + " is not public");
      }
      Class<?>[] parameterTypes = new Class<?>[params.length];
      for (int i = 0; i < params.length; i++) {
        parameterTypes[i] = load(loader, params[i]);
        if (parameterTypes[i] == null) {
          return unavailable(signature, "parameter type " + params[i] + " is not there");
        }
      }
      try {
        MethodHandle found = MethodHandles.publicLookup()
            .findConstructor(type, MethodType.methodType(void.class, parameterTypes));
        return new CheckedMethod(signature, found, true, null);
      } catch (NoSuchMethodException | IllegalAccessException e) {
        return unavailable(signature, "no public constructor (" + simpleList(params) + ") on " + owner);
      }
    } catch (LinkageError | RuntimeException e) {
      return unavailable(signature, "looking it up failed: " + e);
    }
  }

  /** The public method as a call would link it, or null. */
  private static MethodHandle resolve(Class<?> type, String name, MethodType methodType, boolean isStatic) {
    try {
      MethodHandles.Lookup lookup = MethodHandles.publicLookup();
      return isStatic
          ? lookup.findStatic(type, name, methodType)
          : lookup.findVirtual(type, name, methodType);
    } catch (NoSuchMethodException | IllegalAccessException e) {
      return null;
    }
  }

  /** A method known to be unavailable without looking ({@code why} says how it is known). */
  public static CheckedMethod unavailable(String signature, String why) {
    return new CheckedMethod(signature, null, false, why);
  }

  /** The class of binary name {@code name} (primitives and {@code []} arrays too), or null. */
  private static Class<?> load(ClassLoader loader, String name) {
    for (Class<?> primitive : PRIMITIVES) {
      if (primitive.getName().equals(name)) {
        return primitive;
      }
    }
    if (name.endsWith("[]")) {
      Class<?> element = load(loader, name.substring(0, name.length() - 2));
      return element == null ? null : element.arrayType();
    }
    try {
      return Class.forName(name, false, loader);
    } catch (ClassNotFoundException | LinkageError e) {
      return null;
    }
  }

  /**
   * What the class does have under that name, for the message (the usual change is a parameter);
   * empty when its method list cannot be read (a type one of them mentions is missing).
   */
  private static String sameName(Class<?> type, String name) {
    List<String> found = new ArrayList<>();
    try {
      for (Method m : type.getMethods()) {
        if (m.getName().equals(name)) {
          List<String> types = new ArrayList<>();
          for (Class<?> p : m.getParameterTypes()) {
            types.add(p.getTypeName());
          }
          found.add((Modifier.isStatic(m.getModifiers()) ? "static " : "")
              + simple(m.getReturnType().getTypeName()) + " " + name + "("
              + simpleList(types.toArray(new String[0])) + ")");
        }
      }
    } catch (LinkageError e) {
      return "";
    }
    return found.isEmpty() ? "" : " (it has " + String.join(", ", found) + ")";
  }

  private static String simple(String name) {
    return name.substring(name.lastIndexOf('.') + 1);
  }

  private static String simpleList(String[] names) {
    List<String> out = new ArrayList<>();
    for (String n : names) {
      out.add(simple(n));
    }
    return String.join(", ", out);
  }

  public boolean available() {
    return handle != null;
  }

  /** Why it is not available; null when it is. */
  public String why() {
    return why;
  }

  /** The signature the launcher expects, for messages. */
  public String signature() {
    return signature;
  }

  /**
   * Calls the method ({@code target} ignored for a static one). What the method itself throws
   * comes out as it is (an unchecked exception or error) or wrapped in an {@link
   * IllegalStateException} (a checked one); calling an unavailable method is an {@link
   * IllegalStateException} too.
   */
  public Object invoke(Object target, Object... args) {
    if (handle == null) {
      throw new IllegalStateException(signature + " is unavailable: " + why);
    }
    Object[] all = args;
    if (!isStatic) {
      all = new Object[args.length + 1];
      all[0] = target;
      System.arraycopy(args, 0, all, 1, args.length);
    }
    try {
      return handle.invokeWithArguments(all);
    } catch (RuntimeException | Error e) {
      throw e;
    } catch (Throwable t) {
      throw new IllegalStateException(signature + " failed: " + t, t);
    }
  }

  @Override
  public String toString() {
    return signature + (handle == null ? " (unavailable: " + why + ")" : "");
  }
}
