"""The web layer calls services the application built: the named modules never build one themselves.

``imds.app.build_services`` builds the explainer, the audit log and the Ganeti flavor's
package and image sources; the route modules take them from ``Services``, never from the
store or an HTTP client they reach through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import imds.web
from helpers import make_settings
from imds.app import build_services
from imds.services.explain import Explainer
from imds.services.ganeti.sources import OsSources
from imds.services.records.audit import AuditLog

WEB = Path(imds.web.__file__).parent
MODULES = ("admin/explain.py", "admin/audit.py", "flavors/ganeti.py")
RAW = {"store", "http", "fetch"}  # what a service is built from


@pytest.mark.parametrize("module", MODULES)
def test_the_module_reaches_no_store_or_http_client(module):
    """No ``services.store``, ``services.http`` or ``services.fetch`` in the module."""
    tree = ast.parse((WEB / module).read_text())
    reached = sorted(
        f"{node.lineno}: {node.attr}" for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in RAW
        and isinstance(node.value, ast.Name) and node.value.id == "services"
    )
    assert reached == []


@pytest.mark.anyio
async def test_the_app_builds_what_those_modules_call():
    """``build_services`` hands over one of each, built from its own store and fetch client."""
    services = build_services(make_settings())
    try:
        assert isinstance(services.explainer, Explainer)
        assert isinstance(services.audit, AuditLog)
        assert isinstance(services.os_sources, OsSources)
        assert services.os_sources.images._http is services.fetch
    finally:
        await services.stop()
