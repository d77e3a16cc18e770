"""What tests share: real processes and stacks, configs, ports, waiting, the ledger.

    ports     free_port
    configs   gateway_config, example_config_on_free_ports, edit_config, own_config
    procs     Proc, start_sim(s), start_gateway, start_worker, start_tiergate, sim_faults,
              RedisServer, wait_redis, uvicorn_in_thread, wait_http, wait_ready, TEST_KEYS
    stacks    Stack (``Stack.run``: simulators + gateway [+ workers] + a Redis prefix),
              stack_with_own_redis, new_prefix, drop_prefix
    polling   until, value_when (async), wait_until (sync)
    ledger    wait_entry
    fuzz      fuzz_examples

The names are re-exported here (``from tests.support import free_port``); ``ledger`` is not, as
it imports the gateway's accounting package (``from tests.support.ledger import wait_entry``).
"""

from __future__ import annotations

from tests.support.configs import (
    EXAMPLE_CONFIG,
    edit_config,
    example_config_on_free_ports,
    gateway_config,
    own_config,
)
from tests.support.fuzz import fuzz_examples
from tests.support.polling import until, value_when, wait_until
from tests.support.ports import free_port
from tests.support.procs import (
    TEST_KEYS,
    Proc,
    RedisServer,
    sim_faults,
    start_gateway,
    start_sim,
    start_sims,
    start_tiergate,
    start_worker,
    uvicorn_in_thread,
    wait_http,
    wait_ready,
    wait_redis,
)
from tests.support.stacks import PROFILES, Stack, drop_prefix, new_prefix, stack_with_own_redis

__all__ = [
    "EXAMPLE_CONFIG",
    "PROFILES",
    "TEST_KEYS",
    "Proc",
    "RedisServer",
    "Stack",
    "drop_prefix",
    "edit_config",
    "example_config_on_free_ports",
    "free_port",
    "fuzz_examples",
    "gateway_config",
    "new_prefix",
    "own_config",
    "sim_faults",
    "stack_with_own_redis",
    "start_gateway",
    "start_sim",
    "start_sims",
    "start_tiergate",
    "start_worker",
    "until",
    "uvicorn_in_thread",
    "value_when",
    "wait_http",
    "wait_ready",
    "wait_redis",
    "wait_until",
]
