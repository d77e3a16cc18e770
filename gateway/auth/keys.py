"""API keys: the bootstrap keys read once from the environment, and the run-time keys.

Bootstrap keys (named by ``key_env`` in the config) are kept only as HMAC-SHA256 hashes under a
per-process random pepper: they never leave the process, so no shared secret is needed, and
the plain key is dropped as soon as it is hashed. A slow password hash would cost milliseconds
per request without adding strength to random tokens. Run-time keys (``tgk_…``, created
through the admin API or CLI) live in SQL as salted SHA-256 hashes (``gateway.auth.tokens``)
and are checked against this process's in-memory copy (``gateway.auth.runtime``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gateway.auth.principals import Principal
from gateway.settings import Settings, read_secret

if TYPE_CHECKING:
    from gateway.auth.runtime import RuntimeAuth

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
    """Maps key hashes to principals; run-time keys go to ``runtime`` when there is one."""

    pepper: bytes
    by_hash: Mapping[str, Principal]
    runtime: RuntimeAuth | None = None

    def authenticate(self, key: str) -> Principal | None:
        found = self.by_hash.get(hash_key(key, pepper=self.pepper))
        if found is None and self.runtime is not None:
            found = self.runtime.authenticate(key)
        return found

    def with_runtime(self, runtime: RuntimeAuth) -> KeyStore:
        return replace(self, runtime=runtime)

    def __repr__(self) -> str:
        return f"KeyStore({len(self.by_hash)} bootstrap keys, runtime={self.runtime is not None})"

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
