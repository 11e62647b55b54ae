"""How the agent's haproxy runs and reaches ``imds serve``: its user, its chroot, its TLS files.

- ``process_of``: haproxy's workers run as ``--haproxy-user`` (a system user and the group of
  the same name, which ``deploy/sysusers.d/imds-agent.conf`` creates), chrooted to
  ``STATE/haproxy-root``: a directory the agent creates empty, root's, read-only, and
  refuses to use when something is in it. The master stays root (it binds port 80 inside the
  metadata namespace and re-executes itself on reload); the workers, which talk to every
  VM, hold no privilege and see no file.
- ``upstream_of``: ``--upstream`` with its TLS settings. haproxy wants the client certificate
  and its key in one PEM, or the key beside it as ``<file>.key``: when they are two files the
  agent links both under ``STATE/tls/`` (symbolic links: the key is never copied).
"""

from __future__ import annotations

import grp
import pwd
from pathlib import Path

from imds.agent.haproxy import Process, Upstream, UpstreamTls
from imds.config import AgentSettings
from imds.errors import ConfigError

CHROOT = "haproxy-root"
CLIENT_PEM = "client.pem"


def process_of(settings: AgentSettings, log_fd: int) -> Process:
    """The workers' user and chroot (created here, empty) and the log descriptor; ConfigError when unusable."""
    user = settings.haproxy_user
    try:
        pwd.getpwnam(user)
        grp.getgrnam(user)
    except KeyError as exc:
        msg = (f"--haproxy-user: no system user and group {user!r} (create them: systemd-sysusers "
               f"deploy/sysusers.d/imds-agent.conf, or useradd --system --user-group {user})")
        raise ConfigError(msg) from exc
    root = settings.state_dir.resolve() / CHROOT
    root.mkdir(mode=0o555, exist_ok=True)
    root.chmod(0o555)
    if any(root.iterdir()):
        msg = f"--state-dir: {root} must be empty (haproxy's workers are chrooted there)"
        raise ConfigError(msg)
    return Process(user, str(root), log_fd)


def upstream_of(settings: AgentSettings) -> Upstream:
    """``--upstream`` and, for https://, how haproxy verifies it and which client certificate it shows."""
    upstream = Upstream.parse(settings.upstream)
    if not upstream.tls:
        return upstream
    ca = str(settings.upstream_ca_file.resolve()) if settings.upstream_ca_file else None
    certificate = None
    if settings.upstream_cert_file is not None:
        certificate = _client_pem(settings.state_dir.resolve() / "tls", settings.upstream_cert_file,
                                  settings.upstream_key_file)
    for path, flag in ((ca, "--upstream-ca-file"), (certificate, "--upstream-cert-file")):
        if path is not None and any(c.isspace() or c in "\"'#\\" for c in path):
            msg = f"{flag}: {path!r} cannot go into haproxy's config (no spaces, quotes, '#' or backslashes)"
            raise ConfigError(msg)
    verify = UpstreamTls(ca_file=ca, certificate=certificate, insecure=settings.upstream_insecure)
    return Upstream(upstream.host, upstream.port, tls=True, verify=verify)


def _client_pem(directory: Path, cert: Path, key: Path | None) -> str:
    """The path haproxy's ``crt`` takes: the certificate itself, or a link to it with its key linked beside."""
    cert = cert.resolve()
    if key is None or key.resolve() == cert:
        return str(cert)
    directory.mkdir(mode=0o700, exist_ok=True)
    for name, target in ((CLIENT_PEM, cert), (CLIENT_PEM + ".key", key.resolve())):
        link = directory / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return str(directory / CLIENT_PEM)
