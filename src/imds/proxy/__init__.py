"""``imds proxy``: a per-host proxy that names the calling VM to ``imds serve``, signed.

It sits where a VM's metadata requests arrive on the host (169.254.169.254 inside a tenant
network namespace, or behind OVS flows), identifies the VM from something the VM cannot
forge, and forwards the request to ``imds serve`` with ``X-Instance-ID``, ``X-Tenant-ID``,
``X-Instance-ID-Timestamp``, ``X-Instance-ID-Signature`` and ``X-Forwarded-For`` set (``imds.signing``).

- ``identify``: the pluggable identification protocol (``Identifier``) and its result.
- ``mapfile``: ``--map FILE``, source IP → instance (and tenant), reloaded on SIGHUP or change.
- ``forward``: the raw ASGI app that forwards over a keep-alive pool and streams answers back.
"""
