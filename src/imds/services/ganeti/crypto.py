"""Private OS parameters at rest: Fernet (AES-128-CBC + HMAC-SHA256) with key rotation.

``--private-key-file`` names a file of Fernet keys, one per line (``#`` comments and
blank lines ignored). The first key encrypts; every key decrypts (``MultiFernet``). To
rotate: put a new key first, restart the replicas, re-send the OS records (or leave the
old key listed until they have been re-sent), then remove the old key. Without the file,
private values are stored as they came (still never logged or returned by the admin API).
Generate a key with ``python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"``.

Once the catalog is loaded, ``PrivateCipher.audit`` looks at every stored private value
once: values stored in clear are a warning at start (``os.private_unencrypted``), values
no configured key opens (a restart without the key that encrypted them) are a ``/readyz``
problem (``problem``) until their records are re-sent or deleted, or the key is listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from imds import log
from imds.errors import ConfigError
from imds.models import PRIVATE, OsRecord

_log = log.get("os")


class PrivateCipher:
    """Encrypts private values when keys are configured; passes them through otherwise."""

    def __init__(self, keys: list[bytes]) -> None:
        self._fernet = MultiFernet([Fernet(k) for k in keys]) if keys else None
        self.unreadable: set[str] = set()  # instances whose stored private values no key opens (``audit``)

    def __repr__(self) -> str:
        return f"PrivateCipher(enabled={self.enabled})"

    @classmethod
    def from_file(cls, path: Path | None) -> PrivateCipher:
        """The cipher for the key file, or a pass-through one when ``path`` is None."""
        if path is None:
            return cls([])
        where = f"--private-key-file / IMDS_PRIVATE_KEY_FILE: {path}"
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"{where}: cannot read: {type(exc).__name__}"
            raise ConfigError(msg) from exc
        keys = [line.strip().encode() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            msg = f"{where}: no keys (one Fernet key per line)"
            raise ConfigError(msg)
        for number, key in enumerate(keys, 1):
            try:
                Fernet(key)
            except ValueError as exc:
                msg = f"{where}: key {number} is not a Fernet key (32 url-safe base64-encoded bytes)"
                raise ConfigError(msg) from exc
        return cls(keys)

    @property
    def enabled(self) -> bool:
        """Whether private values are encrypted at rest."""
        return self._fernet is not None

    def seal(self, value: str) -> tuple[str, bool]:
        """(what to store, whether it is encrypted)."""
        if self._fernet is None:
            return value, False
        return self._fernet.encrypt(value.encode()).decode("ascii"), True

    def open(self, stored: str, *, encrypted: bool) -> str | None:
        """The clear value; None when no configured key opens it (or encryption is off)."""
        if not encrypted:
            return stored
        if self._fernet is None:
            return None
        try:
            return self._fernet.decrypt(stored.encode("ascii")).decode()
        except (InvalidToken, UnicodeError):
            return None

    def audit(self, records: Iterable[tuple[str, OsRecord]]) -> None:
        """Look at every stored private value once (at start): warn about clear ones, note unreadable ones.

        ``records``: (instance id, its OS record) for every instance that has one. Fills
        ``unreadable`` (reported by ``problem``) and logs ``os.private_unencrypted`` as a
        warning when some values are stored in clear (written without ``--private-key-file``).
        """
        clear: set[str] = set()
        unreadable: set[str] = set()
        for instance_id, record in records:
            for params in (record.parameters, record.install_parameters):
                for param in params.values():
                    if param.visibility != PRIVATE or param.value is None:
                        continue
                    if not param.encrypted:
                        clear.add(instance_id)
                    elif self.open(param.value, encrypted=True) is None:
                        unreadable.add(instance_id)
        self.unreadable = unreadable
        if clear:
            _log.warning("os.private_unencrypted", instances=len(clear), key_file=self.enabled,
                         hint="private OS parameters are stored in clear: set --private-key-file and re-send "
                              "those OS records to encrypt them")
        if unreadable:
            _log.error("os.private_unreadable", instances=len(unreadable),
                       hint="no key in --private-key-file opens them: list the key that encrypted them")

    def forget(self, instance_id: str) -> None:
        """The instance's OS record was replaced or deleted: what was unreadable in it is gone."""
        self.unreadable.discard(instance_id)

    def problem(self) -> str | None:
        """The ``/readyz`` problem while stored private values cannot be decrypted, else None."""
        count = len(self.unreadable)
        if not count:
            return None
        held = f"{count} instance{'s' if count != 1 else ''}"
        return (f"private OS parameters of {held} cannot be decrypted (they are not served): list the key that "
                "encrypted them in --private-key-file and restart, or re-send those OS records")
