"""hollow-metadataservice's configuration names, and what ``imds serve`` makes of each.

hollow reads its settings through viper: a flag (``--lookup-service-url``), bound to a key
(``lookup.service.url``), read from the environment as ``METADATASERVICE_`` plus the key in
capitals with dots made underscores (``METADATASERVICE_LOOKUP_SERVICE_URL``). ``HOLLOW`` lists every
name hollow documents or reads (its own flags, those of the libraries it registers: crdbx, otelx,
loggingx, and the names of earlier releases), each with its fate:

- ``honour``: the same meaning as an imds option (``imds``); its value is translated where the
  spellings differ (a Go duration to seconds, ``--debug`` to a log level).
- ``ignore``: harmless to drop (pool sizes, retries, log format); ``imds serve`` logs a note.
- ``refuse``: a value imds cannot honour stops ``imds serve`` at start (exit 2) with a message
  naming the hollow name and the imds equivalent; other values of it are ignored. Every
  database setting (``crdb.uri`` and its parts) is refused: they name hollow's CockroachDB,
  which has no ``LISTEN``/``NOTIFY`` for imds's change feed; the way off is ``imds import
  --from-hollow``.

``hollow_aliases`` turns hollow's flags (hidden ``imds serve`` options) and ``METADATASERVICE_*``
variables into imds values: the resolver ranks them flag > ``IMDS_*`` > ``METADATASERVICE_*`` >
config file > default (a hollow flag counts as a flag, below the imds flag of the same option).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from imds.config.resolve import Aliases, Values
from imds.config.serve import OPTIONS
from imds.errors import ConfigError

Fate = Literal["honour", "ignore", "refuse"]
ENV_PREFIX = "METADATASERVICE_"
PARAM_PREFIX = "hollow_"
HOLLOW_SOURCE = "hollow"  # how ``imds config show`` names a value a METADATASERVICE_* variable gave
FLAG_ONLY = frozenset({"config"})  # cobra's --config is no viper key: no variable names it


@dataclass(frozen=True)
class HollowName:
    """One hollow setting: its flag (None: environment or file only), viper key, fate and imds name.

    ``imds`` is the imds option a ``honour`` row sets (None: several, see ``note``), or the
    equivalent a ``refuse`` row names. ``refused(value)`` says whether this value stops
    ``imds serve``; ``note`` is what the log, the refusal and docs/hollow.md say.
    """

    flag: str | None
    key: str
    fate: Fate
    imds: str
    note: str
    kind: Literal["str", "bool", "list", "duration"] = "str"

    @property
    def env(self) -> str:
        """The variable viper reads the key from: ``METADATASERVICE_LOOKUP_SERVICE_URL`` ("": a flag only)."""
        return "" if self.key in FLAG_ONLY else ENV_PREFIX + self.key.upper().replace(".", "_")

    @property
    def param(self) -> str:
        """The click parameter of its hidden ``imds serve`` flag."""
        return PARAM_PREFIX + (self.flag or self.key).lstrip("-").replace("-", "_").replace(".", "_")

    @property
    def named(self) -> str:
        """How messages name it: ``--flag / METADATASERVICE_VAR`` (or the variable alone)."""
        return " / ".join(part for part in (self.flag, self.env) if part)


def _h(flag: str | None, key: str, fate: Fate, imds: str, *note_kind: str) -> HollowName:
    """A row: ``note_kind`` is the note, then the kind when not ``str``."""
    note, kind = note_kind[0], (note_kind[1] if len(note_kind) > 1 else "str")
    return HollowName(flag, key, fate, imds, note, kind)  # type: ignore[arg-type]


_CRDB = ("refused: hollow's CockroachDB has no LISTEN/NOTIFY, which imds's change feed needs; give --db a "
         "PostgreSQL (or SQLite) URL and copy hollow's records with imds import --from-hollow DSN")
_TRACE = "imds has no OpenTelemetry tracing: ignored (tracing itself, --tracing, is refused)"

HOLLOW: tuple[HollowName, ...] = (
    _h("--listen", "listen", "honour", "listen", "same meaning (hollow's default is 0.0.0.0:8000, imds's loopback)"),
    _h("--config", "config", "refuse", "config",
       "hollow's YAML file: imds's --config / IMDS_CONFIG is TOML keyed by imds option names (a .yml/.yaml "
       "file is refused; $HOME/.metadataservice.yml is not read)"),
    # loggingx
    _h("--debug", "logging.debug", "honour", "log_level", "true: --log-level debug", "bool"),
    _h("--pretty", "logging.pretty", "ignore", "log_level", "imds logs one JSON object per line", "bool"),
    # crdbx: the database
    *(_h(None, key, "refuse", "db", _CRDB) for key in ("crdb.uri", "crdb.host", "crdb.user", "crdb.password",
                                                       "crdb.params")),
    _h(None, "crdb.connections.max_open", "ignore", "db", "imds sizes its own pool"),
    _h(None, "crdb.connections.max_idle", "ignore", "db", "imds sizes its own pool"),
    _h(None, "crdb.connections.max_lifetime", "ignore", "db", "imds sizes its own pool"),
    _h("--db-enabled", "crdb.enabled", "refuse", "db",
       "false is refused: imds always keeps records; --db memory:// keeps them in memory only", "bool"),
    _h("--db-tx-max-retries", "crdb.max_retries", "ignore", "db_statement_timeout",
       "imds does not retry transactions; a statement is bounded by --db-statement-timeout"),
    _h("--db-retry-max-interval", "crdb.retry_interval", "ignore", "db_statement_timeout",
       "imds does not retry transactions", "duration"),
    _h("--db-tx-timeout", "crdb.tx_timeout", "ignore", "db_statement_timeout",
       "imds bounds each statement with --db-statement-timeout instead", "duration"),
    # admin OIDC (ginjwt)
    _h("--oidc", "oidc.enabled", "refuse", "admin_token",
       "false is refused unless --admin-token or --admin-tokens-file is set (imds never serves an open admin API); "
       "true: imds checks JWTs when --oidc-issuer is set", "bool"),
    _h("--oidc-aud", "oidc.audience", "honour", "oidc_audience", "same meaning"),
    _h("--oidc-issuer", "oidc.issuer", "honour", "oidc_issuer", "same meaning"),
    _h("--oidc-jwksuri", "oidc.jwksuri", "honour", "oidc_jwks_url", "same meaning"),
    _h("--oidc-roles-claim", "oidc.claims.roles", "honour", "oidc_roles_claim", "same meaning"),
    _h("--oidc-username-claim", "oidc.claims.username", "honour", "oidc_username_claim", "same meaning"),
    _h(None, "oidc.log", "ignore", "oidc_username_claim", "imds logs the --oidc-username-claim claim", "list"),
    # the lookup service
    _h("--lookup-enabled", "lookup.enabled", "honour", "lookup_url",
       "imds looks up when --lookup-url is set: true passes lookup.service.url on, false drops it; "
       "true without a URL is refused", "bool"),
    _h("--lookup-service-url", "lookup.service.url", "honour", "lookup_url", "when lookup.enabled is true"),
    _h("--lookup-base-url", "lookup.baseurl", "honour", "lookup_url",
       "hollow's earlier name for lookup.service.url (still in its README)"),
    _h("--lookup-oidc-issuer", "lookup.oidc.issuer", "honour", "lookup_oidc_issuer", "same meaning"),
    _h("--lookup-oidc-client-id", "lookup.oidc.clientid", "honour", "lookup_client_id", "same meaning"),
    _h("--lookup-oidc-client-secret", "lookup.oidc.clientsecret", "honour", "lookup_client_secret", "same meaning"),
    _h("--lookup-oidc-aud", "lookup.oidc.audience", "honour", "lookup_audience", "same meaning"),
    _h("--lookup-oidc-scopes", "lookup.oidc.scopes", "honour", "lookup_scope",
       "comma- or space-separated; with lookup.enabled and no scopes given, hollow's default "
       "metadata:read:metadata,metadata:read:userdata", "list"),
    # serving
    _h("--gin-trusted-proxies", "gin.trustedproxies", "honour", "trusted_proxy",
       "addresses or CIDRs, comma- or space-separated", "list"),
    _h("--api-url", "metadata.api_url", "honour", "api_url", "same template syntax"),
    _h("--phone-home-url", "metadata.phone_home_url", "honour", "phone_home_url", "same template syntax"),
    _h("--user-state-url", "metadata.user_state_url", "honour", "user_state_url", "same template syntax"),
    _h("--shutdown-grace-period", "shutdown_grace_period", "honour", "shutdown_timeout",
       "a Go duration (10s, 1m30s) in seconds", "duration"),
    # otelx's tracing names
    _h("--tracing", "tracing.enabled", "refuse", "log_level",
       "true is refused: imds has no OpenTelemetry tracing (its metrics are at /metrics, its logs are JSON)",
       "bool"),
    *(_h(flag, key, "ignore", "log_level", _TRACE) for flag, key in (
        ("--tracing-provider", "tracing.provider"), ("--tracing-environment", "tracing.environment"),
        (None, "tracing.stdout.pretty_print"), (None, "tracing.stdout.disable_timestamps"),
        (None, "tracing.jaeger.agent_host"), (None, "tracing.jaeger.agent_port"),
        (None, "tracing.jaeger.endpoint"), (None, "tracing.jaeger.user"),
        (None, "tracing.jaeger.password"), (None, "tracing.otlp.endpoint"), (None, "tracing.otlp.insecure"),
        (None, "tracing.otlp.certificate"), (None, "tracing.otlp.headers"), (None, "tracing.otlp.compression"),
        (None, "tracing.otlp.timeout"), ("--tracing-endpoint", "tracing.endpoint"))),
    # earlier releases' names
    _h("--db-uri", "db.uri", "refuse", "db", f"hollow's earlier name for crdb.uri: {_CRDB}"),
    _h("--db-conns-max-open", "db.connections.max_open", "ignore", "db", "imds sizes its own pool"),
    _h("--db-conns-max-idle", "db.connections.max_idle", "ignore", "db", "imds sizes its own pool"),
    _h("--db-conns-max-lifetime", "db.connections.max_lifetime", "ignore", "db", "imds sizes its own pool",
       "duration"),
    _h("--cache-ttl", "cache_ttl", "ignore", "lookup_refresh_after",
       "a reverted hollow feature; imds refreshes looked-up records with --lookup-refresh-after"),
)

BY_KEY = {name.key: name for name in HOLLOW}
_IMDS_FLAGS = {option.flag for option in OPTIONS} | {"--config"}
ALIASED = tuple(name for name in HOLLOW if name.flag and name.flag not in _IMDS_FLAGS)
"""hollow's flags spelled unlike any imds flag: ``imds serve`` takes each as a hidden option."""
DEFAULT_SCOPES = "metadata:read:metadata,metadata:read:userdata"


# --- values as viper reads them -----------------------------------------------------------------

_GO_TRUE = {"1", "t", "true"}
_GO_FALSE = {"0", "f", "false"}
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def go_bool(name: HollowName, text: str) -> bool:
    """A value as Go's strconv.ParseBool reads it (1, t, true, 0, f, false; any case)."""
    value = text.strip().lower()
    if value in _GO_TRUE | _GO_FALSE:
        return value in _GO_TRUE
    raise ConfigError(f"{name.named}: {text!r} is not true or false")


def go_duration(name: HollowName, text: str) -> float:
    """Seconds in a Go duration (``10s``, ``1m30s``, ``250ms``; a bare number is seconds, as viper reads it)."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    if value and re.fullmatch(f"(?:{_GO_PART.pattern})+", value):
        return sum(float(number) * _GO_UNITS[unit] for number, unit in _GO_PART.findall(value))
    raise ConfigError(f"{name.named}: {text!r} is not a Go duration like 10s or 1m30s")


def _seconds(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else str(seconds)


# --- hollow's names to imds values --------------------------------------------------------------

def given_flags(flags: Mapping[str, Any]) -> dict[str, str]:
    """The hollow flags given on the command line, by viper key, as text (a repeated flag joined by commas)."""
    found: dict[str, str] = {}
    for name in ALIASED:
        value = flags.get(name.param)
        if value is None or value == ():
            continue
        found[name.key] = ",".join(value) if isinstance(value, tuple | list) else str(value)
    return found


def given_env(env: Mapping[str, str]) -> dict[str, str]:
    """The hollow variables set in ``env``, by viper key."""
    return {name.key: env[name.env] for name in HOLLOW if name.env and name.env in env}


Translated = dict[str, tuple[str, frozenset[str]]]
"""imds option name to (value as text, the hollow keys it came from)."""


def translate(given: Mapping[str, str]) -> tuple[Translated, list[str]]:
    """The imds option values (as text, with the hollow keys giving each) from hollow values by viper key.

    Also the notes on what was ignored. Raises ConfigError for a refused value or one that does not parse.
    """
    values: Translated = {}
    notes: list[str] = []
    for key, text in given.items():
        name = BY_KEY[key]
        if name.fate == "refuse":
            _refuse(name, text)
        if name.fate == "honour" and name.imds in _DIRECT:
            values[name.imds] = (_DIRECT[name.imds](name, text), frozenset({key}))
        elif name.fate == "ignore" or (name.fate == "refuse" and key not in _ALWAYS_REFUSED):
            notes.append(f"{name.named} ignored: {name.note}")
    if go_bool(BY_KEY["logging.debug"], given.get("logging.debug", "false")):
        values["log_level"] = ("debug", frozenset({"logging.debug"}))
    values.update(_lookup(given, notes))
    return values, notes


def _text(_name: HollowName, text: str) -> str:
    return text


def _list(_name: HollowName, text: str) -> str:
    """A list as pflag (commas) or viper from a variable (spaces) splits it, joined by commas."""
    return ",".join(part for part in re.split(r"[\s,]+", text) if part)


def _duration(name: HollowName, text: str) -> str:
    return _seconds(go_duration(name, text))


_DIRECT: dict[str, Callable[[HollowName, str], str]] = {
    "listen": _text, "oidc_audience": _text, "oidc_issuer": _text, "oidc_jwks_url": _text,
    "oidc_roles_claim": _text, "oidc_username_claim": _text, "lookup_oidc_issuer": _text,
    "lookup_client_id": _text, "lookup_client_secret": _text, "lookup_audience": _text, "lookup_scope": _list,
    "trusted_proxy": _list, "api_url": _text, "phone_home_url": _text, "user_state_url": _text,
    "shutdown_timeout": _duration,
}


def _refuse(name: HollowName, text: str) -> None:
    if name.key == "config":
        if text.lower().endswith((".yml", ".yaml")):
            raise ConfigError(f"{name.named}: {text} is hollow's YAML config file; imds reads --config / "
                              "IMDS_CONFIG as TOML keyed by imds option names (imds config show lists them), "
                              "or set hollow's METADATASERVICE_* variables")
    elif name.key == "crdb.enabled" and not go_bool(name, text):
        raise ConfigError(f"{name.named}=false: imds always keeps records; use --db memory:// / "
                          "IMDS_DB=memory:// to keep them in memory only (with --lookup-url to fetch them)")
    elif name.key in _CRDB_KEYS and text.strip():
        raise ConfigError(f"{name.named}: imds cannot keep its records in hollow's CockroachDB: it has no "
                          "LISTEN/NOTIFY, which imds's change feed needs. Give --db / IMDS_DB a PostgreSQL (or "
                          "SQLite) URL, copy hollow's records over with `imds import --from-hollow DSN` "
                          "(docs/hollow.md), and unset this setting")
    elif name.key == "tracing.enabled" and go_bool(name, text):
        raise ConfigError(f"{name.named}=true: imds has no OpenTelemetry tracing; its metrics are at /metrics "
                          "(--metrics-public / IMDS_METRICS_PUBLIC) and --log-level / IMDS_LOG_LEVEL sets its logs")


_CRDB_KEYS = frozenset({"crdb.uri", "crdb.host", "crdb.user", "crdb.password", "crdb.params", "db.uri"})
_ALWAYS_REFUSED = _CRDB_KEYS | {"oidc.enabled"}  # refused or checked whatever the value: no "ignored" note


def _lookup(given: Mapping[str, str], notes: list[str]) -> Translated:
    enabled = go_bool(BY_KEY["lookup.enabled"], given.get("lookup.enabled", "false"))
    url_key = next((key for key in ("lookup.service.url", "lookup.baseurl") if given.get(key)), None)
    if not enabled:
        if url_key is not None:
            notes.append(f"{BY_KEY[url_key].named} ignored: lookup.enabled is not true (as in hollow)")
        return {}
    if url_key is None:
        raise ConfigError(f"{BY_KEY['lookup.enabled'].named}=true needs {BY_KEY['lookup.service.url'].named} "
                          "(imds: --lookup-url / IMDS_LOOKUP_URL)")
    values = {"lookup_url": (given[url_key], frozenset({url_key}))}
    if "lookup.oidc.scopes" not in given:  # hollow's default: below every given value (no keys: a variable's)
        values["lookup_scope"] = (DEFAULT_SCOPES, frozenset())
    return values


def hollow_aliases(flags: Mapping[str, Any], env: Mapping[str, str]) -> Aliases:
    """The imds values hollow's flags and ``METADATASERVICE_*`` variables give (``resolve.Command.aliases``).

    Flags and variables are read together (a hollow flag beats a hollow variable of the same key);
    a value is a flag's when any hollow flag gave to it, else a variable's. A ``--oidc=false`` /
    ``METADATASERVICE_OIDC_ENABLED=false`` adds the check that imds has another admin credential.
    """
    config = flags.get("config")
    if config:
        _refuse(BY_KEY["config"], str(config))
    by_flag = given_flags(flags)
    given = {**given_env(env), **by_flag}
    values, notes = translate(given)
    oidc = given.get("oidc.enabled")
    off = oidc is not None and not go_bool(BY_KEY["oidc.enabled"], oidc)
    checks = (_check_admin_credential,) if off else ()
    from_flags = {name: text for name, (text, keys) in values.items() if keys & by_flag.keys()}
    from_env = {name: (text, HOLLOW_SOURCE) for name, (text, keys) in values.items() if not keys & by_flag.keys()}
    return Aliases(flags=from_flags, env=from_env, checks=checks, notes=tuple(notes))


def _check_admin_credential(values: Values) -> None:
    if values["admin_token"] is None and values["admin_tokens_file"] is None:
        msg = (f"{BY_KEY['oidc.enabled'].named}=false: imds never serves an open admin API; set --admin-token / "
               "IMDS_ADMIN_TOKEN or --admin-tokens-file / IMDS_ADMIN_TOKENS_FILE (or --oidc-issuer for JWTs)")
        raise ConfigError(msg)


def hollow_table() -> str:
    """docs/hollow.md's table of hollow's names (``tests/unit/test_hollow_config.py`` keeps them equal)."""
    rows = ["| hollow flag | viper key | environment | fate | imds | note |", "|---|---|---|---|---|---|"]
    for name in HOLLOW:
        flag = f"`{name.flag}`" if name.flag else "—"
        imds = f"`--{name.imds.replace('_', '-')}`"
        env = f"`{name.env}`" if name.env else "—"
        rows.append(f"| {flag} | `{name.key}` | {env} | {name.fate} | {imds} | {name.note} |")
    return "\n".join(rows)
