from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth.keys import KeyStore, MissingKeys
from gateway.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
ENV = ("TIERGATE_KEY_ACME", "TIERGATE_KEY_GLOBEX", "TIERGATE_KEY_INITECH")


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV, "TIERGATE_ADMIN_KEY", "TIERGATE_FINANCE_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_keys")
def test_unset_keys_refused_without_dev() -> None:
    with pytest.raises(MissingKeys) as info:
        KeyStore.from_settings(load_settings(EXAMPLE), dev=False)
    assert "TIERGATE_KEY_ACME" in info.value.env_names


@pytest.mark.usefixtures("no_keys")
def test_dev_keys_and_roles() -> None:
    store = KeyStore.from_settings(load_settings(EXAMPLE), dev=True)
    acme = store.authenticate("dev-acme")
    assert acme is not None and acme.tenant == "acme" and acme.roles == {"tenant:acme"}
    admin = store.authenticate("dev-admin")
    assert admin is not None and admin.is_admin and admin.tenant is None
    assert store.authenticate("dev-nobody") is None


def test_env_key_replaces_dev_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV, "TIERGATE_ADMIN_KEY", "TIERGATE_FINANCE_KEY"):
        monkeypatch.setenv(name, f"secret-{name.lower()}")
    store = KeyStore.from_settings(load_settings(EXAMPLE), dev=True)
    assert store.authenticate("dev-acme") is None
    principal = store.authenticate("secret-tiergate_key_acme")
    assert principal is not None and principal.tenant == "acme"
    # Only hashes are kept.
    assert all("secret" not in digest for digest in store.by_hash)
