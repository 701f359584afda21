"""The plugin's two Python processes, each started by its JVM plugin: ``driver`` (the
ResourceManager, history writer and live page beside the Spark driver) and ``executor`` (the
agent beside each executor)."""
