"""COMMLIB_SECRET: the job's shared secret, the keys derived from it, and signed store values.

The launcher gives every rank the same secret in the environment (README, "Security"); it never
travels through the store or over a connection. From it each use derives its own key, so a key
leaked from one use (say, a value signed for the store) says nothing about another (the TCP
handshake, in C++):

    key(purpose) = HMAC-SHA256(key=secret, msg=b"commlib/v1/" + purpose)

Purposes in use: ``"store"`` (this module) and ``"tcp-handshake"`` (the TCP transport). A signed
store value is ``b"CLS1" + tag + value`` with ``tag = HMAC-SHA256(key("store"), len(key) as 4
bytes big-endian + key + value)``: binding the key name means a value cannot be replayed under
another key. docs/security.md describes the trust model.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Optional

from commlib import settings
from commlib.errors import RendezvousError

ENV = "COMMLIB_SECRET"
MIN_SECRET_BYTES = 16
_MAGIC = b"CLS1"
_TAG_BYTES = 32


def load_secret(environ=None) -> Optional[bytes]:
    """The job secret from COMMLIB_SECRET as bytes, or None when unset or empty.

    A secret shorter than 16 bytes is refused (ValueError naming the variable): it could be guessed.
    """
    value = settings.get(ENV) if environ is None else environ.get(ENV, "")
    if not value:
        return None
    raw = value.encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"{ENV}: must be at least {MIN_SECRET_BYTES} bytes (got {len(raw)}); "
                         "generate one with `python -c 'import secrets; print(secrets.token_hex(32))'`")
    return raw


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The 32-byte key for ``purpose`` (e.g. "store", "tcp-handshake") derived from ``secret``."""
    if not purpose or not purpose.isascii():
        raise ValueError(f"purpose: expected a non-empty ASCII name, got {purpose!r}")
    return hmac.new(secret, b"commlib/v1/" + purpose.encode(), hashlib.sha256).digest()


def handshake_key(environ=None) -> Optional[bytes]:
    """The key the TCP transport's connection handshake uses (None without COMMLIB_SECRET).

    Python reads the environment once and hands these 32 bytes to the C++ transport, so secret
    handling and key derivation live in one place.
    """
    secret = load_secret(environ)
    return None if secret is None else derive_key(secret, "tcp-handshake")


def store_key(environ=None) -> Optional[bytes]:
    """The key signing store values (None without COMMLIB_SECRET); the store server refuses
    writes not signed with it."""
    secret = load_secret(environ)
    return None if secret is None else derive_key(secret, "store")


def _tag(key: bytes, name: bytes, value: bytes) -> bytes:
    return hmac.new(key, struct.pack("!I", len(name)) + name + value, hashlib.sha256).digest()


def sign_value(key: bytes, name: bytes, value: bytes) -> bytes:
    """``value`` as stored under ``name``, with its tag."""
    return _MAGIC + _tag(key, name, value) + value


def signature_ok(key: bytes, name: bytes, stored: bytes) -> bool:
    """Whether ``stored`` is a value signed with ``key`` for ``name`` (the store server's check)."""
    head = len(_MAGIC) + _TAG_BYTES
    if stored[:len(_MAGIC)] != _MAGIC or len(stored) < head:
        return False
    return hmac.compare_digest(stored[len(_MAGIC):head], _tag(key, name, stored[head:]))


def verify_value(key: bytes, name: bytes, stored: bytes) -> bytes:
    """The value inside ``stored`` if its tag is right for ``name``; else RendezvousError."""
    if stored[:len(_MAGIC)] != _MAGIC or len(stored) < len(_MAGIC) + _TAG_BYTES:
        raise RendezvousError(f"store key {name.decode(errors='replace')!r}: value is not signed "
                              f"(COMMLIB_SECRET is set here; was it set on every rank, and did "
                              f"something else write this key?)")
    tag = stored[len(_MAGIC):len(_MAGIC) + _TAG_BYTES]
    value = stored[len(_MAGIC) + _TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, name, value)):
        raise RendezvousError(f"store key {name.decode(errors='replace')!r}: bad signature (a rank "
                              "with a different COMMLIB_SECRET, or a forged value)")
    return value


def _as_bytes(x) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


class SignedStore:
    """Wraps a store (commlib's or torch's) so every value set is signed and every value read is
    verified. Only ``set``/``get``/``check`` are used by the rendezvous; counters (``add``) cannot
    carry a signature and are refused rather than passed through unsigned.
    """

    def __init__(self, store, key: bytes):
        self.inner = store
        self._key = key

    def set(self, name, value):
        n = _as_bytes(name)
        self.inner.set(name, sign_value(self._key, n, _as_bytes(value)))

    def get(self, name) -> bytes:
        return verify_value(self._key, _as_bytes(name), _as_bytes(self.inner.get(name)))

    def check(self, names) -> bool:
        return self.inner.check(names)

    def add(self, name, delta):
        raise RendezvousError(f"store key {name!r}: counters cannot be signed; with {ENV} set, "
                              "commlib does not use them")

    def close(self):
        if hasattr(self.inner, "close"):
            self.inner.close()


def secured(store, environ=None):
    """``store`` wrapped in a SignedStore when COMMLIB_SECRET is set (idempotent), else as is."""
    if isinstance(store, SignedStore):
        return store
    secret = load_secret(environ)
    if secret is None:
        return store
    return SignedStore(store, derive_key(secret, "store"))
