"""What a drive holds: ``Instance`` → ``{path: bytes}``, from the same renderers HTTP serves.

A config drive (label ``config-2``, Nova's layout) holds, for every OpenStack version and
``latest``, each file ``/openstack/<version>/`` lists except ``password`` (a read-only
drive cannot take one; Nova leaves it off too), and ``ec2/2009-04-04/`` and
``ec2/latest/`` with ``meta-data.json`` (the EC2 meta-data tree as nested JSON, as Nova's
drive has it) and ``user-data``. Each ``meta_data.json`` gets its own random seed.

A NoCloud seed (label ``cidata``) holds the ``/nocloud/`` files at its root.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

from imds.errors import RecordNotFound
from imds.models import METADATA, Instance, JsonObject
from imds.services.render.ec2 import HOLLOW_VERSION, aws_meta_data, hollow_meta_data
from imds.services.render.json import encode
from imds.services.render.nocloud import nocloud_tree
from imds.services.render.openstack import PASSWORD, VERSIONS, SeededJson, version_dir
from imds.services.render.seeds import SEED_BYTES
from imds.services.render.tree import Dir, body, walk

Format = Literal["config-2", "nocloud"]
CONFIG_2: Format = "config-2"
NOCLOUD: Format = "nocloud"
FORMATS: tuple[Format, ...] = (CONFIG_2, NOCLOUD)
LABELS: dict[Format, str] = {CONFIG_2: "config-2", NOCLOUD: "cidata"}
EC2_VERSIONS = (HOLLOW_VERSION, "latest")


def _random_seed() -> bytes:
    return os.urandom(SEED_BYTES)


def nested(tree: Dir) -> JsonObject:
    """A tree as nested JSON: leaves as text, subtrees as objects (listing labels dropped)."""
    return {
        key: nested(child) if isinstance(child, Dir) else body(child).decode("utf-8", "replace")
        for key, child in tree.items()
    }


def config_drive(instance: Instance, *, seed: Callable[[], bytes] = _random_seed) -> dict[str, bytes]:
    """The files of an OpenStack config drive; RecordNotFound when the instance has no metadata."""
    if instance.metadata is None:
        raise RecordNotFound(METADATA, instance.id)
    files: dict[str, bytes] = {}
    for version in VERSIONS:
        for path, node in walk(version_dir(instance, version)):
            if path == PASSWORD or isinstance(node, Dir):
                continue
            data = node.with_seed(seed()) if isinstance(node, SeededJson) else body(node)
            files[f"openstack/{version}/{path}"] = data
    trees = {
        HOLLOW_VERSION: hollow_meta_data(instance.metadata, instance.id),
        "latest": aws_meta_data(instance.metadata, instance.id),
    }
    for version in EC2_VERSIONS:
        files[f"ec2/{version}/meta-data.json"] = encode(nested(trees[version]))
        if instance.userdata is not None:
            files[f"ec2/{version}/user-data"] = instance.userdata
    return files


def nocloud_seed(instance: Instance) -> dict[str, bytes]:
    """The files of a NoCloud ``cidata`` seed."""
    return {path: body(node) for path, node in walk(nocloud_tree(instance)) if not isinstance(node, Dir)}


def layout(instance: Instance, fmt: Format) -> dict[str, bytes]:
    """The files of a drive of format ``fmt``."""
    return config_drive(instance) if fmt == CONFIG_2 else nocloud_seed(instance)
