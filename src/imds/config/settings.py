"""``imds serve``'s settings: one frozen dataclass per concern, and ``Settings`` holding one of each.

A group's fields are exactly its rows' names in ``imds.config.serve.OPTIONS``, holding the value in
the row's kind (or what the row's ``parse`` makes of it); ``tests/unit/test_config_groups.py`` keeps
rows and fields equal. So an option is one row plus one typed field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from imds.config.option import Group, typed
from imds.config.serve import OPTIONS
from imds.models import Network
from imds.templates import Template, compile_template


@dataclass(frozen=True, repr=False)
class HttpSettings(Group, rows=OPTIONS):
    """The HTTP server and its listeners (docs/server.md)."""

    listen: tuple[tuple[str, int], ...]
    admin_listen: tuple[tuple[str, int], ...]
    server: str
    workers: int
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int
    max_connections_per_source: int
    shutdown_timeout: float


@dataclass(frozen=True, repr=False)
class CallerSettings(Group, rows=OPTIONS):
    """Who is calling on the instance side: trusted proxies, signed ids, anti-SSRF, rate limit."""

    trusted_proxy: tuple[Network, ...]
    proxy_shared_secret_file: Path | None
    proxy_previous_secret_file: Path | None
    proxy_fleet_secret_file: Path | None
    proxy_previous_fleet_secret_file: Path | None
    proxy_signature_window: int
    accept_unstamped_signatures: bool
    instance_auth: frozenset[str]
    rate_limit: float
    rate_burst: int
    max_requests_per_source: int


@dataclass(frozen=True, repr=False)
class StoreSettings(Group, rows=OPTIONS):
    """The database: where, how long to wait for it, the change feed; the demo record."""

    data_dir: Path | None
    db: str
    migrate: bool
    db_connect_timeout: float
    db_statement_timeout: float
    feed_poll_interval: float
    render_cache_bytes: int
    render_ahead: bool
    demo: bool

    @property
    def key_dir(self) -> Path | None:
        """Where generated keys live: the data directory, except for the in-memory store.

        None (keys generated in memory, lost on restart) also when no data directory is
        set, which only happens when Settings is built by ``Settings.of`` rather than ``load``.
        """
        return None if self.db.startswith("memory://") else self.data_dir


@dataclass(frozen=True, repr=False)
class AdminSettings(Group, rows=OPTIONS):
    """Who may use the admin API: static tokens, a tokens file, OIDC; the /metrics exception."""

    admin_token: str | None
    admin_tokens_file: Path | None
    oidc_issuer: str | None
    oidc_jwks_url: str | None
    oidc_audience: str | None
    oidc_roles_claim: str
    oidc_username_claim: str
    metrics_public: bool


@dataclass(frozen=True, repr=False)
class LimitSettings(Group, rows=OPTIONS):
    """Bounds on admin writes."""

    max_body_bytes: int
    max_addresses: int
    max_document_depth: int
    max_document_keys: int
    strict_records: bool
    allow_wide_prefixes: bool


@dataclass(frozen=True, repr=False)
class Ec2Settings(Group, rows=OPTIONS):
    """EC2 specifics: IMDSv2 tokens and signed identity documents."""

    imdsv2: str
    token_hop_limit: int
    imdsv2_key_file: Path | None
    identity_key: Path | None
    identity_cert: Path | None


@dataclass(frozen=True, repr=False)
class TemplateSettings(Group, rows=OPTIONS):
    """Template fields added to every metadata document (each compiled once at load)."""

    api_url: str | None
    phone_home_url: str | None
    user_state_url: str | None

    @property
    def sources(self) -> dict[str, str]:
        """The configured template fields, by the metadata key they fill."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @property
    def compiled(self) -> tuple[Template, ...]:
        """The configured template fields, compiled (``load`` already refused any that do not compile)."""
        return tuple(compile_template(key, source) for key, source in self.sources.items())


@dataclass(frozen=True, repr=False)
class LookupSettings(Group, rows=OPTIONS):
    """The upstream source of truth (pull mode): where, credentials, caching, the breaker."""

    lookup_url: str | None
    lookup_token: str | None
    lookup_oidc_issuer: str | None
    lookup_client_id: str | None
    lookup_client_secret: str | None
    lookup_scope: tuple[str, ...]
    lookup_audience: str | None
    lookup_timeout: float
    lookup_negative_ttl: float
    lookup_refresh_after: float
    lookup_cache_ttl: float
    lookup_concurrency: int
    lookup_breaker_failures: int
    lookup_breaker_reset: float


@dataclass(frozen=True, repr=False)
class GanetiSettings(Group, rows=OPTIONS):
    """Ganeti OS installation (services/ganeti/records.py)."""

    private_key_file: Path | None
    os_definitions_dir: Path | None
    ganeti_os_search_path: tuple[Path, ...]
    os_param_max_bytes: int
    os_package_max_bytes: int
    os_package_timeout: float
    ganeti_os_image_dir: tuple[Path, ...]
    ganeti_os_package_dir: tuple[Path, ...]
    os_image_max_bytes: int
    fetch_allow: tuple[Network, ...]
    ganeti_metad_socket: Path | None


@dataclass(frozen=True, repr=False)
class ChannelSettings(Group, rows=OPTIONS):
    """The instance<->host channel and change watch (README: "The instance↔host channel")."""

    event_rate: float
    event_burst: int
    event_max_bytes: int
    event_retain: int
    message_max_bytes: int
    message_max_queued: int
    watch_max_timeout: int


@dataclass(frozen=True, repr=False)
class GceSettings(Group, rows=OPTIONS):
    """GCE identity tokens: issuer and signing keys (services/identity/idtoken.py)."""

    identity_issuer: str | None
    identity_key_file: Path | None
    identity_previous_key_file: Path | None


@dataclass(frozen=True, repr=False)
class LogSettings(Group, rows=OPTIONS):
    """Logging."""

    log_level: str
    log_instance_reads: bool


@dataclass(frozen=True)
class Settings:
    """Validated configuration of ``imds serve``, by group. Build it with ``load`` (or ``Settings.of``)."""

    http: HttpSettings
    callers: CallerSettings
    store: StoreSettings
    admin: AdminSettings
    limits: LimitSettings
    ec2: Ec2Settings
    templates: TemplateSettings
    lookup: LookupSettings
    ganeti: GanetiSettings
    channel: ChannelSettings
    gce: GceSettings
    logging: LogSettings

    @classmethod
    def of(cls, **values: Any) -> Settings:
        """Settings from the defaults, overridden by ``values`` (option names, values already of the field's type).

        Without the environment, the config file or checks: for tests and embedding. The store
        defaults to ``memory://`` and the data directory to none.
        """
        defaults = {option.name: typed(option, option.default) for option in OPTIONS} | {"db": "memory://"}
        unknown = sorted(values.keys() - defaults.keys())
        if unknown:
            msg = f"Settings.of: unknown option {', '.join(unknown)}"
            raise TypeError(msg)
        return cls.assemble(defaults | values)

    @classmethod
    def assemble(cls, values: Mapping[str, Any]) -> Settings:
        """Every group from resolved (typed, checked) values by option name."""
        built: dict[str, Any] = {name: group.pick(values) for name, group in SETTINGS_GROUPS.items()}
        return cls(**built)


SETTINGS_GROUPS: dict[str, type[Group]] = get_type_hints(Settings)
