"""Where secret OS parameters and package credentials live: this process's memory, nowhere else.

A ``Secret`` wraps one value and never shows it (``repr``, ``str``, f-strings, pickling
and logging all see ``<secret>``); only ``reveal()`` returns it, and only the code that
serves the instance's own ``parameters.json`` or fetches its package calls that.

The ``SecretVault`` keeps, per instance, the secrets of the write that carried them,
under that write's ``generation``. A read asks for the generation the stored record has
now: a replica that did not receive the write (another replica did), or that restarted
since, holds nothing for it, so it serves the parameter as absent and reports it
``lost``. A full-replacement write that omits a secret drops it. When the catalog drops
the record (the instance or its OS record deleted, on this replica or another, or a newer
write replaced it), ``forget`` removes what was held for that generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

HELD, LOST = "held", "lost"


class Secret:
    """A value that must not leave memory except to its instance."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value itself: call only where it is served to its instance."""
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __format__(self, _spec: str) -> str:
        return "<secret>"

    def __reduce__(self) -> NoReturn:
        msg = "a Secret cannot be pickled"
        raise TypeError(msg)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", len(self._value)))


@dataclass(frozen=True)
class PackageAuth:
    """HTTP basic credentials for the personalization package."""

    username: Secret
    password: Secret


@dataclass(frozen=True)
class Held:
    """The secrets of one write: ``values`` by (section, name); section is parameters or install_parameters."""

    generation: str
    values: dict[tuple[str, str], Secret] = field(default_factory=dict)
    package_auth: PackageAuth | None = None


class SecretVault:
    """Secrets by instance id, each under the generation of the write that carried them."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}

    def __repr__(self) -> str:
        return f"SecretVault(instances={len(self._held)})"

    def keep(self, instance_id: str, held: Held) -> Held | None:
        """Hold ``held`` for the instance; returns what was held before (to restore on failure)."""
        previous = self._held.get(instance_id)
        self._held[instance_id] = held
        return previous

    def restore(self, instance_id: str, previous: Held | None) -> None:
        """Put back what ``keep`` replaced (the write it belonged to did not happen)."""
        if previous is None:
            self._held.pop(instance_id, None)
        else:
            self._held[instance_id] = previous

    def drop(self, instance_id: str) -> None:
        """Forget every secret of the instance."""
        self._held.pop(instance_id, None)

    def forget(self, instance_id: str, generation: str) -> None:
        """Forget the instance's secrets if they belong to ``generation`` (that record is gone)."""
        held = self._held.get(instance_id)
        if held is not None and held.generation == generation:
            del self._held[instance_id]

    def holds(self, instance_id: str) -> bool:
        """Whether any secret of the instance is in memory (of whichever generation)."""
        held = self._held.get(instance_id)
        return held is not None and (bool(held.values) or held.package_auth is not None)

    def current(self, instance_id: str, generation: str) -> Held | None:
        """The secrets held for this generation of the instance's record, or None."""
        held = self._held.get(instance_id)
        return held if held is not None and held.generation == generation else None
