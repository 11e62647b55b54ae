"""Click options generated from ``imds.config.OPTIONS`` so flags and env vars cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from imds.config import CONFIG_OPTION, OPTIONS, Option, Settings, load
from imds.errors import ConfigError
from imds.services.templates import compile_template

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


def settings_options(names: tuple[str, ...] | None = None, table: tuple[Option, ...] = OPTIONS) -> Callable[[Any], Any]:
    """Add the flags for ``names`` (all options of ``table`` when None) to a click command."""
    chosen = [o for o in table if names is None or o.name in names]
    if table is OPTIONS:  # every command that reads Settings also reads the config file
        chosen.insert(0, CONFIG_OPTION)

    def apply(command: Any) -> Any:
        for option in reversed(chosen):
            command = _decorator(option)(command)
        return command

    return apply


def resolve(flags: dict[str, Any], *, templates: bool = False) -> Settings:
    """Settings from these flags plus the environment; a config error exits with status 2.

    With ``templates``, the template fields must compile too (``imds serve`` renders them).
    """
    try:
        settings = load(flags)
        if templates:
            _check_templates(settings)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
    return settings


def _check_templates(settings: Settings) -> None:
    """Compile each template field now, so a bad one is a usage error naming its flag."""
    options = {option.name: option for option in OPTIONS}
    for key, source in settings.templates.items():
        try:
            compile_template(key, source)
        except ConfigError as exc:
            option = options[key]
            raise ConfigError(f"{option.flag} / {option.env}: {exc.message}") from exc
