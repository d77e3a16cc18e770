"""A worker's side of the queue: take jobs, run each against the plan's deployments, relay the
replies, book the ledger entry."""
