"""The one exception tree of imds.

Every failure a caller can see is one of these; foreign exceptions (SQLAlchemy, httpx,
OS errors) are translated where they enter, with ``raise ... from exc``. HTTP statuses
for them are chosen in exactly one place, ``imds.web.errors``.

::

    ImdsError
    ├── NotFound                 nothing answers to this id, address or path
    │   ├── InstanceNotFound     the caller's address maps to no instance
    │   └── RecordNotFound       the instance has no record of this kind
    ├── InvalidInput             the request is malformed; carries one Problem per field
    │   ├── PayloadTooLarge      the body is over the configured limit
    │   ├── HeadersTooLarge      more header lines than the configured limit
    │   ├── HeadTooLarge         a request line and headers over the configured size
    │   └── RequestTimeout       the body did not arrive within the configured time
    ├── RateLimited              a caller sent more requests than its rate limit allows
    │   └── SourceBusy           a caller address has --max-requests-per-source requests in flight
    ├── AuthError
    │   ├── Unauthenticated      no credentials, or credentials that do not verify
    │   ├── AuthNotConfigured    the admin API has no way to check credentials
    │   ├── Forbidden            valid credentials without a required scope
    │   └── Refused              a request that is never allowed in this form
    │       ├── BadSignature     a proxy's X-Instance-ID-Signature does not verify
    │       ├── ForeignHost      a host signed for an instance its record places on another host
    │       └── ProxyNotConfigured  a signed id arrived but no proxy shared secret is configured
    ├── Conflict                 the request conflicts with the service's state or configuration
    │   └── LookupDisabled       a refresh was asked for but no upstream is configured
    ├── StoreUnavailable         the database cannot be reached or answered with an error
    ├── UpstreamError            an upstream answered something unusable (4xx, bad JSON, bad record)
    │   ├── UpstreamUnavailable  an upstream could not be reached, timed out, failed (5xx), or its breaker is open
    │   └── StreamCut            a streamed source (a Ganeti OS image) failed or went over its cap mid-answer
    ├── ConfigError              configuration is invalid; raised at startup only
    └── AgentError               the host agent could not program OVS or haproxy
        ├── OvsCommandFailed     an ovs-vsctl / ovs-ofctl / ip command failed
        ├── PoolExhausted        no Meta IP/MAC is left in the provider range
        └── HaproxyFailed        haproxy refused the rendered config or did not reload
    └── LabError                 an ``imds lab`` step failed (a tool missing, a guest that never came up)
"""

from __future__ import annotations

from dataclasses import dataclass


class ImdsError(Exception):
    """Base of every error imds raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ImdsError):
    """Nothing answers to the requested id, address or path."""


class InstanceNotFound(NotFound):
    """The caller's address maps to no instance."""

    def __init__(self, address: str | None) -> None:
        shown = address if address is not None else "an unidentified caller"
        super().__init__(f"no instance is associated with {shown}")
        self.address = address


class RecordNotFound(NotFound):
    """The instance has no record of the requested kind (``metadata``/``userdata``)."""

    def __init__(self, kind: str, instance_id: str) -> None:
        super().__init__(f"no {kind} stored for instance {instance_id}")
        self.kind = kind
        self.instance_id = instance_id


@dataclass(frozen=True)
class Problem:
    """One offending field: ``field`` is a path such as ``ipAddresses[3]``."""

    field: str
    message: str


class InvalidInput(ImdsError):
    """The request is malformed. ``problems`` names every offending field."""

    def __init__(self, problems: list[Problem], message: str = "invalid request") -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def one(cls, field: str, message: str) -> InvalidInput:
        """Build the error for a single offending field."""
        return cls([Problem(field, message)])


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the configured limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            [Problem("body", f"request body is larger than {limit} bytes (--max-body-bytes / IMDS_MAX_BODY_BYTES)")],
            message="request body too large",
        )
        self.limit = limit


class HeadersTooLarge(InvalidInput):
    """The request has more header lines than ``--max-headers`` allows."""

    def __init__(self, limit: int) -> None:
        super().__init__([Problem("headers", f"more than {limit} header lines (--max-headers)")], "headers too large")
        self.limit = limit


class HeadTooLarge(InvalidInput):
    """The request line and headers are larger than ``--max-header-bytes``."""

    def __init__(self, limit: int) -> None:
        problem = Problem("headers", f"request line and headers over {limit} bytes (--max-header-bytes)")
        super().__init__([problem], "headers too large")
        self.limit = limit


class RequestTimeout(InvalidInput):
    """The request body did not arrive within ``--body-timeout``."""

    def __init__(self, seconds: float) -> None:
        super().__init__([Problem("body", f"not received within {seconds:g}s (--body-timeout)")], "request timeout")
        self.seconds = seconds


class RateLimited(ImdsError):
    """An instance posted faster than its rate limit; it may try again after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many requests: try again in {retry_after} s")
        self.retry_after = retry_after


class SourceBusy(RateLimited):
    """One caller address already has ``limit`` instance requests in flight (``--max-requests-per-source``)."""

    def __init__(self, limit: int) -> None:
        message = f"too many requests in flight from this address (--max-requests-per-source {limit})"
        ImdsError.__init__(self, f"{message}: try again in 1 s")
        self.retry_after = 1
        self.limit = limit


class AuthError(ImdsError):
    """The admin API refused the credentials."""


class Unauthenticated(AuthError):
    """No credentials, or credentials that do not verify."""


class AuthNotConfigured(AuthError):
    """No token, tokens file or OIDC issuer is configured, so every admin call is refused."""

    def __init__(self) -> None:
        super().__init__(
            "the admin API has no authentication configured: set IMDS_ADMIN_TOKEN "
            "(or --admin-token), IMDS_ADMIN_TOKENS_FILE (or --admin-tokens-file), "
            "or IMDS_OIDC_ISSUER (or --oidc-issuer)"
        )


class Forbidden(AuthError):
    """Valid credentials that carry none of the scopes the call needs."""

    def __init__(self, needed: tuple[str, ...]) -> None:
        super().__init__("token lacks a required scope; one of: " + ", ".join(needed))
        self.needed = needed


class Refused(AuthError):
    """A request that is never allowed in this form (e.g. an IMDSv2 token PUT through a proxy)."""


class BadSignature(Refused):
    """A trusted proxy's ``X-Instance-ID-Signature`` does not sign its ``X-Instance-ID``."""

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"X-Instance-ID-Signature does not verify for instance {instance_id}")
        self.instance_id = instance_id


class StaleSignature(BadSignature):
    """A trusted proxy's signature verifies, but its ``X-Instance-ID-Timestamp`` is outside the window."""

    def __init__(self, instance_id: str, window: int) -> None:
        Refused.__init__(
            self, f"X-Instance-ID-Timestamp is more than {window} s away from this server's clock for instance "
            f"{instance_id} (a replayed header, or the proxy's clock is off)"
        )
        self.instance_id = instance_id


class ForeignHost(Refused):
    """A host signed (with its own key) for an instance whose record names another host."""

    def __init__(self, instance_id: str, host: str) -> None:
        super().__init__(f"instance {instance_id} does not run on host {host} (the record's host differs)")
        self.instance_id = instance_id
        self.host = host


class ProxyNotConfigured(Refused):
    """A signed instance id arrived from a trusted proxy, but ``imds serve`` has no secret to check it.

    ``host_keys``: the signature was a host's (``X-Instance-Host``), which needs the fleet secret.
    """

    def __init__(self, *, host_keys: bool = False) -> None:
        if host_keys:
            what = ("a host-signed X-Instance-ID refused: no fleet secret configured "
                    "(set --proxy-fleet-secret-file / IMDS_PROXY_FLEET_SECRET_FILE)")
        else:
            what = ("X-Instance-ID refused: no proxy shared secret configured "
                    "(set --proxy-shared-secret-file / IMDS_PROXY_SHARED_SECRET_FILE)")
        super().__init__(what)


class Conflict(ImdsError):
    """The request conflicts with the service's state or configuration."""


class LookupDisabled(Conflict):
    """A refresh from upstream was asked for, but no upstream is configured."""

    def __init__(self) -> None:
        super().__init__("no upstream is configured: set --lookup-url / IMDS_LOOKUP_URL to enable refreshes")


class StoreUnavailable(ImdsError):
    """The database could not be reached or failed a statement."""


class UpstreamError(ImdsError):
    """An upstream service answered something unusable."""


class UpstreamUnavailable(UpstreamError):
    """An upstream could not be reached, timed out, failed (5xx), or its circuit breaker is open."""


class StreamCut(UpstreamError):
    """A streamed source (the Ganeti OS image) failed or went over its cap after the answer started.

    No status can be sent any more: the front aborts the connection (``imds.web.instance``).
    """


class ConfigError(ImdsError):
    """The configuration is invalid. Raised at startup, never while serving."""


class AgentError(ImdsError):
    """The host agent could not program Open vSwitch or haproxy."""


class OvsCommandFailed(AgentError):
    """A command (``ovs-vsctl``, ``ovs-ofctl``, ``ip``) exited non-zero; carries its stderr."""

    def __init__(self, command: str, stderr: str) -> None:
        super().__init__(f"{command}: {stderr.strip() or 'failed'}")
        self.command = command
        self.stderr = stderr


class PoolExhausted(AgentError):
    """No Meta IP/MAC is left in the provider range for ``port``."""

    def __init__(self, port: str, cidr: str, capacity: int) -> None:
        super().__init__(
            f"provider range {cidr} is exhausted ({capacity} Meta addresses in use): no Meta IP for port {port}; "
            "widen --provider-cidr"
        )
        self.port = port
        self.cidr = cidr


class HaproxyFailed(AgentError):
    """haproxy refused the rendered configuration, or would not start or reload."""


class LabError(ImdsError):
    """An ``imds lab`` step failed (a tool missing or refusing, a guest that never came up)."""
