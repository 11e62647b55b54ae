"""Ganeti's metadata daemon protocol: imds in place of ``ganeti-metad`` on a Ganeti node.

``luxi`` serves ``--ganeti-metad-socket`` (Luxi framing), ``methods`` carries out ``echo``
and ``updateConfig`` through the admin services, ``convert`` turns Ganeti's instance into
the admin writes. Beside ``web/``: it calls services, never the reverse.
"""
