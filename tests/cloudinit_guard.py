"""Code the real-client scripts run first inside the system python that drives cloud-init.

Every connection leaves from the guest's loopback source address (``cfg["source"]``) and
only to the test server on 127.0.0.1: nothing can reach the real 169.254.169.254.
"""

GUEST_GUARD = r"""
# Every connection leaves from the guest's loopback address, and only to the test server.
import urllib3.util.connection as _connection
_create = _connection.create_connection
def _from_guest(address, *args, **kwargs):
    if address[0] != "127.0.0.1":
        raise OSError(f"test guard: refusing to connect to {address[0]}")
    kwargs["source_address"] = (cfg["source"], 0)
    return _create(address, *args, **kwargs)
_connection.create_connection = _from_guest
"""
