"""A vLLM-compatible simulator of the model tiers, served over real HTTP (aiohttp).

``create_sim_app(profile)`` builds the app; ``run_sim(name, port=...)`` serves one profile until
SIGTERM. See ``server`` for the routes, ``profiles`` for the latency figures, ``faults`` for fault
injection, ``tokens`` for the token-counting rule and ``answers`` for the deterministic output.
"""

from backends.sim.profiles import PROFILES, SimProfile
from backends.sim.server import create_sim_app, run_sim

__all__ = ["PROFILES", "SimProfile", "create_sim_app", "run_sim"]
