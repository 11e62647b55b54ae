"""Signing of EC2 instance identity documents.

The signing key is the operator's (``--identity-key``) or one generated into the data
directory (``identity-key.pem``); the certificate is ``--identity-cert`` or a self-signed
one for that key. The admin API publishes the certificate so relying parties can verify
``signature`` (RSA-SHA256) and ``pkcs7``/``rsa2048`` (PKCS#7, SHA-256). As on AWS the
PKCS#7 carries the document itself (``openssl smime -verify`` prints it; Vault-style relying
parties take the document out of it), not a detached signature.

On AWS ``pkcs7`` and ``rsa2048`` differ only in the key that signs them (a DSA key with
SHA-1, an RSA-2048 key with SHA-256), each verified with its own published certificate.
imds has one key and one certificate, so the two would be the same signature made twice:
one PKCS#7 is made and served at both paths. Each signature of a document is made when first
asked for (``pkcs7_of``, ``signature_of``: the EC2 tree holds them as ``Later`` leaves, made on
a worker thread) and kept for the next ``MEMO_DOCUMENTS`` documents: each is a private-key
operation (about half a millisecond here; OpenSSL releases the GIL for it), and the same
document is signed again when an instance is read under another version, or after its
renderings were dropped (an eviction, a notice or project change).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

from imds.errors import ConfigError
from imds.services.identity.keys import load_or_create, read

KEY_FILE = "identity-key.pem"
CERT_FILE = "identity-cert.pem"
_RSA_BITS = 2048
MEMO_DOCUMENTS = 1024  # documents whose signatures are kept (about 3 KiB each with the document)
_LINE = 64  # characters per line of a served PKCS#7, as AWS wraps it


class IdentitySigner:
    """Signs identity documents with an RSA key and publishes its certificate."""

    def __init__(self, key: rsa.RSAPrivateKey, certificate: x509.Certificate) -> None:
        self._key = key
        self.certificate = certificate
        # Each signature of a document: made once, then recalled while the document is among the last signed.
        # (Lambdas: the operation is looked up per call, so a wrapped ``pkcs7``/``signature`` is the one used.)
        memo = functools.lru_cache(maxsize=MEMO_DOCUMENTS)
        self.pkcs7_of: Callable[[bytes], str] = memo(lambda document: self.pkcs7(document))  # noqa: PLW0108
        self.signature_of: Callable[[bytes], str] = memo(lambda document: self.signature(document))  # noqa: PLW0108

    @property
    def certificate_pem(self) -> bytes:
        """The certificate relying parties verify with, PEM-encoded."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def signature(self, data: bytes) -> str:
        """Base64 RSA-SHA256 (PKCS#1 v1.5) signature of ``data``."""
        return base64.b64encode(self._key.sign(data, padding.PKCS1v15(), hashes.SHA256())).decode()

    def pkcs7(self, data: bytes) -> str:
        """Base64 DER PKCS#7 signed data holding ``data``, in 64-character lines like AWS."""
        der = (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(data)
            .add_signer(self.certificate, self._key, hashes.SHA256())
            .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])
        )
        return lines(base64.b64encode(der).decode())

    @classmethod
    def load(cls, *, key_file: Path | None, cert_file: Path | None, data_dir: Path | None) -> IdentitySigner:
        """From configured files, else from (or into) ``data_dir``, else ephemeral (in memory)."""
        if key_file is not None:
            pem = read(key_file, "identity key")
        elif data_dir is not None:
            pem = load_or_create(data_dir / KEY_FILE, _new_key_pem)
        else:
            pem = _new_key_pem()
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            msg = f"identity key {key_file or KEY_FILE}: not an unencrypted PEM private key"
            raise ConfigError(msg) from exc
        if not isinstance(key, rsa.RSAPrivateKey):
            msg = f"identity key {key_file or KEY_FILE}: must be an RSA key"
            raise ConfigError(msg)
        if cert_file is not None:
            try:
                certificate = x509.load_pem_x509_certificate(read(cert_file, "identity certificate"))
            except ValueError as exc:
                msg = f"identity certificate {cert_file}: not a PEM certificate"
                raise ConfigError(msg) from exc
            if certificate.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
                msg = f"identity certificate {cert_file} does not match the identity key"
                raise ConfigError(msg)
        elif data_dir is not None and key_file is None:
            certificate = x509.load_pem_x509_certificate(
                load_or_create(data_dir / CERT_FILE, lambda: _self_signed(key).public_bytes(serialization.Encoding.PEM))
            )
        else:
            certificate = _self_signed(key)
        return cls(key, certificate)


def lines(text: str, width: int = _LINE) -> str:
    """``text`` cut into lines of ``width`` characters: what ``textwrap.wrap`` makes of base64, 50 times faster."""
    return "\n".join(text[start:start + width] for start in range(0, len(text), width))


def _new_key_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=_RSA_BITS)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _self_signed(key: rsa.RSAPrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "imds instance identity")])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
