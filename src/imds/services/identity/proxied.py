"""Who is asking, when a trusted host-side proxy says so: the signed instance id.

``imds proxy`` (or the haproxy ``imds agent`` renders) knows which VM is calling from
something the VM cannot forge (its isolated network, its OVS port) and names it in
``X-Instance-ID``, stamped in ``X-Instance-ID-Timestamp`` and signed in
``X-Instance-ID-Signature`` (``imds.signing``). The rules:

- Only a socket peer inside a ``--trusted-proxy`` network is heard; from any other peer
  these headers are ignored entirely and the peer address decides, as without a proxy.
- An id without a signature is malformed (400, naming the header); a signature that
  verifies under neither the current nor the previous secret is refused (403, logged with
  the id and the peer only); with no secret configured every signed id is refused (403).
- The signature covers the timestamp and the tenant (``X-Tenant-ID``, when sent): a
  timestamp that is not whole unix seconds is malformed (400); one further than the
  window (``--proxy-signature-window``, 30 s) from this server's clock is refused (403,
  logged ``proxy.stale_signature``), so a captured header cannot be replayed for long.
- Without a timestamp the legacy signature (of the id alone, as a Neutron-style proxy
  sends it) is accepted only with ``--accept-unstamped-signatures``; otherwise the
  request is malformed (400, naming ``X-Instance-ID-Timestamp``).
- ``X-Tenant-ID``, when sent, must equal the record's ``project_id`` when it has one; a
  mismatch answers as if the instance did not exist (404).
- One key per host: with ``X-Instance-Host`` the signature is that host's, made with the key
  derived from the fleet secret (``imds.signing.host_key``, current or previous fleet secret;
  the message ends with the host), always stamped. When the record names a ``host`` (a
  top-level key of its metadata document, set by the source of truth) and it is another one,
  the claim is refused (403, logged ``proxy.foreign_host``): a captured host key signs only
  for the instances on that host. Without ``X-Instance-Host`` the one shared secret decides,
  as before; serve logs at startup that this mode is the weaker one.
- IMDSv2: a token PUT through a proxy is refused (AWS's rule against in-guest reverse
  proxies), except from a trusted proxy with a valid signature whose ``X-Forwarded-For``
  names exactly one address, the VM it saw; the token is bound to the signed id. ``imds
  proxy`` overwrites what the VM sent and itself refuses a token PUT that carried
  ``X-Forwarded-For`` from the VM, so the AWS rule still holds end to end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from imds import log
from imds.errors import BadSignature, ForeignHost, InvalidInput, ProxyNotConfigured, StaleSignature
from imds.models import RECORD_HOST, Address, Instance, Network
from imds.services.identity.identify import is_trusted
from imds.signing import host_key, stamped_message, valid_host, verify, verify_message

_log = log.get("proxied")
_SIGNATURE_FIELD = "X-Instance-ID-Signature"
_TIMESTAMP_FIELD = "X-Instance-ID-Timestamp"
_HOST_FIELD = "X-Instance-Host"
DEFAULT_WINDOW = 30
HOST_KEYS_HELD = 4096  # derived host keys kept (a fleet has fewer hosts; the bound is for a misbehaving proxy)


def record_host(instance: Instance) -> str | None:
    """The host the record places the instance on (its metadata's ``host``), or None."""
    host = instance.metadata.get(RECORD_HOST) if instance.metadata is not None else None
    return host if isinstance(host, str) and host else None


@dataclass(frozen=True)
class Claim:
    """A verified statement from a trusted proxy: this request comes from ``instance_id``."""

    instance_id: str
    tenant_id: str | None = None
    host: str | None = None  # signed with this host's own key

    def check_host(self, instance: Instance) -> None:
        """ForeignHost when a host signed for an instance its record places on another host."""
        if self.host is None:
            return
        placed = record_host(instance)
        if placed is not None and placed != self.host:
            _log.warning("proxy.foreign_host", instance_id=self.instance_id, host=self.host, record_host=placed)
            raise ForeignHost(self.instance_id, self.host)

    def admits(self, instance: Instance) -> bool:
        """Whether the claimed tenant (if any) matches the record's ``project_id`` (if any)."""
        if self.tenant_id is None or instance.metadata is None:
            return True
        project = instance.metadata.get("project_id")
        return project is None or str(project) == self.tenant_id


class SignedIdentity:
    """Checks ``X-Instance-ID`` claims against the trusted networks and the shared secrets.

    ``secrets`` holds the current shared secret first, then the previous one during a
    rotation; ``fleet_secrets`` likewise the fleet secrets host keys derive from. They are
    read once at startup and never logged. A stamped claim is accepted within ``window``
    seconds of ``clock()``; an unstamped one only when ``accept_unstamped`` (and never a
    host's).
    """

    def __init__(  # noqa: PLR0913 - keyword-only, one per imds serve option
        self,
        trusted: Sequence[Network],
        secrets: Sequence[bytes],
        *,
        fleet_secrets: Sequence[bytes] = (),
        window: int = DEFAULT_WINDOW,
        accept_unstamped: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._trusted = tuple(trusted)
        self._secrets = tuple(secrets)
        self._fleet = tuple(fleet_secrets)
        self._host_keys: dict[str, tuple[bytes, ...]] = {}
        self._window = window
        self._accept_unstamped = accept_unstamped
        self._clock = clock

    def claim(  # noqa: PLR0913, PLR0917 - one parameter per signed header, as the web layer reads them
        self,
        peer: Address | None,
        instance_id: str | None,
        signature: str | None,
        tenant_id: str | None,
        timestamp: str | None = None,
        host: str | None = None,
    ) -> Claim | None:
        """The verified claim of this request, or None when it makes none the peer may make.

        ``peer`` is the socket peer; the other arguments are the raw header values.
        """
        if instance_id is None or peer is None or not self._trusted or not is_trusted(peer, self._trusted):
            return None
        instance_id = instance_id.strip()
        if not instance_id:
            raise InvalidInput.one("X-Instance-ID", "is empty")
        tenant = (tenant_id.strip() if tenant_id is not None else None) or None
        claimed = Claim(instance_id, tenant, (host.strip() if host is not None else None) or None)
        if claimed.host is not None and not self._fleet:
            raise ProxyNotConfigured(host_keys=True)
        if claimed.host is None and not self._secrets:
            raise ProxyNotConfigured
        if signature is None or not signature.strip():
            raise InvalidInput.one(_SIGNATURE_FIELD, "required with X-Instance-ID from a trusted proxy")
        stamp = timestamp.strip() if timestamp is not None else ""
        if claimed.host is not None:
            self._check_host_signed(peer, claimed, stamp, signature)
        elif stamp:
            self._check_stamped(peer, claimed, stamp, signature)
        elif not self._accept_unstamped:
            raise InvalidInput.one(_TIMESTAMP_FIELD, "required with X-Instance-ID from a trusted proxy "
                                                     "(unstamped signatures need --accept-unstamped-signatures)")
        elif not verify(self._secrets, instance_id, signature):
            self._refuse(peer, claimed)
        return claimed

    def _check_host_signed(self, peer: Address, claimed: Claim, stamp: str, signature: str) -> None:
        """A host's own signature: a well-formed host name, always stamped, under that host's key."""
        if not valid_host(claimed.host or ""):
            raise InvalidInput.one(_HOST_FIELD, "must be a host name (letters, digits, '.', '_', '-')")
        if not stamp:
            raise InvalidInput.one(_TIMESTAMP_FIELD, "required with X-Instance-Host (a host key signs stamped)")
        self._check_stamped(peer, claimed, stamp, signature)

    def _check_stamped(self, peer: Address, claimed: Claim, stamp: str, signature: str) -> None:
        if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:  # unix seconds, not milliseconds
            raise InvalidInput.one(_TIMESTAMP_FIELD, "must be whole unix seconds")
        seconds = int(stamp)
        keys = self._secrets if claimed.host is None else self._keys_of(claimed.host)
        message = stamped_message(claimed.instance_id, seconds, claimed.tenant_id, claimed.host)
        if not verify_message(keys, message, signature):
            self._refuse(peer, claimed)
        skew = seconds - int(self._clock())  # whole seconds on both sides, as the proxy stamps them
        if abs(skew) > self._window:
            # Signed by a holder of the secret, but not now: a replay, or a proxy whose clock is off.
            _log.warning("proxy.stale_signature", instance_id=claimed.instance_id, peer=str(peer), skew=skew,
                         host=claimed.host)
            raise StaleSignature(claimed.instance_id, self._window)

    def _keys_of(self, host: str) -> tuple[bytes, ...]:
        """``host``'s keys under the current and previous fleet secret (derived once, then held)."""
        keys = self._host_keys.get(host)
        if keys is None:
            if len(self._host_keys) >= HOST_KEYS_HELD:
                self._host_keys.clear()
            keys = self._host_keys[host] = tuple(host_key(secret, host) for secret in self._fleet)
        return keys

    @staticmethod
    def _refuse(peer: Address, claimed: Claim) -> NoReturn:
        # The id, the host and the peer only: never the secret, the signature sent or the one expected.
        _log.warning("proxy.bad_signature", instance_id=claimed.instance_id, peer=str(peer), host=claimed.host)
        raise BadSignature(claimed.instance_id)


def may_mint_through(claim: Claim | None, forwarded_for: Sequence[str]) -> bool:
    """Whether an IMDSv2 token PUT carrying these ``X-Forwarded-For`` values may mint a token.

    Without the header: yes. With it: only for a verified claim, and only when the header
    names exactly one address (the VM the proxy saw, not a hop the VM added).
    """
    if not forwarded_for:
        return True
    hops = [item for value in forwarded_for for item in value.split(",") if item.strip()]
    return claim is not None and len(hops) == 1
