"""Settings: the only package that reads the environment and the config file.

Every option is one row (``imds.config.option.Option``): its flag (``--listen``), its environment
variable (``IMDS_LISTEN``), its kind, default and help, the group (concern) it belongs to, and
whether it is secret. Each long-running command has its table, one module each: ``serve``
(``OPTIONS``), ``proxy`` (``PROXY_OPTIONS``), ``agent`` (``AGENT_OPTIONS``). The CLI builds a
command's flags from its table, and one resolver (``resolve``) gives each value once: flag, else
environment, else the TOML config file (``--config`` / ``IMDS_CONFIG``; keys are option names),
else default. ``imds serve``'s result is a frozen ``Settings`` of groups (``settings``), one frozen
dataclass per concern (``settings.store.db``, ``settings.limits.max_body_bytes``), each built by
name from the rows; ``ProxySettings`` and ``AgentSettings`` are one group each. Checks that need
several options are small named functions in ``checks``. ``hollow`` maps hollow-metadataservice's
flags and ``METADATASERVICE_*`` variables onto ``imds serve``'s options (below imds's own).
``commands`` lists the commands and holds the loaders. A leaf: it imports only ``imds.errors``,
``imds.models`` and ``imds.templates``.
"""

from imds.config.agent import AGENT_MODES, AGENT_OPTIONS, AgentSettings
from imds.config.commands import (
    AGENT,
    COMMANDS,
    PROXY,
    SERVE,
    effective,
    groups,
    load,
    load_agent,
    load_proxy,
    options_table,
)
from imds.config.hollow import ALIASED, HOLLOW, HollowName, hollow_table
from imds.config.option import INSTANCE_AUTH_FLAVORS, LOG_LEVELS, Group, Option, parse_listen
from imds.config.proxy import PROXY_OPTIONS, ProxySettings
from imds.config.resolve import CONFIG_OPTION, Command, layered, load_command
from imds.config.serve import OPTIONS
from imds.config.settings import SETTINGS_GROUPS, Settings

__all__ = [
    "AGENT",
    "AGENT_MODES",
    "AGENT_OPTIONS",
    "ALIASED",
    "COMMANDS",
    "CONFIG_OPTION",
    "HOLLOW",
    "INSTANCE_AUTH_FLAVORS",
    "LOG_LEVELS",
    "OPTIONS",
    "PROXY",
    "PROXY_OPTIONS",
    "SERVE",
    "SETTINGS_GROUPS",
    "AgentSettings",
    "Command",
    "Group",
    "HollowName",
    "Option",
    "ProxySettings",
    "Settings",
    "effective",
    "groups",
    "hollow_table",
    "layered",
    "load",
    "load_agent",
    "load_command",
    "load_proxy",
    "options_table",
    "parse_listen",
]
