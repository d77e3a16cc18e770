"""Everything one simulator app holds, stored on the app under ``SIM_STATE``."""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from backends.sim.engine import SimEngine
from backends.sim.faults import FaultSwitch
from backends.sim.metrics import SimMetrics
from backends.sim.profiles import SimProfile
from backends.sim.usage_log import UsageLog

__all__ = ["SIM_STATE", "SimState"]


@dataclass(slots=True)
class SimState:
    profile: SimProfile
    time_scale: float
    """Multiplier for every modelled latency (0 = answer at once)."""
    engine: SimEngine
    metrics: SimMetrics
    registry: CollectorRegistry
    faults: FaultSwitch
    rng: random.Random
    """Draws for ``error_rate``; seeded, owned by the app."""
    usage: UsageLog
    ttft_override_s: float | None = None
    """Fixed wall-clock time to first token (``--ttft-ms``): replaces the latency model and is
    not multiplied by ``time_scale`` nor slowed by load."""
    itl_override_s: float | None = None
    """Fixed wall-clock inter-token latency (``--itl-ms``), like ``ttft_override_s``."""

    def ttft_s(self, prompt_tokens: int) -> float:
        """Wall-clock time to first token: the override, else the engine's model x time_scale."""
        if self.ttft_override_s is not None:
            return self.ttft_override_s
        return self.engine.ttft_s(prompt_tokens) * self.time_scale

    def itl_s(self) -> float:
        """Wall-clock inter-token latency: the override, else the engine's model x time_scale."""
        if self.itl_override_s is not None:
            return self.itl_override_s
        return self.engine.itl_s() * self.time_scale


SIM_STATE = web.AppKey("tiergate_sim_state", SimState)
