"""The options ``imds proxy`` and ``imds agent`` share: how they sign, and TLS to ``imds serve``.

Both sign the calling VM's identity for ``imds serve`` and forward to it, so both take the same
rows (each under its own prefix, ``IMDS_PROXY_*`` / ``IMDS_AGENT_*``) and the same check:

- signing: ``--host-key-file`` with ``--host-name`` (this host's own key, ``imds host-key``),
  or the one fleet-wide ``--shared-secret-file`` (the older, weaker mode); exactly one;
- TLS to an ``https://`` upstream: ``--upstream-ca-file`` (a private CA; default: the system's),
  ``--upstream-cert-file`` and ``--upstream-key-file`` (the client certificate serve's TLS
  front asks for), or ``--upstream-insecure`` (no verification, logged as a warning at start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imds.config.option import Option, Rows
from imds.config.resolve import Values
from imds.errors import ConfigError

TLS_FILES = ("upstream_ca_file", "upstream_cert_file", "upstream_key_file")


@dataclass(frozen=True, repr=False)
class HostSide:
    """The fields of ``host_side_rows``, shared by ``ProxySettings`` and ``AgentSettings`` (their groups' repr)."""

    shared_secret_file: Path | None
    host_key_file: Path | None
    host_name: str | None
    upstream_ca_file: Path | None
    upstream_cert_file: Path | None
    upstream_key_file: Path | None
    upstream_insecure: bool


def host_side_rows(rows: Rows) -> tuple[Option, ...]:
    """The signing and TLS rows, made by ``rows`` (the command's group and prefix)."""
    return (
        rows("shared_secret_file", "path", None,
             "File holding the one fleet-wide secret that signs X-Instance-ID (weaker: prefer --host-key-file; "
             "exactly one of the two)."),
        rows("host_key_file", "path", None,
             "File holding this host's own signing key (imds host-key HOST); serve checks the record's host."),
        rows("host_name", "str", None,
             "This host's name as the records name it (their metadata 'host'); required with --host-key-file."),
        rows("upstream_ca_file", "path", None,
             "PEM CA bundle that signs an https:// upstream's certificate (default: the system's CAs)."),
        rows("upstream_cert_file", "path", None,
             "PEM client certificate presented to an https:// upstream (mutual TLS), its key too unless "
             "--upstream-key-file."),
        rows("upstream_key_file", "path", None,
             "PEM private key of --upstream-cert-file (default: in that same file)."),
        rows("upstream_insecure", "bool", False,  # noqa: FBT003 - a table row, not a call site
             "Do not verify an https:// upstream's certificate (logged as a warning; for tests only)."),
    )


def check_host_side(values: Values) -> None:
    """Exactly one signing mode (a host name with a host key); TLS files only for https://, existing, paired."""
    shared, host_key, host = values["shared_secret_file"], values["host_key_file"], values["host_name"]
    if (shared is None) == (host_key is None):
        names = values.options["shared_secret_file"].named, values.options["host_key_file"].named
        msg = f"exactly one of {names[1]} (this host's key) or {names[0]} (one fleet-wide secret) is required"
        raise ConfigError(msg)
    if host_key is not None:
        values.require(("host_name",), bool, "is required with --host-key-file")
    elif host is not None:
        values.require(("host_name",), lambda _name: False, "is only used with --host-key-file")
    https = str(values["upstream"] or "").lower().startswith("https://")
    given = [name for name in (*TLS_FILES, "upstream_insecure") if values[name]]
    if given and not https:
        values.require((given[0],), lambda _value: False, "needs an https:// --upstream")
    values.require_files(TLS_FILES)
    if values["upstream_key_file"] is not None and values["upstream_cert_file"] is None:
        values.require(("upstream_key_file",), lambda _value: False, "needs --upstream-cert-file (its certificate)")
