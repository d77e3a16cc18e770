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


SIM_STATE = web.AppKey("tiergate_sim_state", SimState)
