"""The one exception tree of the ``spark_plugin`` package.

::

    PluginError
    ├── ConfigError (also ValueError)           a spark.arrowbeat.* key is unknown or its value malformed;
    │                                           ``problems`` lists every one, each naming key and form
    ├── SetupError (also RuntimeError)          arrowbeat's jars are not built: run ``make setup``
    ├── HistoryTableError (also RuntimeError)   a history table cannot be used; names the path
    │   ├── TablePathError                      the path is unwritable, or not (or a corrupt) Delta table
    │   ├── IncompatibleTableError              a Delta table there has another schema
    │   └── UnknownApplicationError             the tables hold no row of the application asked for
    └── JvmLinkError                            the JVM launcher's protocol broke
        ├── SettingsTruncatedError (also EOFError)   the JVM closed stdin before the settings' end
        ├── MalformedSettingsError (also ValueError) a settings line is not ``key<TAB>value``
        └── JvmCommandError (also ValueError)        a ready field or command the JVM would refuse;
                                                     never written to the protocol channel

The second bases keep the built-in meaning (a bad value is a ``ValueError``, an early end of input
an ``EOFError``), so callers that catch those keep working. The names are unique across arrowbeat:
the heartbeat library's tree is rooted at ``HeartbeatError``, the shuffle engine's at
``ShuffleError``.
"""

from __future__ import annotations


class PluginError(Exception):
    """Base of every error raised by ``spark_plugin``."""


class ConfigError(PluginError, ValueError):
    """One or more ``spark.arrowbeat.*`` values are unknown or malformed."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid arrowbeat configuration: " + "; ".join(problems))
        self.problems = problems


class SetupError(PluginError, RuntimeError):
    """arrowbeat's jars are not where they should be; the message says how to build them."""


class HistoryTableError(PluginError, RuntimeError):
    """A history table cannot be used; the message names the path and what to do."""


class TablePathError(HistoryTableError):
    """The path cannot be created or written, or holds something that is not a Delta table."""


class IncompatibleTableError(HistoryTableError):
    """A Delta table at the path has a schema arrowbeat cannot append to."""


class UnknownApplicationError(HistoryTableError):
    """The tables hold no row of the application asked for; the message lists the ones they hold."""


class JvmLinkError(PluginError):
    """The hosting JVM broke the launcher protocol on our stdin."""


class SettingsTruncatedError(JvmLinkError, EOFError):
    """The JVM closed stdin before the settings block's closing empty line."""


class MalformedSettingsError(JvmLinkError, ValueError):
    """A settings line from the JVM is not ``key<TAB>value``."""


class JvmCommandError(JvmLinkError, ValueError):
    """A ready field or a command (e.g. ``kill-executor`` for an id that is not a Spark executor
    id) that the JVM would refuse; it is not written to the protocol channel."""


__all__ = [
    "ConfigError",
    "HistoryTableError",
    "IncompatibleTableError",
    "JvmCommandError",
    "JvmLinkError",
    "MalformedSettingsError",
    "PluginError",
    "SettingsTruncatedError",
    "SetupError",
    "TablePathError",
    "UnknownApplicationError",
]
