"""``imds explain IP|ID``: which instance an address resolves to, through which entry, and what it is served.

On the database (``--db`` / ``--data-dir``, through ``imds.services.offline``) or a live
server (``--url`` + token: ``GET /explain?q=``, which also knows the upstream lookup's
caches). See ``imds.services.explain``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import click

from imds.cli.records import OUTPUTS, Target, target_options
from imds.errors import InvalidInput
from imds.services.explain import explain_snapshot, parse_query
from imds.services.offline import OfflineRecords


@click.command()
@click.argument("query", metavar="IP|ID")
@target_options
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True,
              help="table, or json (the same body as GET /explain).")
def explain(query: str, output: str, **flags: Any) -> None:
    """Explain which instance IP|ID resolves to, through which stored entry, and what each flavor serves it.

    Example: imds explain 10.0.0.5 --data-dir /var/lib/imds

    Example: imds explain 10.0.0.5 --url http://127.0.0.1:8000 -o json (token: IMDS_ADMIN_TOKEN)
    """
    try:
        parsed = parse_query(query)
    except InvalidInput as exc:
        raise click.UsageError(f"{query!r} is neither an IP address nor an instance id (a UUID)") from exc
    with Target(flags) as target:
        if target.remote is not None:
            body: dict[str, Any] = target.remote.get_json(f"/explain?q={quote(str(parsed))}")
        else:
            templates = target.settings.templates.compiled

            async def read(offline: OfflineRecords) -> dict[str, Any]:
                return explain_snapshot(await offline.all(), parsed, templates=templates)

            body = target.offline(read)
    click.echo(json.dumps(body, indent=2, ensure_ascii=False) if output == "json" else render_table(body))


def render_table(body: dict[str, Any]) -> str:
    """The explanation for people."""
    lines = [f"query        {body['query']}"]
    if body["instance_id"] is None:
        lines.append(f"instance     none: {body.get('why') or 'no stored entry contains it'}")
    else:
        lines.append(f"instance     {body['instance_id']} (by {body['resolved_by']})")
    if body["matched"]:
        match = body["matched"]
        covers = f", covering {match['covers']}" if match.get("covers") else ""
        lines.append(f"entry        {match['entry']} ({match['kind']}, /{match['prefix']}{covers}: the longest prefix)")
    lines += [f"also in      {e['entry']} ({e['kind']}, held by {e['instance_id']})" for e in body["also_containing"]]
    upstream = body["upstream"]
    if upstream.get("known") is False:
        lines.append("upstream     unknown here (the lookup caches live in a server's memory: use --url)")
    elif upstream.get("configured") is False:
        lines.append("upstream     no upstream lookup configured")
    else:
        cached = ", ".join(f"{kind} → {iid}" for kind, iid in upstream.get("by_ip_cache", {}).items()) or "none"
        lines.append(f"upstream     by-IP cache: {cached}; fetched: {', '.join(upstream.get('fetched', [])) or 'none'}")
    instance = body["instance"]
    if instance is not None:
        lines.append(f"hostname     {instance['hostname'] or '-'}")
        lines.append(f"entries      {', '.join(e['entry'] for e in instance['entries']) or '-'}")
    for flavor, preview in body["previews"].items():
        shown = "-" if preview is None else preview if isinstance(preview, str) else json.dumps(preview,
                                                                                                 ensure_ascii=False)
        lines.append(f"{flavor:<12} {shown.replace(chr(10), ' ')}")
    return "\n".join(lines)
