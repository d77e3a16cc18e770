"""Cost of rules on the request path: ``decide`` with no rules, the five example files, and 200
rules that all miss (each with a regex), as CPU time of this thread per call (the machine is shared;
wall time there measures other processes too); and of capabilities: ``decide`` for a request with
an image (two text-only deployments screened out), and ``needed_capabilities`` of a plain body
and of one with an image and tools. Writes bench/results/rules_eval.json.

    .venv/bin/python bench/rules_eval.py
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from router.capabilities import Capability, needed_capabilities
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.features import PromptFeatures
from router.planner import decide
from router.rules import RequestContext, RuleSet, parse_rules

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog(
    (
        DeploymentSpec("llama-3.1-8b-instruct", Tier.SMALL, 16_384),
        DeploymentSpec("llama-3.1-70b-instruct-awq", Tier.LARGE, 8_192),
        DeploymentSpec("gpt-4o-mini", Tier.EXTERNAL, 128_000, provider="litellm",
                       capabilities=frozenset(Capability)),
    )
)  # fmt: skip
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


class Fixed:
    def score(self, features: PromptFeatures) -> float:
        return 0.3


def per_call_us(
    rules: RuleSet,
    features: PromptFeatures,
    n: int = 20_000,
    needs: frozenset[Capability] = frozenset(),
) -> float:
    context = RequestContext(app="chat", tags=("web",), now=datetime.now(UTC))
    signals = Signals(expected_wait_s={Tier.LARGE: 2.0})
    policy = TenantPolicy("acme")
    runs = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(n):
            decide(requested_model="auto", features=features, max_tokens=512, policy=policy,
                   catalog=CATALOG, signals=signals, classifier=Fixed(), rules=rules,
                   context=context, needs=needs)  # fmt: skip
        runs.append((time.thread_time() - started) / n * 1e6)
    return round(statistics.median(runs), 2)


def needs_us(body: dict[str, object], n: int = 100_000) -> float:
    runs = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(n):
            needed_capabilities(body)
        runs.append((time.thread_time() - started) / n * 1e6)
    return round(statistics.median(runs), 3)


def main() -> None:
    features = PromptFeatures.from_text("Summarise this paragraph for me. " * 40)
    examples = RuleSet()
    for path in sorted((ROOT / "deploy" / "rules").glob("*.yaml")):
        examples = examples.then(parse_rules(path.read_text()))
    many = parse_rules("rules:\n" + "".join(
        f"  - id: r{i}\n    when: {{last_message: {{regex: 'token{i}x'}}}}\n    then: {{}}\n"
        for i in range(200)
    ))  # fmt: skip
    results = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "prompt_chars": features.chars,
        "decide_us": {
            "no_rules": per_call_us(RuleSet(), features),
            f"examples_{len(examples.rules)}_rules": per_call_us(examples, features),
            "200_regex_rules_all_miss": per_call_us(many, features, n=2_000),
            "no_rules_image": per_call_us(
                RuleSet(), features, needs=frozenset({Capability.VISION})
            ),
        },
        "needed_capabilities_us": {
            "three_text_messages": needs_us(
                {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Summarise this."},
                        {"role": "user", "content": [{"type": "text", "text": "And this."}]},
                    ]
                }
            ),
            "image_and_tools": needs_us(
                {
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "What?"}, IMAGE]}
                    ],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                }
            ),
        },
    }
    out = ROOT / "bench" / "results" / "rules_eval.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
