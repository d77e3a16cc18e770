"""The layers of the code, declared here and enforced on every import in gateway/, router/ and
backends/ (module level, function level and ``TYPE_CHECKING`` alike):

    entry points  gateway.server, gateway.cli           start processes
    wiring        gateway.app, gateway.services         build the parts and connect them
    api           gateway.api, gateway.dashboard        HTTP: handlers, the access guard, errors
    concerns      gateway.queue, accounting, auth, rules, limits, faults, observability
                  (inside gateway.queue: edge and running never import each other; both use
                  ownership; ownership, replicas and client import neither side)
    leaves        gateway.sqlengine, gateway.sqlschema  (and errors, settings, metrics, ...)
    router        pure decisions; only the wire types of backends
    backends      talking to models; knows nothing above it

Each contract says which modules may not import what, and why. A broken contract fails with
every offending import: the file, its line and the module it imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "router", "backends")


@dataclass(frozen=True)
class Contract:
    name: str
    why: str
    modules: tuple[str, ...]
    """Whose imports are checked (a package stands for everything in it)."""
    forbidden: tuple[str, ...]
    """What they may not import."""
    exempt: tuple[str, ...] = ()
    """Modules of ``modules`` the contract does not bind."""
    allowed: tuple[str, ...] = ()
    """Modules of ``forbidden`` that may be imported all the same."""


ENTRY = ("gateway.server", "gateway.cli")
WIRING = ("gateway.app", "gateway.services")
API = ("gateway.api", "gateway.dashboard")
CONCERNS = ("gateway.auth", "gateway.rules", "gateway.accounting", "gateway.limits")
QUEUE_EDGE, QUEUE_RUNNING = "gateway.queue.edge", "gateway.queue.running"
QUEUE_OWNERSHIP, QUEUE_REPLICAS = "gateway.queue.ownership", "gateway.queue.replicas"
QUEUE_CLIENT = "gateway.queue.client"
REDIS_PLUMBING = (
    "gateway.queue.client.connection",
    "gateway.queue.client.streams",
    "gateway.queue.keys",
)

CONTRACTS = (
    Contract(
        "router is pure",
        "router/ decides on in-memory data: it uses the wire types of backends/, nothing else",
        modules=("router",),
        forbidden=("gateway", "backends"),
        allowed=("backends.types",),
    ),
    Contract(
        "training stays off the request path",
        "only the training package itself and the CLI commands that train import it",
        modules=("router", "gateway"),
        exempt=("router.training", "gateway.cli"),
        forbidden=("router.training",),
    ),
    Contract(
        "backends know nothing above them",
        "backends/ talks to models; tenants, rules and routing are not its business",
        modules=("backends",),
        forbidden=("router", "gateway"),
    ),
    Contract(
        "api is on top",
        "HTTP handlers use the concerns below them; nothing below reaches up into them",
        modules=("gateway",),
        exempt=(*API, *WIRING, *ENTRY),
        forbidden=API,
    ),
    Contract(
        "wiring only from the entry points",
        "open_services and the app factory connect everything; whoever imports them depends on "
        "everything (handlers take the parts' type from gateway.parts)",
        modules=("gateway",),
        exempt=(*WIRING, *ENTRY),
        forbidden=WIRING,
    ),
    Contract(
        "stores take their engine from a leaf",
        "the tenant, key and rule stores need a SQL engine, not the ledger",
        modules=("gateway.auth.store", "gateway.rules.store"),
        forbidden=("gateway.accounting",),
        allowed=("gateway.accounting.schema",),
    ),
    Contract(
        "the SQL engine and schema helpers are leaves",
        "every store builds on them, so they build on nothing of ours",
        modules=("gateway.sqlengine", "gateway.sqlschema"),
        forbidden=PACKAGES,
    ),
    Contract(
        "the queue's edge does not reach into a worker",
        "the edge (admit, wait, answer) and a worker (take, run, relay, book) talk through Redis "
        "in the job and reply contract (gateway.queue.jobs), the ownership table and its steps",
        modules=(QUEUE_EDGE,),
        forbidden=(QUEUE_RUNNING,),
    ),
    Contract(
        "a worker does not reach into the queue's edge",
        "the other direction of the same seam: a worker knows the edge only by its Redis keys "
        "and the reply contract",
        modules=(QUEUE_RUNNING,),
        forbidden=(QUEUE_EDGE,),
    ),
    Contract(
        "job ownership is below both sides",
        "who answers and books a request is decided by the table and its Redis steps, which "
        "both sides use; it knows neither side nor the replicas",
        modules=(QUEUE_OWNERSHIP,),
        forbidden=(QUEUE_EDGE, QUEUE_RUNNING, QUEUE_REPLICAS),
    ),
    Contract(
        "replicas and Redis clients are leaves of the queue",
        "the replicas a worker calls, and the Redis clients everyone uses, know nothing of jobs",
        modules=(QUEUE_REPLICAS, QUEUE_CLIENT),
        forbidden=(QUEUE_EDGE, QUEUE_RUNNING, QUEUE_OWNERSHIP),
    ),
    Contract(
        "concerns stay out of the api and the queue's insides",
        "auth, rules, accounting and limits serve the api and the queue; they name what they "
        "need of a request as a protocol of their own. Redis plumbing (clients, stream replies, "
        "key names) is shared by all and allowed",
        modules=CONCERNS,
        forbidden=(*API, "gateway.queue"),
        allowed=REDIS_PLUMBING,
    ),
)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of ``path``; ``from a import b`` also counts as
    importing ``a.b`` when that is a module."""
    out: list[tuple[int, str]] = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:
                    out.append((node.lineno, f"{module}.{alias.name}"))
    return out


def broken(contract: Contract) -> list[str]:
    found: list[str] = []
    for name, path in MODULES.items():
        if not _within(name, contract.modules) or _within(name, contract.exempt):
            continue
        for line, module in imports(name, path):
            if _within(module, contract.forbidden) and not _within(module, contract.allowed):
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return sorted(set(found))


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_contract(contract: Contract) -> None:
    offending = broken(contract)
    assert not offending, f"{contract.name} ({contract.why}):\n  " + "\n  ".join(offending)


def test_every_contract_sees_modules() -> None:
    """A contract whose modules were renamed away would pass for checking nothing."""
    for contract in CONTRACTS:
        assert any(_within(name, contract.modules) for name in MODULES), contract.name


def test_a_broken_contract_names_the_import() -> None:
    """The check itself: a contract the code breaks today is reported with file and line."""
    contract = Contract("probe", "", modules=("gateway.api.edge",), forbidden=("router",))
    assert any(
        o.startswith("gateway/api/edge.py:") and "imports router" in o for o in broken(contract)
    )
