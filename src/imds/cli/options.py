"""Click options generated from a command's option table (``imds.config``) so flags and env vars cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from imds.config import ALIASED, CONFIG_OPTION, OPTIONS, SERVE, Command, HollowName, Option, Settings, load_command
from imds.errors import ConfigError

T = TypeVar("T")

_TYPES: dict[str, Any] = {"int": int, "float": float, "path": click.Path(), "str": str, "list": str}


def _decorator(option: Option) -> Callable[[Any], Any]:
    help_text = f"{option.help} [env: {option.env}]"
    if option.default not in (None, ()) and not option.secret:
        shown = ",".join(option.default) if isinstance(option.default, tuple) else option.default
        help_text += f" [default: {shown}]"
    if option.kind == "bool":
        flag = option.flag
        return click.option(f"{flag}/--no-{flag[2:]}", option.name, default=None, help=help_text)
    return click.option(
        option.flag, option.name, type=_TYPES[option.kind], default=None, multiple=option.kind == "list",
        help=help_text,
    )


def _hollow_decorator(name: HollowName) -> Callable[[Any], Any]:
    """A hidden option taking hollow's spelling of a flag, as pflag reads it (``--db-enabled=false``, ``--debug``)."""
    flag = name.flag or name.param
    if name.kind == "bool":
        return click.option(flag, name.param, is_flag=False, flag_value="true", default=None, hidden=True)
    return click.option(flag, name.param, default=None, multiple=name.kind == "list", hidden=True)


def settings_options(
    names: tuple[str, ...] | None = None, table: tuple[Option, ...] = OPTIONS, *, hollow: bool = False,
) -> Callable[[Any], Any]:
    """Add ``--config`` and the flags for ``names`` (all options of ``table`` when None) to a click command.

    An option the command already has (from another call of this decorator) is not added twice.

    ``hollow``: also hollow-metadataservice's flags spelled unlike imds's, hidden (``imds.config.hollow``).
    """
    chosen = [CONFIG_OPTION, *(o for o in table if names is None or o.name in names)]

    def apply(command: Any) -> Any:
        # Options another decorator of this command already added (``--config`` from two tables) are added once.
        present = {param.name for param in getattr(command, "__click_params__", ())}
        for name in ALIASED if hollow else ():
            command = _hollow_decorator(name)(command)
        for option in reversed(chosen):
            if option.name not in present:
                command = _decorator(option)(command)
        return command

    return apply


def resolve(flags: dict[str, Any]) -> Settings:
    """``imds serve``'s Settings from these flags plus the environment and config file; errors exit with status 2.

    Everything is checked, the template fields included (each must compile).
    """
    return resolve_command(SERVE, flags)


def resolve_command(command: Command[T], flags: dict[str, Any]) -> T:
    """``command``'s settings from these flags plus the environment and config file; errors exit with status 2."""
    try:
        return load_command(command, flags)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
