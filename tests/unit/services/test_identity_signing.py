"""Identity document signatures: each made once per document, while the document is among the last signed."""

from __future__ import annotations

import base64
import os
import textwrap

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
    """Signing the same document again makes no new signature: the same text comes back, each kind on its own."""
    fresh = IdentitySigner(signer._key, signer.certificate)  # the same key, an empty memo
    made = count_signing(fresh)
    document = b'{"instanceId": "i-once"}'
    first = fresh.pkcs7_of(document)
    assert made == ["pkcs7"]  # the signature is not made until asked for
    assert fresh.pkcs7_of(document) is first
    assert fresh.pkcs7_of(bytes(document)) is first  # equal bytes, another object: the same document
    signature = fresh.signature_of(document)
    assert fresh.signature_of(document) is signature
    assert made == ["pkcs7", "signature"]
    assert fresh.pkcs7_of(b'{"instanceId": "i-other"}') != first
    assert made == ["pkcs7", "signature", "pkcs7"]


def test_the_signatures_verify_for_their_document(signer):
    """``signature`` is RSA-SHA256 over the document with the published certificate's key."""
    document = b'{"instanceId": "i-verified"}'
    public_key = signer.certificate.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    public_key.verify(base64.b64decode(signer.signature_of(document)), document, padding.PKCS1v15(), hashes.SHA256())
    assert all(len(line) <= 64 for line in signer.pkcs7_of(document).split("\n"))


@pytest.mark.parametrize("size", [0, 1, 47, 48, 49, 96, 1500, 1501])
def test_lines_wrap_base64_as_textwrap_does(size):
    """The PKCS#7's 64-character lines, cut by slicing, are the lines ``textwrap.wrap`` made before."""
    text = base64.b64encode(os.urandom(size)).decode()
    assert signing.lines(text) == "\n".join(textwrap.wrap(text, 64))


def test_the_memo_keeps_the_last_documents_signed(signer, monkeypatch):
    """Past ``MEMO_DOCUMENTS`` the least recently signed document is forgotten (and signed again if asked)."""
    monkeypatch.setattr(signing, "MEMO_DOCUMENTS", 2)
    fresh = IdentitySigner(signer._key, signer.certificate)  # the same key, an empty memo
    made = count_signing(fresh)
    one, two, three = b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'
    kept_one = fresh.pkcs7_of(one)
    fresh.pkcs7_of(two)
    assert fresh.pkcs7_of(one) is kept_one  # one is now the most recent: two goes first
    fresh.pkcs7_of(three)
    assert len(made) == 3
    assert fresh.pkcs7_of(one) is kept_one
    fresh.pkcs7_of(two)  # forgotten: signed again
    assert len(made) == 4
