"""Private OS parameters at rest: Fernet (AES-128-CBC + HMAC-SHA256) with key rotation.

``--private-key-file`` names a file of Fernet keys, one per line (``#`` comments and
blank lines ignored). The first key encrypts; every key decrypts (``MultiFernet``). To
rotate: put a new key first, restart the replicas, re-send the OS records (or leave the
old key listed until they have been re-sent), then remove the old key. Without the file,
private values are stored as they came (still never logged or returned by the admin API).
Generate a key with ``python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"``.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from imds.errors import ConfigError


class PrivateCipher:
    """Encrypts private values when keys are configured; passes them through otherwise."""

    def __init__(self, keys: list[bytes]) -> None:
        self._fernet = MultiFernet([Fernet(k) for k in keys]) if keys else None

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
