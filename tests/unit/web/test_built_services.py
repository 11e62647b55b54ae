"""The web layer calls services the application built: no module under ``web/`` builds one itself.

``imds.app.build_services`` builds the explainer, the audit log, the Ganeti flavor's package
and image sources, the records read out and written back, the admin page's fleet view and the
readiness probe; the route modules take them from ``Services``, never from the store or an
HTTP client they reach through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import imds.web
from helpers import make_settings
from imds.app import build_services
from imds.services.explain import Explainer
from imds.services.fleet import Fleet
from imds.services.ganeti.sources import OsSources
from imds.services.readiness import ReadinessProbe
from imds.services.records.audit import AuditLog
from imds.services.transfer.stored import StoredRecords

WEB = Path(imds.web.__file__).parent
MODULES = sorted(str(path.relative_to(WEB)) for path in WEB.rglob("*.py"))
RAW = {"store", "http", "fetch"}  # what a service is built from


def _reached(source: str) -> list[str]:
    """Where ``source`` reaches a raw resource through a ``Services`` (``services.store``, ``self._services.http``).

    ``settings.store`` and ``settings.http`` are option groups, not resources: not counted.
    """
    def holder(node: ast.expr) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    return sorted(
        f"{node.lineno}: {node.attr}" for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in RAW and holder(node.value).endswith("services")
    )


def test_the_scan_sees_a_store_reached():
    """The check finds what it looks for (a guard against a scan that passes everything)."""
    source = "async def f(services, self):\n    await services.store.get(1)\n    self._services.http.get('/')\n"
    assert _reached(source) == ["2: store", "3: http"]
    assert _reached("x = services.settings.store.db\ny = settings.http.listen\n") == []


def test_the_scan_covers_the_admin_routes():
    """Every module of the web layer is checked, the admin routers that once reached the store included."""
    assert {"admin/records.py", "admin/ui.py", "ops.py", "admin/explain.py", "flavors/ganeti.py"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_reaches_no_store_or_http_client(module):
    """No ``services.store``, ``services.http`` or ``services.fetch`` in any module under ``web/``."""
    assert _reached((WEB / module).read_text()) == []


@pytest.mark.anyio
async def test_the_app_builds_what_those_modules_call():
    """``build_services`` hands over one of each, built from its own store and fetch client."""
    services = build_services(make_settings())
    try:
        assert isinstance(services.explainer, Explainer)
        assert isinstance(services.audit, AuditLog)
        assert isinstance(services.os_sources, OsSources)
        assert services.os_sources.images._http is services.fetch
        assert isinstance(services.fleet, Fleet)
        assert isinstance(services.readiness, ReadinessProbe)
        assert isinstance(services.transfer, StoredRecords)
        assert services.transfer.store is services.store
        assert services.transfer.records is services.records
        assert services.transfer.os is services.os
        assert services.transfer.notices is services.notices
    finally:
        await services.stop()
