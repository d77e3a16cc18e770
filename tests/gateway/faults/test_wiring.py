"""Each fault-handling config is read from its settings model field by field, by name: the
dataclass's fields are all settings, their defaults agree, and every field is carried."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

import pytest
from pydantic import BaseModel

from gateway.faults.breaker import BreakerConfig
from gateway.faults.policy import RetryPolicy
from gateway.faults.wiring import configured
from gateway.settings import BreakerSettings, RetrySettings

PAIRS: list[tuple[type[Any], type[BaseModel], dict[str, Any]]] = [
    (RetryPolicy, RetrySettings, {"retry_on": ("timeout",)}),
    (BreakerConfig, BreakerSettings, {"failure_ratio": 0.75}),
]
"""(dataclass, its settings, other values than the defaults where ``2 x default + 1`` is not one)"""


def _same(a: Any, b: Any) -> bool:
    return set(a) == set(b) if isinstance(a, (tuple, frozenset)) else bool(a == b)


@pytest.mark.parametrize(("config", "model", "_"), PAIRS, ids=lambda p: getattr(p, "__name__", ""))
def test_every_field_is_a_setting_with_the_same_default(
    config: type[Any], model: type[BaseModel], _: dict[str, Any]
) -> None:
    defaults = model()
    for f in fields(config):
        assert f.name in model.model_fields, f"{config.__name__}.{f.name} is not a setting"
        assert f.default is not MISSING, f"{config.__name__}.{f.name} has no default"
        assert _same(f.default, getattr(defaults, f.name)), f"{f.name}: defaults disagree"


@pytest.mark.parametrize(
    ("config", "model", "changed"), PAIRS, ids=lambda p: getattr(p, "__name__", "")
)
def test_configured_carries_every_setting(
    config: type[Any], model: type[BaseModel], changed: dict[str, Any]
) -> None:
    defaults = model()
    values = {
        f.name: changed[f.name] if f.name in changed else getattr(defaults, f.name) * 2 + 1
        for f in fields(config)
    }
    settings = model.model_validate(values)
    overrides = {"retry_on": frozenset(values["retry_on"])} if "retry_on" in values else {}
    built = configured(config, settings, **overrides)
    for f in fields(config):
        assert _same(getattr(built, f.name), values[f.name]), f.name


def test_a_field_the_settings_lack_fails_at_start() -> None:
    @dataclass(frozen=True)
    class Wider:
        window_s: float = 10.0
        not_a_setting: int = 0

    with pytest.raises(AttributeError, match="not_a_setting"):
        configured(Wider, BreakerSettings())
