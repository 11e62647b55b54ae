"""Where the Ganeti flavor's archives and images come from, built once by the application.

The personalization package (``package.url``: fetched), the node files Ganeti names
(``os-package``, ``os-install-package``) and the ``os-image`` (a node path or a URL), each
under the ``--os-package-*`` / ``--os-image-*`` limits. ``imds.app.build_services`` makes
them from the settings and the fetch client; the web flavor only calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from imds.config import Settings
from imds.services.ganeti.image import ImageSource
from imds.services.ganeti.package import NodePackages, PackageFetcher


@dataclass(frozen=True)
class OsSources:
    """The package fetcher, the node packages and the image source the Ganeti flavor serves from."""

    packages: PackageFetcher
    node_packages: NodePackages
    images: ImageSource

    @classmethod
    def of(cls, settings: Settings, fetch: httpx.AsyncClient) -> OsSources:
        """The sources ``settings`` configure, fetching through ``fetch`` (the destination policy's client)."""
        ganeti = settings.ganeti
        return cls(
            packages=PackageFetcher(fetch, max_bytes=ganeti.os_package_max_bytes,
                                    timeout=ganeti.os_package_timeout),
            node_packages=NodePackages(ganeti.ganeti_os_package_dir, max_bytes=ganeti.os_package_max_bytes,
                                       timeout=ganeti.os_package_timeout),
            images=ImageSource(fetch, directories=ganeti.ganeti_os_image_dir, max_bytes=ganeti.os_image_max_bytes,
                               timeout=ganeti.os_package_timeout),
        )
