"""dif's plugin system: hook specs (`hookspecs`) and the loader / collectors (`manager`).

Typical use: `from dif.plugins import backends; backends()["cpu"]`. Loading is explicit and
happens on the first collector call (or `load_plugins()`), never at import.
"""

from dif.plugins.manager import (
    ENTRY_POINT_GROUP,
    PluginRecord,
    add_commands,
    backends,
    frontends,
    isolated_plugins,
    load_plugins,
    passes,
    physical_formats,
    plugin_ops,
    plugin_records,
    pm,
    problems,
    register_plugin,
    registrations,
    reset_plugins,
    unregister_plugin,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginRecord",
    "add_commands",
    "backends",
    "frontends",
    "isolated_plugins",
    "load_plugins",
    "passes",
    "physical_formats",
    "plugin_ops",
    "plugin_records",
    "pm",
    "problems",
    "register_plugin",
    "registrations",
    "reset_plugins",
    "unregister_plugin",
]
