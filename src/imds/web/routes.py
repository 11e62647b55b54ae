"""The instance routes, declared once as data, and what the front derives from them.

Each ``Route`` row names a flavor and the handler (a method of that flavor) answering its
exact paths and its first path segments, whether ``--instance-auth`` (the anti-SSRF check)
applies to it, and whether it is answered under ``/api/v1`` too. ``dispatch`` turns the rows
into the front's two dicts once, at start: nothing is looked up row by row per request.
The metric group of every other path (``Groups``) and the ``/api/v1`` alias (``aliased``)
come from here as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from imds.services.identity.idtoken import DISCOVERY_PATH, JWKS_PATH
from imds.services.render.ec2 import VERSIONS as EC2_VERSIONS
from imds.services.render.gce import PREFIX as GCE_PREFIX
from imds.web.routing import Handler

API_V1 = "/api/v1"  # hollow's versioned prefix: the JSON reads and the whole admin API answer under it too
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
PROBE_PATHS = frozenset({"/healthz", "/readyz"})  # answered on every listener (health checks)
# Instance routes also answered on an --admin-listen listener: the identity tokens' key set and its
# discovery document, so a verifier inside the operator's network need not look like an instance.
PUBLISHED_PATHS = frozenset({JWKS_PATH, DISCOVERY_PATH})
GCE_PATH = f"/{GCE_PREFIX}"  # the front's own answers on paths under it say Metadata-Flavor: Google
INSTANCE = "instance"  # the metric group of every request an instance route answers


def aliased(path: str) -> tuple[str, str]:
    """``path`` and its ``/api/v1`` alias."""
    return path, f"{API_V1}{path}"


def on_gce_path(path: str) -> bool:
    """Whether ``path`` is GCE's (``/computeMetadata`` or under it): every answer there says ``Metadata-Flavor``."""
    return path == GCE_PATH or path.startswith(f"{GCE_PATH}/")


def first_segment(path: str) -> str:
    """The first segment of ``path`` (``/openstack/latest`` → ``openstack``, ``/metadata`` → ``metadata``)."""
    return path.split("/", 2)[1] if path.count("/") > 1 else path[1:]


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the instance route table."""

    flavor: str  # the flavor answering: also the name ``--instance-auth`` lists
    handler: str  # the name of the flavor's method answering these paths
    exact: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()  # first path segments: every path under /<segment>
    guarded: bool = False  # --instance-auth applies when it lists ``flavor``
    aliased: bool = False  # the exact paths are answered under /api/v1 too

    def paths(self) -> tuple[str, ...]:
        """The exact paths, with their ``/api/v1`` aliases when the row has them."""
        if not self.aliased:
            return self.exact
        return tuple(alias for path in self.exact for alias in aliased(path))


ROUTES: tuple[Route, ...] = (
    Route("json", "metadata", exact=("/metadata", "/metadata/"), guarded=True, aliased=True),
    Route("json", "userdata", exact=("/userdata", "/userdata/"), guarded=True, aliased=True),
    Route("json", "notices", exact=("/notices", "/notices/"), guarded=True, aliased=True),
    Route("ec2", "versions", exact=("/",)),  # GCE's root with Metadata-Flavor: Google (web/flavors/gce.py)
    Route("ec2", "handle", prefixes=EC2_VERSIONS),
    Route("openstack", "handle", prefixes=("openstack",), guarded=True),
    Route("nocloud", "handle", prefixes=("nocloud",), guarded=True),
    Route("ganeti", "handle", prefixes=("ganeti",), guarded=True),  # with /ganeti/<v>/read|write (the channel)
    Route("gce", "handle", prefixes=(GCE_PREFIX,)),  # its own header checks: Metadata-Flavor, no X-Forwarded-For
    Route("gce", "jwks", exact=(JWKS_PATH,)),
    Route("gce", "discovery", exact=(DISCOVERY_PATH,)),
    Route("channel", "events", exact=("/events",)),
    Route("channel", "phone_home", exact=("/phone-home",)),
)

Guard = Callable[[str, Handler], Handler]


def dispatch(
    flavors: Mapping[str, object], guard: Guard, routes: Iterable[Route] = ROUTES
) -> tuple[dict[str, Handler], dict[str, Handler]]:
    """The front's dicts: exact path → handler and first segment → handler (``guard`` wraps guarded rows).

    A path or segment declared twice is a ValueError: each is answered by one row.
    """
    exact: dict[str, Handler] = {}
    prefixes: dict[str, Handler] = {}
    for route in routes:
        handler: Handler = getattr(flavors[route.flavor], route.handler)
        if route.guarded:
            handler = guard(route.flavor, handler)
        for table, keys in ((exact, route.paths()), (prefixes, route.prefixes)):
            for key in keys:
                if key in table:
                    msg = f"instance route {key!r} is declared twice"
                    raise ValueError(msg)
                table[key] = handler
    return exact, prefixes


class Groups:
    """The metric group of a request no instance route answered: ``ops``, ``admin`` or ``other``.

    ``admin``: the path's first segment is one of the admin app's routes (``admin_paths``,
    its ``/api/v1`` alias included); ``ops``: the operational paths. Computed once here.
    """

    def __init__(self, admin_paths: Iterable[str]) -> None:
        self._exact = dict.fromkeys(OPS_PATHS, "ops")
        self._segments = {first_segment(path): "admin" for path in admin_paths if path not in OPS_PATHS}

    def of(self, path: str) -> str:
        """The group of ``path``."""
        return self._exact.get(path) or self._segments.get(first_segment(path), "other")
