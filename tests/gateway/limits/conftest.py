"""The queue tests' fixtures (real Redis client, simulator replicas), shared with the limits."""

from tests.gateway.queue.conftest import redis_conn, start_sim

__all__ = ["redis_conn", "start_sim"]
