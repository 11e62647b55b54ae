"""The option model: one ``Option`` row per setting, the value parsers rows name, and the ``Group`` base.

A row says everything about one setting: its name, environment variable, kind, default, help,
the group (dataclass) holding it, whether it is secret, how to parse it and how to show it.
Resolving (``imds.config.resolve``) and showing (``Group.__repr__``, ``imds config show``) read
only the option's own row (a group keeps its command's rows), never every table searched by name.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

from imds.config.database import redact
from imds.errors import ConfigError
from imds.templates import compile_template

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from imds.models import Network

Kind = Literal["str", "int", "float", "bool", "list", "path"]
D = TypeVar("D", bound="DataclassInstance")


@dataclass(frozen=True)
class Option:
    """One setting: flag name, environment variable, kind, default, help text and group.

    ``group`` names the dataclass holding it (``Settings.<group>``, or ``proxy``/``agent``).
    ``parse`` turns the value (already of ``kind``) into the field's value, raising ConfigError.
    ``secret`` values are never shown; ``redact`` shows a value with its secret part hidden.
    """

    name: str
    env: str
    kind: Kind
    default: Any
    help: str
    secret: bool = False
    parse: Callable[[Option, Any], Any] | None = None
    group: str = field(kw_only=True)
    redact: Callable[[str], str] | None = field(default=None, kw_only=True)

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--trusted-proxy``."""
        return "--" + self.name.replace("_", "-")

    @property
    def named(self) -> str:
        """How error messages name it: ``--flag / IMDS_VAR``."""
        return f"{self.flag} / {self.env}"

    def masked(self, value: Any) -> str:
        """The value as a group's repr shows it: a secret as ``<set>``, a redacted one with its secret hidden."""
        if self.redact is not None and isinstance(value, str):
            return repr(self.redact(value))
        return "<set>" if self.secret and value else repr(value)


@dataclass(frozen=True)
class Rows:
    """Makes one group's rows: the variable is ``prefix`` plus the name in capitals unless ``env`` says otherwise."""

    group: str
    prefix: str = "IMDS_"

    def __call__(self, name: str, kind: Kind, default: Any, text: str, *, env: str | None = None, **row: Any) -> Option:
        """The row for option ``name`` (``row``: ``secret``, ``parse``, ``redact``)."""
        return Option(name, env or self.prefix + name.upper(), kind, default, text, group=self.group, **row)

    def log_level_row(self) -> Option:
        """The ``log_level`` row every long-running command has."""
        return self("log_level", "str", "info", "Log level: debug, info, warning or error.", parse=log_level)


# --- value parsers named by rows (each raises ConfigError naming the option) ------------------

LOG_LEVELS = ("debug", "info", "warning", "error")
INSTANCE_AUTH_FLAVORS = ("json", "openstack", "nocloud", "ganeti")


def parse_listen(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[V6]:PORT`` into a (host, port) pair."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        msg = f"--listen / IMDS_LISTEN: {value!r} is not HOST:PORT"
        raise ConfigError(msg)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        msg = f"--listen / IMDS_LISTEN: {value!r} has no host (use 0.0.0.0 or [::])"
        raise ConfigError(msg)
    return host, int(port)


def listen(_option: Option, values: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """``parse`` for listen addresses."""
    return tuple(parse_listen(item) for item in values)


def networks(option: Option, values: tuple[str, ...]) -> tuple[Network, ...]:
    """``parse`` for CIDRs."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            msg = f"{option.named}: {value!r} is not a CIDR"
            raise ConfigError(msg) from exc
    return tuple(found)


def addresses(option: Option, values: tuple[str, ...]) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    """``parse`` for IP addresses (IPv4 or IPv6, no prefix)."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_address(value))
        except ValueError as exc:
            msg = f"{option.named}: {value!r} is not an IP address"
            raise ConfigError(msg) from exc
    return tuple(found)


def directories(option: Option, values: tuple[str, ...]) -> tuple[Path, ...]:
    """``parse`` for absolute directory paths."""
    found = []
    for value in values:
        path = Path(value)
        if not path.is_absolute():
            msg = f"{option.named}: {value!r} is not an absolute path"
            raise ConfigError(msg)
        found.append(path)
    return tuple(found)


def log_level(option: Option, value: str) -> str:
    """``parse`` for a log level."""
    level = value.lower()
    if level not in LOG_LEVELS:
        msg = f"{option.named}: {level!r} is not one of {', '.join(LOG_LEVELS)}"
        raise ConfigError(msg)
    return level


def flavors(option: Option, values: tuple[str, ...]) -> frozenset[str]:
    """``parse`` for a set of instance flavors (``all``: every one)."""
    chosen = {str(value).strip().lower() for value in values if str(value).strip()}
    unknown = sorted(chosen - {*INSTANCE_AUTH_FLAVORS, "all"})
    if unknown:
        msg = f"{option.named}: {', '.join(unknown)} is not one of {', '.join(INSTANCE_AUTH_FLAVORS)} or all"
        raise ConfigError(msg)
    return frozenset(INSTANCE_AUTH_FLAVORS) if "all" in chosen else frozenset(chosen)


def template(option: Option, source: str | None) -> str | None:
    """``parse`` for a template field: its source, once it compiles (``imds serve`` renders it into every document)."""
    if source:
        try:
            compile_template(option.name, source)
        except ConfigError as exc:
            raise ConfigError(f"{option.named}: {exc.message}") from exc
    return source


def redact_url(url: str) -> str:
    """Hide the password in a database URL (in its user part or a ``password=`` parameter)."""
    return redact(url)


# --- from flag, variable or file text to the row's kind, and from the kind to the field -------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(text: str) -> bool:
    if text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    raise ValueError(text)


_PARSERS: dict[str, Callable[[str], Any]] = {
    "list": lambda text: tuple(part.strip() for part in text.split(",") if part.strip()),
    "int": int,
    "float": float,
    "bool": _bool,
    "path": lambda text: Path(text).expanduser() if text else None,
    "str": lambda text: text or None,
}


def coerce(option: Option, value: Any) -> Any:
    """Turn a flag or environment value into the option's kind."""
    if not isinstance(value, str):
        return tuple(value) if option.kind == "list" else value
    try:
        return _PARSERS[option.kind](value.strip())
    except ValueError as exc:
        msg = f"{option.env} / {option.flag}: {value!r} is not a valid {option.kind}"
        raise ConfigError(msg) from exc


_CASTS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "list": tuple, "str": str,
                                            "path": Path}


def typed(option: Option, value: Any) -> Any:
    """A resolved value as its group's field holds it: the row's kind, then the row's ``parse``."""
    if value is not None:
        value = _CASTS[option.kind](value)
    return value if option.parse is None else option.parse(option, value)


# --- the groups: one frozen dataclass per concern; fields are exactly its rows' names ---------

@dataclass(frozen=True, repr=False)
class Group:
    """What every group shares: its rows, and a repr that never shows a secret, even in a traceback.

    A subclass names its command's table, ``class ProxySettings(Group, rows=PROXY_OPTIONS)``; each
    field is shown as the row of its name says (``Option.masked``).
    """

    ROWS: ClassVar[Mapping[str, Option]] = {}

    def __init_subclass__(cls, rows: tuple[Option, ...] = (), **kwargs: Any) -> None:
        """Keep the group's rows by name, for its repr."""
        super().__init_subclass__(**kwargs)
        cls.ROWS = {option.name: option for option in rows}

    def __repr__(self) -> str:
        """Fields by name; secrets shown as ``<set>``, the password in a database URL masked."""
        shown = ", ".join(f"{f.name}={self.ROWS[f.name].masked(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({shown})"

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> Self:
        """The group from resolved values by option name (its fields are its rows' names)."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})

    def fill(self, cls: type[D], prefix: str = "", **given: Any) -> D:
        """A ``cls`` (a dataclass) from this group's fields named ``prefix`` + its field's name, plus ``given``."""
        values = {f.name: getattr(self, prefix + f.name) for f in fields(cls) if f.name not in given}
        return cls(**values, **given)
