"""Per-version shims: the only code that knows which Spark, PySpark or library version runs.

Each module covers one concern, checks the running version and the real signature once, and
returns what to use or why it cannot; callers never compare version strings.
"""
