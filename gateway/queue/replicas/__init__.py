"""The replicas of each deployment: backends, slot leases shared through Redis, live load,
conversation affinity, the ejection of a replica that keeps failing."""
