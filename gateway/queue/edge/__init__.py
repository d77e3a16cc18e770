"""The edge's side of the queue: admit a job, queue it, wait for its replies, and answer at its
deadline or when its worker is gone."""
