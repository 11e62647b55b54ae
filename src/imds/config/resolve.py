"""The one resolver: each option from its flag, else its environment variable, else the config file, else its default.

Every long-running command (``imds serve``, ``imds proxy``, ``imds agent``) is a ``Command``: its
table of rows, the checks that need several options, and what it builds from the values. ``load_command``
resolves any of them the same way, the TOML config file (``--config`` / ``IMDS_CONFIG``; keys are
option names, flat or under a ``[group]`` table) included, and ``effective`` says where each value
came from (``imds config show``). Nothing else reads ``os.environ`` or the config file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from imds.config.option import Option, coerce, typed
from imds.errors import ConfigError

T = TypeVar("T")

CONFIG_OPTION = Option("config", "IMDS_CONFIG", "path", None,
                       'TOML file of settings (keys are option names, e.g. listen = ["127.0.0.1:8000"]); '
                       "flags and environment variables override it.", group="config")
FLAG, ENV, FILE, DEFAULT = "flag", "env", "file", "default"
SHOWN_SECRET = "********"  # noqa: S105 - the mask, not a secret


@dataclass(frozen=True)
class Values:
    """Resolved values by option name, with the rows that name them in messages (what checks read)."""

    values: Mapping[str, Any]
    options: Mapping[str, Option]

    def __getitem__(self, name: str) -> Any:
        """The value of option ``name``."""
        return self.values[name]

    def require(self, names: tuple[str, ...], ok: Callable[[Any], bool], wording: str) -> None:
        """ConfigError ``--flag / IMDS_VAR <wording>`` for the first of ``names`` whose value is not ``ok``."""
        for name in names:
            if not ok(self.values[name]):
                msg = f"{self.options[name].named} {wording}"
                raise ConfigError(msg)

    def require_files(self, names: tuple[str, ...]) -> None:
        """ConfigError ``--flag / IMDS_VAR: PATH is not a file`` for the first of ``names`` set to a non-file."""
        for name in names:
            value = self.values[name]
            if value is not None and not Path(value).is_file():
                msg = f"{self.options[name].named}: {value} is not a file"
                raise ConfigError(msg)


Check = Callable[[Values], None]
Derive = Callable[[Mapping[str, Any], Mapping[str, str]], Mapping[str, Any]]


@dataclass(frozen=True)
class Aliases:
    """Values another program's names give (``imds.config.hollow``): below the command's own flags and variables.

    ``flags``: option name to value, from the other program's spelling of a flag (used when the
    option's own flag is not given). ``env``: option name to (text, source), from its variables
    (used when the option's own variable is not set; above the config file). ``checks`` run after
    the command's; ``notes`` say what was ignored (the command logs them).
    """

    flags: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    checks: tuple[Check, ...] = ()
    notes: tuple[str, ...] = ()


NO_ALIASES = Aliases()


@dataclass(frozen=True)
class Command(Generic[T]):
    """What one long-running command reads: its table, its checks, and what it builds from the values.

    ``derive`` (optional) fills values from others and the environment before the checks run.
    A new command is a table, a build function and its checks; ``load_command`` does the rest.
    """

    name: str
    table: tuple[Option, ...]
    build: Callable[[Mapping[str, Any]], T]
    checks: tuple[Check, ...] = ()
    derive: Derive | None = None
    aliases: Callable[[Mapping[str, Any], Mapping[str, str]], Aliases] | None = None

    def aliases_of(self, flags: Mapping[str, Any], env: Mapping[str, str]) -> Aliases:
        """The values other programs' names give here (none unless the command has ``aliases``)."""
        return NO_ALIASES if self.aliases is None else self.aliases(flags, env)


def load_command(
    command: Command[T], flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
) -> T:
    """Resolve every option of ``command`` from ``flags``, then ``environ``, then the config file, then its default.

    ``flags`` maps option names to values given on the command line (``None`` or an
    empty tuple means "not given"). ``environ`` defaults to ``os.environ``. The config
    file is ``flags["config"]``, else ``IMDS_CONFIG`` (see ``layered``).
    """
    env = os.environ if environ is None else environ
    aliases = command.aliases_of(flags or {}, env)
    found = layered(flags or {}, env, command.table, aliases)
    values = {option.name: typed(option, found[option.name][0]) for option in command.table}
    if command.derive is not None:
        values.update(command.derive(values, env))
    checked = Values(values, {option.name: option for option in command.table})
    for check in (*command.checks, *aliases.checks):
        check(checked)
    return command.build(values)


def layered(
    flags: Mapping[str, Any], env: Mapping[str, str], table: tuple[Option, ...], aliases: Aliases = NO_ALIASES,
) -> dict[str, tuple[Any, str]]:
    """Every option's value and where it came from: ``flag``, ``env``, an alias's source, ``file`` or ``default``.

    The order: the option's flag, an alias flag, its variable, an alias variable, the file, the default.
    """
    path, _source = config_path(flags, env)
    from_file = read_config_file(path, table) if path is not None else {}
    found: dict[str, tuple[Any, str]] = {}
    for option in table:
        given = flags.get(option.name)
        if given is None or given == ():
            given = aliases.flags.get(option.name)
        if given is not None and given != ():
            found[option.name] = (coerce(option, given), FLAG)
        elif option.env in env:
            found[option.name] = (coerce(option, env[option.env]), ENV)
        elif option.name in aliases.env:
            text, source = aliases.env[option.name]
            found[option.name] = (coerce(option, text), source)
        elif option.name in from_file:
            found[option.name] = (from_file[option.name], FILE)
        else:
            found[option.name] = (option.default, DEFAULT)
    return found


def config_path(flags: Mapping[str, Any], env: Mapping[str, str]) -> tuple[Path | None, str]:
    """The config file named by ``--config`` or ``IMDS_CONFIG`` (None: no file), and which one named it."""
    given = flags.get(CONFIG_OPTION.name)
    if given:
        return Path(given).expanduser(), FLAG
    if env.get(CONFIG_OPTION.env):
        return Path(env[CONFIG_OPTION.env]).expanduser(), ENV
    return None, DEFAULT


def read_config_file(path: Path, table: tuple[Option, ...]) -> dict[str, Any]:
    """The options of ``table`` set in the TOML file at ``path``, coerced; ConfigError naming the file and key."""
    where = f"config file {path}"
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        msg = f"{where} (--config / IMDS_CONFIG): cannot read: {exc.strerror or type(exc).__name__}"
        raise ConfigError(msg) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        msg = f"{where}: not valid TOML: {exc}"
        raise ConfigError(msg) from exc
    options = {option.name: option for option in table}
    values: dict[str, Any] = {}
    for key, name, group, value in _toml_keys(document, {option.group for option in table}):
        option = options.get(name.replace("-", "_"))
        if option is None or group not in {None, option.group}:
            msg = f"{where}: unknown key {key!r} (keys are option names, as `imds config show` lists them)"
            raise ConfigError(msg)
        values[option.name] = _from_toml(option, value, where, key)
    return values


def _toml_keys(document: Mapping[str, Any], group_names: set[str]) -> Iterator[tuple[str, str, str | None, Any]]:
    """(key as shown in errors, option name, its ``[group]`` table or None, value), flat or in a group's table."""
    for key, value in document.items():
        if key in group_names and isinstance(value, dict):
            yield from ((f"{key}.{inner}", inner, key, item) for inner, item in value.items())
        else:
            yield key, key, None, value


_TOML_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,)}
_TOML_KINDS = {"list": "an array of strings", "str": "a string", "path": "a string (a path)", "int": "an integer",
               "float": "a number", "bool": "true or false"}


def _from_toml(option: Option, value: Any, where: str, key: str) -> Any:
    if option.kind == "list" and isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    if isinstance(value, str) and option.kind in {"list", "str", "path"}:
        return coerce(option, value)
    wanted = _TOML_TYPES.get(option.kind)
    if wanted is not None and isinstance(value, wanted) and (option.kind == "bool") == isinstance(value, bool):
        return value
    msg = f"{where}: key {key!r} must be {_TOML_KINDS[option.kind]}"
    raise ConfigError(msg)


def effective(
    command: Command[Any], flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
) -> list[tuple[str, str, str]]:
    """(name, value as shown, source) for the config file and every option of ``command``, secrets masked.

    Runs ``load_command`` first, so a configuration the command would refuse is refused here too.
    A value the command derives (``imds serve``'s data directory and database URL) is shown as
    derived, i.e. what the command will use, with the source of the value it was derived from.
    """
    env = os.environ if environ is None else environ
    flags = flags or {}
    load_command(command, flags, env)
    path, path_source = config_path(flags, env)
    values = layered(flags, env, command.table, command.aliases_of(flags, env))
    derived: Mapping[str, Any] = {}
    if command.derive is not None:
        derived = command.derive({option.name: typed(option, values[option.name][0]) for option in command.table}, env)
    rows = [(CONFIG_OPTION.name, str(path) if path is not None else "-", path_source)]
    rows += [(option.name, _shown(option, derived.get(option.name, values[option.name][0])), values[option.name][1])
             for option in command.table]
    return rows


def _shown(option: Option, value: Any) -> str:
    if value is None or value == ():
        return "-"
    if option.secret:
        return SHOWN_SECRET
    if option.redact is not None:
        return option.redact(str(value))
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value).lower() if isinstance(value, bool) else str(value)
