"""Identity document signatures: one PKCS#7 per document, made once while the document is among the last signed."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from helpers import count_signing
from imds.services.identity import document as signing
from imds.services.identity.document import IdentitySigner


@pytest.fixture(scope="module")
def signer() -> IdentitySigner:
    """An ephemeral signer (key generated in memory)."""
    return IdentitySigner.load(key_file=None, cert_file=None, data_dir=None)


def test_a_document_is_signed_once_and_recalled_after(signer):
    """Signing the same document again makes no new signature: the same ``Signed`` comes back."""
    fresh = IdentitySigner(signer._key, signer.certificate)  # the same key, an empty memo
    made = count_signing(fresh)
    document = b'{"instanceId": "i-once"}'
    first = fresh.sign(document)
    assert made == ["pkcs7", "signature"]
    assert fresh.sign(document) is first
    assert fresh.sign(bytes(document)) is first  # equal bytes, another object: the same document
    assert made == ["pkcs7", "signature"]
    other = fresh.sign(b'{"instanceId": "i-other"}')
    assert other.pkcs7 != first.pkcs7
    assert made == ["pkcs7", "signature"] * 2


def test_the_signatures_verify_for_their_document(signer):
    """``signature`` is RSA-SHA256 over the document with the published certificate's key."""
    document = b'{"instanceId": "i-verified"}'
    signed = signer.sign(document)
    public_key = signer.certificate.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    public_key.verify(base64.b64decode(signed.signature), document, padding.PKCS1v15(), hashes.SHA256())
    assert all(len(line) <= 64 for line in signed.pkcs7.split("\n"))


def test_the_memo_keeps_the_last_documents_signed(signer, monkeypatch):
    """Past ``MEMO_DOCUMENTS`` the least recently signed document is forgotten (and signed again if asked)."""
    monkeypatch.setattr(signing, "MEMO_DOCUMENTS", 2)
    fresh = IdentitySigner(signer._key, signer.certificate)  # the same key, an empty memo
    made = count_signing(fresh)
    one, two, three = b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'
    kept_one = fresh.sign(one)
    fresh.sign(two)
    assert fresh.sign(one) is kept_one  # one is now the most recent: two goes first
    fresh.sign(three)
    assert len(made) == 6
    assert fresh.sign(one) is kept_one
    fresh.sign(two)  # forgotten: signed again
    assert len(made) == 8
