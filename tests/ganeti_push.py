"""Run by Debian's /usr/bin/python3 (never imported by pytest): Ganeti's node daemon pushing one instance.

Reads ``{"instance": {...}, "nics": [...], "private": {...}, "secret": {...}}`` on stdin, builds
``objects.Instance`` and its ``objects.NIC``s, and does what ``UpdateMetadata`` and the node
daemon's ``ModifyInstanceMetadata`` do: ``ToDict()`` plus the private and secret OS parameters
(as ``PrivateDict``s), sent with ``ganeti.metad.Client().UpdateConfig``. The socket is Ganeti's
own path under ``GANETI_ROOTDIR`` (with ``GANETI_HOSTNAME``, its last component). Prints the
JSON of ``{"echo": …, "result": …}``, or ``{"error": class, "message": …}`` when the call fails.
"""

from __future__ import annotations

import json
import sys

from ganeti import errors, metad, objects, serializer


def main() -> None:
    """Push the instance on stdin and print what the daemon answered."""
    spec = json.load(sys.stdin)
    nics = [objects.NIC(nicparams={}, **nic) for nic in spec["nics"]]
    instance = objects.Instance(nics=nics, disks=[], hvparams={}, beparams={}, tags=set(), serial_no=1,
                                ctime=0, mtime=0, disks_active=False, **spec["instance"])
    data = instance.ToDict()
    data["osparams_private"] = serializer.PrivateDict(spec.get("private", {}))
    data["osparams_secret"] = serializer.PrivateDict(spec.get("secret", {}))
    try:
        client = metad.Client()
        answer = {"echo": client.Echo("ping"), "result": client.UpdateConfig(data)}
    except errors.GenericError as exc:
        answer = {"error": type(exc).__name__, "message": str(exc.args[0])}
    print(json.dumps(answer))  # noqa: T201 - the test reads this line


if __name__ == "__main__":
    main()
