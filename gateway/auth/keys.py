"""API keys: read once from the environment, kept only as hashes.

Keys are random, high-entropy tokens, so a keyed SHA-256 (HMAC) is the right hash: a slow
password hash would cost milliseconds per request without adding strength. The HMAC key is
per process; the plain key is dropped as soon as it is hashed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.auth.principals import Principal
from gateway.settings import Settings, read_secret

__all__ = ["KeyStore", "MissingKeys", "hash_key"]


def hash_key(key: str, *, pepper: bytes) -> str:
    return hmac.new(pepper, key.encode("utf-8"), hashlib.sha256).hexdigest()


class MissingKeys(Exception):
    """Some principals have no key in their environment variable (and dev keys are not allowed)."""

    def __init__(self, env_names: Iterable[str]) -> None:
        self.env_names = tuple(env_names)
        super().__init__(
            "no key set in "
            + ", ".join(self.env_names)
            + " (set them, or run with --dev to use the documented development keys)"
        )


@dataclass(frozen=True, slots=True)
class KeyStore:
    """Maps key hashes to principals."""

    pepper: bytes
    by_hash: Mapping[str, Principal]

    def authenticate(self, key: str) -> Principal | None:
        return self.by_hash.get(hash_key(key, pepper=self.pepper))

    @classmethod
    def from_settings(cls, settings: Settings, *, dev: bool) -> KeyStore:
        """Read every key variable named in the config. With ``dev``, an unset variable falls
        back to that principal's documented development key; without it, unset keys are an error."""
        pepper = secrets.token_bytes(32)
        entries: list[tuple[str, str | None, Principal]] = [
            (t.key_env, t.dev_key, Principal(name, frozenset({f"tenant:{name}"})))
            for name, t in settings.tenants.items()
        ]
        entries += [
            (p.key_env, p.dev_key, Principal(p.name, frozenset(p.roles)))
            for p in settings.principals
        ]
        by_hash: dict[str, Principal] = {}
        missing: list[str] = []
        for env_name, dev_key, principal in entries:
            key = read_secret(env_name) or (dev_key if dev else None)
            if key is None:
                missing.append(env_name)
                continue
            by_hash[hash_key(key, pepper=pepper)] = principal
        if missing:
            raise MissingKeys(missing)
        return cls(pepper=pepper, by_hash=by_hash)
