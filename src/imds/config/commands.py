"""The long-running commands' configurations, and the loaders callers use.

``COMMANDS`` lists every ``Command`` (``imds serve``, ``imds proxy``, ``imds agent``); each is
resolved by the one resolver in ``imds.config.resolve`` (flag > environment > config file >
default). A later command adds its table module and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from imds.config import checks, hollow, resolve
from imds.config.agent import AGENT_OPTIONS, AgentSettings
from imds.config.option import Group, Option
from imds.config.proxy import PROXY_OPTIONS, ProxySettings
from imds.config.serve import OPTIONS
from imds.config.settings import SETTINGS_GROUPS, Settings

SERVE = resolve.Command("serve", OPTIONS, Settings.assemble, checks.SERVE_CHECKS, derive=checks.store_location,
                        aliases=hollow.hollow_aliases)
PROXY = resolve.Command("proxy", PROXY_OPTIONS, ProxySettings.pick, (checks.check_proxy,))
AGENT = resolve.Command("agent", AGENT_OPTIONS, AgentSettings.pick, (checks.check_agent,))
COMMANDS: dict[str, resolve.Command[Any]] = {command.name: command for command in (SERVE, PROXY, AGENT)}


def load(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """``imds serve``'s settings: each option from ``flags``, then ``environ``, then the config file, then its default.

    ``flags`` maps option names to values given on the command line (``None`` or an empty tuple
    means "not given"). ``environ`` defaults to ``os.environ``. The config file is
    ``flags["config"]``, else ``IMDS_CONFIG``.
    """
    return resolve.load_command(SERVE, flags, environ)


def load_proxy(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> ProxySettings:
    """``imds proxy``'s settings, resolved as ``load`` resolves ``imds serve``'s (config file included)."""
    return resolve.load_command(PROXY, flags, environ)


def load_agent(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """``imds agent``'s settings, resolved as ``load`` resolves ``imds serve``'s (config file included)."""
    return resolve.load_command(AGENT, flags, environ)


def effective(
    flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None, command: str = "serve",
) -> list[tuple[str, str, str]]:
    """(name, value as shown, source) for the config file and every option of ``command``, secrets masked."""
    return resolve.effective(COMMANDS[command], flags, environ)


def groups() -> dict[str, type[Group]]:
    """Every group by name: ``Settings``' fields, then ``proxy`` and ``agent``."""
    return {**SETTINGS_GROUPS, "proxy": ProxySettings, "agent": AgentSettings}


def options_table(table: tuple[Option, ...] = OPTIONS) -> str:
    """The README's configuration table, in Markdown (``tests/unit/test_docs.py`` keeps them equal).

    Regenerate with ``python -c "from imds.config import options_table; print(options_table())"``
    (``options_table(PROXY_OPTIONS)`` for ``imds proxy``'s).
    """
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for option in table:
        default = option.default
        if isinstance(default, bool):
            shown = "on" if default else "off"
        elif isinstance(default, tuple):
            shown = ",".join(default) if default else "none"
        else:
            shown = "—" if default is None else str(default)
        flag = option.flag + (" (repeatable)" if option.kind == "list" else "")
        if option.kind == "bool":
            flag = f"{option.flag} / --no-{option.flag[2:]}"
        rows.append(f"| `{flag}` | `{option.env}` | `{shown}` | {option.help} |")
    return "\n".join(rows)
