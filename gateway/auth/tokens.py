"""Run-time API keys: their format, and the salted hash that is all SQL ever holds.

A key looks like ``tgk_<key id>_<secret>``: the key id (12 hex digits) is public — it names the
key in listings, the CLI and the admin API — and the secret is 256 random bits. SQL keeps
``sha256(salt ‖ key)`` with a random per-key salt. A slow password hash would add nothing to
a 256-bit random secret (it cannot be guessed at any speed) while costing milliseconds per
request; a server-wide HMAC secret would be one more secret to distribute to every gateway
process and to rotate, and losing it would invalidate every key. The salt makes equal inputs
hash differently and rules out precomputation; the key id gives a direct lookup, so checking a
key is one dictionary access and one SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

__all__ = ["KEY_PREFIX", "NewKey", "digest", "key_id_of", "matches", "new_key"]

KEY_PREFIX = "tgk_"
_SHAPE = re.compile(r"tgk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    key: str
    """The plain key: shown once to whoever created it, never stored."""
    salt: str
    digest: str

    def __repr__(self) -> str:  # never print the secret by accident
        return f"NewKey(key_id={self.key_id!r})"


def digest(key: str, salt: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + key.encode("utf-8")).hexdigest()


def new_key() -> NewKey:
    key_id = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    salt = secrets.token_hex(16)
    return NewKey(key_id=key_id, key=key, salt=salt, digest=digest(key, salt))


def key_id_of(key: str) -> str | None:
    """The key id of a well-formed run-time key, else ``None``."""
    found = _SHAPE.fullmatch(key)
    return found.group(1) if found else None


def matches(key: str, salt: str, expected: str) -> bool:
    return hmac.compare_digest(digest(key, salt), expected)
