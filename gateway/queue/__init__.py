"""The Redis queue between the edge that admits a request and the worker that runs it.

A request becomes a ``Job`` (``jobs``) on its tier's queue; a worker takes it, calls the plan's
deployments and sends ``Reply`` events back; the edge relays them to its client. Where to look:

=============== ============================================================================
``edge/``       the edge's side: queue a job, wait for its replies, answer at the deadline or
                when its worker is gone (``dispatcher``, ``claiming``, ``replies``,
                ``deadline``)
``running/``    the worker's side: per tier, hold a slot, then take a job (``taking``); run
                jobs, hand them back on a stop (``worker``); call the deployments
                (``executor``, ``attempts``, ``caller``, ``stream_relay``), send the replies
                (``replying``), book the ledger entry before answering (``finish``), keep
                each tier's typical job time (``service_times``)
``ownership/``  who answers and who books a request: the states and transitions as one table
                (``table``), and their Redis steps (``claims``, ``notes``, ``cancels``,
                ``reclaim``, ``edge_booking``)
``replicas/``   each deployment's replicas: slot leases shared through Redis, live load,
                conversation affinity, ejection of a replica that keeps failing
``client/``     the Redis clients (standalone, Sentinel, Cluster) and typed stream replies
``jobs``        ``Job``, ``Reply`` and the ``Emit`` callable, the edge-worker contract
``keys``        every Redis key and its hash tag
``lanes``       priority lanes and weighted fair share (Lua), hand-off to an idle worker
``run``         what one run of a job did: attempts, tokens, timings
``billing``     a run's ledger entry and the cost its replies carry
``setup``       queue wiring from settings: slot keys, per-tier capacities
=============== ============================================================================

The import contracts in ``tests/test_layering.py`` keep ``edge/`` and ``running/`` from
importing each other, and ``ownership/``, ``replicas/`` and ``client/`` below both. The
narrative, with each race the ownership table settles, is ``docs/queue.md``.
"""
