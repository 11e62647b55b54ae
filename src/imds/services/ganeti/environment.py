"""The environment Ganeti's node daemon gives an OS script, derived from what imds holds for the instance.

Ganeti builds it in ``lib/backend.py`` (``OSCoreEnv`` and ``OSEnvironment``); imds builds
the same variables from the instance's record, served as ``/ganeti/<v>/os/environment``
so an unchanged OS definition can run inside the instance:

- from the OS record: ``OS_NAME``/``OS_VARIANT`` (``name+variant``), ``INSTANCE_OS``,
  ``OSP_<NAME>`` for every parameter served to the instance (name upper-cased, ``-`` →
  ``_``, as Ganeti does), ``DEBUG_LEVEL`` (0), ``PATH`` (Ganeti's hooks path);
- from the loaded OS definition: ``OS_API_VERSION`` (the highest version both it and
  Ganeti 3.0 support);
- from the ``ganeti`` object a Ganeti push keeps in the metadata document
  (``imds.metad.convert``): ``INSTANCE_NAME``, ``INSTANCE_UUID``, ``INSTANCE_PRIMARY_NODE``,
  ``INSTANCE_CTIME``/``_MTIME``, ``HYPERVISOR``, ``DISK_COUNT`` and ``DISK_<n>_*``,
  ``NIC_COUNT`` and ``NIC_<n>_*``, ``INSTANCE_HV_*``/``INSTANCE_BE_*``. An admin-written
  record without it gives ``INSTANCE_NAME`` from the document's ``hostname`` and
  ``INSTANCE_UUID`` from the record's id, and no disk, NIC or hypervisor variables.

``DISK_<n>_PATH`` (a node's device path) is never known here: the guest tool sets it to the
device it writes. A value holding a NUL byte (which no environment can carry) is left out.
``render`` writes one ``KEY=value`` line per variable, sorted, each value quoted as
``shlex.quote`` does, so ``set -a; . FILE`` and ``shlex.split`` read every value back exactly.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from imds.services.ganeti.definitions import OsDefinition
from imds.services.render.fields import as_object

GANETI_API_VERSIONS = frozenset({10, 15, 20})  # Ganeti 3.0's constants.OS_API_VERSIONS
HOOKS_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # Ganeti's constants.HOOKS_PATH
BLOCK_TYPES = frozenset({"blockdev", "drbd", "ext", "plain", "rbd"})  # Ganeti's DTS_BLOCK
FILE_TYPES = frozenset({"file", "gluster", "sharedfile"})  # Ganeti's DTS_FILEBASED
NETWORK_KEYS = (("name", "NAME"), ("uuid", "UUID"), ("network", "SUBNET"), ("gateway", "GATEWAY"),
                ("network6", "SUBNET6"), ("gateway6", "GATEWAY6"), ("mac_prefix", "MAC_PREFIX"))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "$" passes a trailing newline
_SCALARS = (str, int, float, bool)


def osp_name(parameter: str) -> str:
    """``OSP_`` + the parameter name upper-cased with ``-`` → ``_`` (Ganeti's ``OSCoreEnv``)."""
    return "OSP_" + parameter.upper().replace("-", "_")


def environment(
    *, instance_id: str, os_type: str, document: Mapping[str, Any] | None, definition: OsDefinition | None,
    parameters: Mapping[str, str],
) -> dict[str, str]:
    """The variables, by name. ``parameters``: name → value, as ``parameters.json`` serves them."""
    name, _, variant = os_type.partition("+")
    env: dict[str, str] = {"OS_NAME": name, "OS_VARIANT": variant, "INSTANCE_OS": os_type, "DEBUG_LEVEL": "0",
                           "PATH": HOOKS_PATH, "INSTANCE_UUID": instance_id}
    if definition is not None and (common := GANETI_API_VERSIONS.intersection(definition.api_versions)):
        env["OS_API_VERSION"] = str(max(common))
    document = document or {}
    ganeti = document.get("ganeti")
    ganeti = ganeti if isinstance(ganeti, dict) else {}
    hostname = ganeti.get("name", document.get("hostname"))
    if isinstance(hostname, str):
        env["INSTANCE_NAME"] = hostname
    _instance(env, ganeti)
    for parameter, value in parameters.items():
        env[osp_name(parameter)] = value
    return {key: value for key, value in env.items() if _NAME.fullmatch(key) and "\x00" not in value}


def _text(value: Any) -> str:
    """A value as Ganeti's ``str()`` shows it (``True``, ``1``, text as it is)."""
    return value if isinstance(value, str) else str(value)


def _copy(env: dict[str, str], source: Mapping[str, Any], keys: tuple[tuple[str, str], ...], prefix: str = "") -> None:
    """``env[prefix + variable] = source[key]`` for each scalar, non-empty value (Ganeti leaves empty ones out)."""
    for key, variable in keys:
        value = source.get(key)
        if isinstance(value, _SCALARS) and value != "":
            env[prefix + variable] = _text(value)


def _instance(env: dict[str, str], ganeti: Mapping[str, Any]) -> None:
    _copy(env, ganeti, (("primary_node", "INSTANCE_PRIMARY_NODE"), ("ctime", "INSTANCE_CTIME"),
                        ("mtime", "INSTANCE_MTIME"), ("hypervisor", "HYPERVISOR")))
    hvparams = as_object(ganeti.get("hvparams"))
    for kind, source in (("BE", as_object(ganeti.get("beparams"))), ("HV", hvparams)):
        _copy(env, source, tuple((key, f"INSTANCE_{kind}_{key}") for key in source))
    disks = ganeti.get("disks")
    if isinstance(disks, list):
        env["DISK_COUNT"] = str(len(disks))
        for index, disk in enumerate(disks):
            _disk(env, f"DISK_{index}_", {"uuid": disk} if isinstance(disk, str) else as_object(disk),
                  hvparams.get("disk_type"))
    nics = ganeti.get("nics")
    if isinstance(nics, list):
        env["NIC_COUNT"] = str(len(nics))
        for index, nic in enumerate(nics):
            _nic(env, f"NIC_{index}_", as_object(nic), hvparams.get("nic_type"))


def _disk(env: dict[str, str], prefix: str, disk: Mapping[str, Any], frontend: Any) -> None:
    """A disk: Ganeti 3.0 pushes its UUID only; a disk object (``disks_info``) gives more."""
    _copy(env, disk, (("mode", "ACCESS"), ("uuid", "UUID"), ("size", "SIZE"), ("name", "NAME")), prefix)
    if isinstance(frontend, str):
        env[prefix + "FRONTEND_TYPE"] = frontend
    dev_type, logical_id = disk.get("dev_type"), disk.get("logical_id")
    if dev_type in BLOCK_TYPES:
        env[prefix + "BACKEND_TYPE"] = "block"
    elif dev_type in FILE_TYPES and isinstance(logical_id, list) and logical_id and isinstance(logical_id[0], str):
        env[prefix + "BACKEND_TYPE"] = f"file:{logical_id[0]}"


def _nic(env: dict[str, str], prefix: str, nic: Mapping[str, Any], frontend: Any) -> None:
    _copy(env, nic, (("mac", "MAC"), ("uuid", "UUID"), ("name", "NAME"), ("ip", "IP"), ("network", "NETWORK_UUID")),
          prefix)
    params = as_object(nic.get("nicparams"))
    _copy(env, params, (("mode", "MODE"), ("link", "LINK")), prefix)
    if params.get("mode") == "bridged":
        _copy(env, params, (("link", "BRIDGE"),), prefix)
    # the network object, when the push carries it (Ganeti's Network.HooksDict)
    _copy(env, as_object(nic.get("netinfo")), NETWORK_KEYS, f"{prefix}NETWORK_")
    if isinstance(frontend, str):
        env[prefix + "FRONTEND_TYPE"] = frontend


def render(env: Mapping[str, str]) -> bytes:
    """``KEY=value`` lines, sorted by key, each value ``shlex.quote``-d; UTF-8."""
    return "".join(f"{key}={shlex.quote(env[key])}\n" for key in sorted(env)).encode()
