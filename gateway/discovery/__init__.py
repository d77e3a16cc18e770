"""Per-pod routing: a vLLM pool's ready pods, found at run time, each one replica."""

from gateway.discovery.members import Member, ReplicaDirectory

__all__ = ["Member", "ReplicaDirectory"]
