"""arrowbeat's Spark integration: the plugin's Python processes and how users turn it on.

``configure(SparkSession.builder)`` or ``spark-submit $(python -m spark_plugin conf) ...``.
"""

from spark_plugin.config import ArrowBeatConfig
from spark_plugin.errors import ConfigError, PluginError
from spark_plugin.launch import configure, spark_settings, submit_flags

__all__ = ["ArrowBeatConfig", "ConfigError", "PluginError", "configure", "spark_settings", "submit_flags"]
