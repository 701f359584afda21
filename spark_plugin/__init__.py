"""arrowbeat's Spark integration: the plugin's Python processes and how users turn it on.

``configure(SparkSession.builder)`` or ``spark-submit $(python -m spark_plugin conf) ...``.
"""

from typing import TYPE_CHECKING

from arrowbeat_base.lazy_exports import lazy_exports

if TYPE_CHECKING:  # imported on first use (``__getattr__``): a worker loads only what it needs
    from spark_plugin.errors import ConfigError, PluginError
    from spark_plugin.jvm.launch import configure, spark_settings, submit_flags
    from spark_plugin.settings.config import ArrowBeatConfig

__all__ = ["ArrowBeatConfig", "ConfigError", "PluginError", "configure", "spark_settings", "submit_flags"]

_EXPORTS = {
    "ConfigError": "spark_plugin.errors",
    "PluginError": "spark_plugin.errors",
    "configure": "spark_plugin.jvm.launch",
    "spark_settings": "spark_plugin.jvm.launch",
    "submit_flags": "spark_plugin.jvm.launch",
    "ArrowBeatConfig": "spark_plugin.settings.config",
}
"""Each public name and the module defining it: imported when the name is first used."""


if not TYPE_CHECKING:  # for type checkers the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
