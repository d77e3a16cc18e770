from __future__ import annotations

from gateway.auth.tokens import digest, key_id_of, matches, new_key


def test_new_keys_are_unique_well_formed_and_salted() -> None:
    a, b = new_key(), new_key()
    assert a.key != b.key and a.salt != b.salt and a.key_id != b.key_id
    assert key_id_of(a.key) == a.key_id
    assert matches(a.key, a.salt, a.digest)
    assert not matches(b.key, a.salt, a.digest)
    # the same key under another salt hashes differently
    assert digest(a.key, b.salt) != a.digest
    assert a.key not in repr(a)


def test_malformed_keys_have_no_id() -> None:
    good = new_key().key
    for bad in ("", "tgk_", good[:-1], good + "x", good.replace("tgk_", "tgx_"), "dev-acme"):
        assert key_id_of(bad) is None
