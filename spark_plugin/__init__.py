"""arrowbeat's Spark integration: the plugin's Python processes and how users turn it on.

``configure(SparkSession.builder)`` or ``spark-submit $(python -m spark_plugin conf) ...``.
"""

from spark_plugin.errors import ConfigError, PluginError
from spark_plugin.jvm.launch import configure, spark_settings, submit_flags
from spark_plugin.settings.config import ArrowBeatConfig

__all__ = ["ArrowBeatConfig", "ConfigError", "PluginError", "configure", "spark_settings", "submit_flags"]
