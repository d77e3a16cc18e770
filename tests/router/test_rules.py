"""The rule language: validation with line numbers, every condition, every action (via decide)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.errors import ModelNotAllowed
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.planner import decide
from router.rules import RequestContext, RuleSet, RulesInvalid, parse_rules

PER_M = Decimal("0.000001")
SMALL = DeploymentSpec("small-a", Tier.SMALL, 16_384, input_usd_per_token=3 * PER_M / 100,
                       output_usd_per_token=6 * PER_M / 100)  # fmt: skip
SMALL_B = DeploymentSpec("small-b", Tier.SMALL, 16_384)
LARGE = DeploymentSpec("large-a", Tier.LARGE, 8_192, input_usd_per_token=35 * PER_M / 100,
                       output_usd_per_token=70 * PER_M / 100)  # fmt: skip
EXTERNAL = DeploymentSpec("ext-a", Tier.EXTERNAL, 128_000, provider="litellm",
                          input_usd_per_token=15 * PER_M / 100,
                          output_usd_per_token=60 * PER_M / 100)  # fmt: skip
CATALOG = Catalog((SMALL, SMALL_B, LARGE, EXTERNAL))
POLICY = TenantPolicy(tenant="acme", threshold=0.5)
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # a Tuesday


class FixedScore:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, features: PromptFeatures) -> float:
        return self.value


class Calibrated(FixedScore):
    def threshold_for_share(self, share: float) -> float:
        return 1.0 - share


def rules_of(text: str) -> RuleSet:
    return parse_rules(text, catalog=CATALOG)


def plan(
    rules: str,
    prompt: str = "What is the capital of France?",
    *,
    model: str = "auto",
    score: float = 0.2,
    context: RequestContext | None = None,
    signals: Signals | None = None,
    max_tokens: int = 256,
    messages: list[dict[str, str]] | None = None,
    classifier: FixedScore | None = None,
    tenant: str = "acme",
) -> RoutePlan:
    features = PromptFeatures.from_messages(messages or [{"role": "user", "content": prompt}])
    return decide(
        requested_model=model,
        features=features,
        max_tokens=max_tokens,
        policy=dataclasses.replace(POLICY, tenant=tenant),
        catalog=CATALOG,
        signals=signals or Signals(),
        classifier=classifier or FixedScore(score),
        rules=rules_of(rules),
        context=context or RequestContext(now=NOON),
    )


def one_rule(when: str, then: str = "{tier: external}") -> str:
    return f"rules:\n  - id: r\n    when: {when}\n    then: {then}\n"


# ---------- validation ----------


@pytest.mark.parametrize(
    ("text", "line", "path", "needle"),
    [
        ("rules:\n  - id: a\n    when:\n      prompt_tokens: {gt: x}\n    then: {}\n", 4,
         "rules[0].when.prompt_tokens.gt", "valid number"),
        ("rules:\n  - id: a\n    then: {tier: huge}\n", 3, "rules[0].then.tier", "small"),
        ("rules:\n  - id: a\n    then: {}\n  - id: a\n    then: {}\n", 4, "rules[1].id",
         "already used"),
        ("rules:\n  - id: a\n    when: {last_message: {regex: '(x'}}\n    then: {}\n", 3,
         "rules[0].when.last_message.regex", "regular expression"),
        ("rules:\n  - id: a\n    when: {last_message: {regex: '(a+)+$'}}\n    then: {}\n", 3,
         "rules[0].when.last_message.regex", "nested quantifier"),
        ("rules:\n  - id: a\n    when: {colour: red}\n    then: {}\n", 3,
         "rules[0].when.colour", "Extra inputs"),
        ("rules:\n  - id: a\n    then: {deployment: nope}\n", 3, "rules[0].then.deployment",
         "unknown deployment"),
        ("rules:\n  - id: a\n    when: {time: {after: '25:00'}}\n    then: {}\n", 3,
         "rules[0].when.time.after", "time of day"),
        ("rules:\n  - id: a\n    then: {tier: large, deployment: large-a}\n", 3,
         "rules[0].then", "not both"),
        ('{"rules": [\n {"id": "a",\n  "then": {"max_tokens": 0}}]}', 3,
         "rules[0].then.max_tokens", "greater than"),
        ("rules:\n  - id: a\n    then: {tier: large\n", 4, "", "YAML"),
        # issue 20: `$` let a trailing newline through, into ledger rows and a response header
        ('rules:\n  - id: "ab\\n"\n    then: {}\n', 2, "rules[0].id", "ids are"),
        ('rules:\n  - id: "a\\0b"\n    then: {}\n', 2, "rules[0].id", "ids are"),
        ('rules:\n  - id: a\n    when: {app: "x\\0"}\n    then: {}\n', 3, "rules[0].when.app",
         "control character"),
        ('rules:\n  - id: a\n    when: {tag: ["ok", "b\\tad"]}\n    then: {}\n', 3,
         "rules[0].when.tag", "control character"),
        ('rules:\n  - id: a\n    description: "x\\0"\n    then: {}\n', 3,
         "rules[0].description", "NUL"),
    ],
)  # fmt: skip
def test_invalid_rules_point_at_the_line(text: str, line: int, path: str, needle: str) -> None:
    with pytest.raises(RulesInvalid) as caught:
        rules_of(text)
    assert caught.value.line == line, str(caught.value)
    assert caught.value.path == path
    assert needle in str(caught.value)
    assert str(caught.value).startswith(f"line {line}: ")


def _laughs(levels: int) -> str:
    """A "billion laughs" file: ``levels`` lists of nine aliases of the list before."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (_laughs(9), 5, "more than 50000 values once its aliases are expanded"),  # 9**9 values
        (_laughs(6), 5, "more than 50000 values"),  # 9**6 = 531,441: seconds to walk unbounded
        ("rules: &r\n  - id: a\n    then: *r\n", 3, "refers to a node that contains it"),
        ("rules: " + "[" * 40 + "]" * 40 + "\n", 1, "nested more than 32 levels deep"),
        ("rules: " + "[" * 120_000 + "]" * 120_000, 1, "nested more than 32 levels deep"),
    ],
)
def test_untrusted_yaml_is_bounded_before_it_is_walked(text: str, line: int, needle: str) -> None:
    """Issue 20: a 299-byte alias bomb froze a gateway at 15 GB. Refused from the event stream,
    before any alias is expanded."""
    with pytest.raises(RulesInvalid) as caught:
        parse_rules(text)
    assert caught.value.line == line, str(caught.value)
    assert needle in str(caught.value)


def test_aliases_within_the_bounds_still_work() -> None:
    text = (
        "rules:\n"
        "  - id: a\n    when: &when {tag: [pii, phi]}\n    then: {tier: large}\n"
        "  - id: b\n    when: *when\n    then: {tier: small}\n"
    )
    assert [r.id for r in parse_rules(text).rules] == ["a", "b"]


def test_empty_file_is_no_rules() -> None:
    assert rules_of("").rules == ()
    assert rules_of("rules: []").rules == ()


# ---------- conditions ----------


@pytest.mark.parametrize(
    ("when", "kwargs", "fires"),
    [
        ("{tenant: acme}", {}, True),
        ("{tenant: [globex, initech]}", {}, False),
        ("{app: billing}", {"context": RequestContext(app="billing")}, True),
        ("{app: billing}", {"context": RequestContext(app="chat")}, False),
        ("{tag: [pii, phi]}", {"context": RequestContext(tags=("x", "pii"))}, True),
        ("{tag: pii}", {"context": RequestContext(tags=("x",))}, False),
        ("{user: u-1}", {"context": RequestContext(user="u-1")}, True),
        ("{model: auto}", {}, True),
        ("{model: small}", {}, False),
        ("{prompt_tokens: {gt: 1000}}", {"prompt": "word " * 2000}, True),
        ("{prompt_tokens: {gt: 1000}}", {}, False),
        ("{turns: {gte: 2}}", {"messages": [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b"},
                                           {"role": "user", "content": "c"}]}, True),
        ("{turns: {gte: 2}}", {}, False),
        ("{messages: {lte: 1}}", {}, True),
        ("{last_message: {regex: 'review (this|my) (PR|diff)'}}",
         {"prompt": "please review this PR"}, True),
        ("{last_message: {regex: 'review'}}", {"prompt": "hello"}, False),
        ("{last_message: {keywords: [SSN, passport]}}", {"prompt": "my ssn is 1"}, True),
        ("{last_message: {keywords: [ssn]}}", {"prompt": "classnames"}, False),
        ("{last_message: {keywords: [SSN], case_sensitive: true}}", {"prompt": "ssn"}, False),
        ("{score: {gte: 0.7}}", {"score": 0.8}, True),
        ("{score: {gte: 0.7}}", {"score": 0.6}, False),
        ("{time: {after: '09:00', before: '17:00'}}", {}, True),
        ("{time: {after: '22:00', before: '06:00'}}", {}, False),
        ("{time: {after: '22:00', before: '06:00'}}",
         {"context": RequestContext(now=datetime(2026, 12, 1, 23, 30, tzinfo=UTC))}, True),
        ("{time: {days: [sat, sun]}}", {}, False),
        ("{time: {after: '12:30', tz: Europe/Berlin}}", {}, True),
        ("{queue_wait_s: {large: {gt: 5}}}",
         {"signals": Signals(expected_wait_s={Tier.LARGE: 9.0})}, True),
        ("{queue_wait_s: {large: {gt: 5}}}",
         {"signals": Signals(expected_wait_s={Tier.LARGE: 1.0})}, False),
        ("{queue_wait_s: {large: {gt: 5}}}", {}, False),
        ("{circuit_open: large}", {"signals": Signals(unavailable=frozenset({"large-a"}))}, True),
        ("{circuit_open: small}", {"signals": Signals(unavailable=frozenset({"small-a"}))}, False),
        ("{circuit_open: small-a}", {"signals": Signals(unavailable=frozenset({"small-a"}))},
         True),
    ],
)  # fmt: skip
def test_each_condition(when: str, kwargs: dict[str, object], fires: bool) -> None:
    result = plan(one_rule(when), **kwargs)  # type: ignore[arg-type]
    assert (result.rule == "rule:r") is fires, result
    if fires:
        assert result.tier is Tier.EXTERNAL
        assert result.skipped_rules == ()
    else:
        assert result.skipped_rules[0][0] == "r"


def test_first_match_wins_and_records_why_others_did_not() -> None:
    text = """
rules:
  - id: billing
    when: {app: billing}
    then: {tier: large}
  - id: long
    when: {prompt_tokens: {gt: 5000}}
    then: {tier: external}
  - id: everyone
    then: {max_tokens: 100}
  - id: never
    then: {tier: large}
"""
    result = plan(text, context=RequestContext(app="chat"))
    assert result.rule == "rule:everyone"
    assert result.tier is Tier.SMALL
    assert result.max_tokens == 100
    assert [s[0] for s in result.skipped_rules] == ["billing", "long"]
    assert "app 'chat'" in result.skipped_rules[0][1]
    assert "prompt_tokens" in result.skipped_rules[1][1]


def test_tenant_rules_then_global_defaults() -> None:
    tenant = rules_of("rules:\n  - id: mine\n    when: {app: x}\n    then: {tier: large}\n")
    global_ = rules_of(
        "defaults: {large_wait_target_s: 5}\nrules:\n  - id: base\n    then: {max_tokens: 9}\n"
    ).scoped("global")
    combined = tenant.then(global_)
    assert [r.id for r in combined.rules] == ["mine", "base"]
    assert combined.wait_target_s == 5
    assert combined.rules[1].scope == "global"


# ---------- actions ----------


def test_tier_and_deployment() -> None:
    assert plan(one_rule("{}", "{tier: large}")).deployments == ("large-a", "ext-a", "small-a",
                                                                "small-b")  # fmt: skip
    result = plan(one_rule("{}", "{deployment: small-b}"))
    # the named deployment alone: the rest of its tier is not dragged in (it has no chain)
    assert result.deployments == ("small-b",)
    assert result.rule == "rule:r" and result.reason == "rule r → small-b"


def test_threshold_and_target_share() -> None:
    assert plan(one_rule("{}", "{threshold: 0.1}"), score=0.2).tier is Tier.LARGE
    assert plan(one_rule("{}", "{threshold: 0.9}"), score=0.8).tier is Tier.SMALL
    share = one_rule("{}", "{target_large_share: 0.9}")  # threshold 0.1
    assert plan(share, classifier=Calibrated(0.2)).tier is Tier.LARGE
    # a classifier without a share curve keeps the tenant's threshold
    assert plan(share, classifier=FixedScore(0.2)).tier is Tier.SMALL


def test_the_plan_carries_the_threshold_in_force() -> None:
    """What explain and the rules console show beside the score."""
    assert plan("rules: []").threshold == 0.5  # the tenant's
    assert plan(one_rule("{}", "{threshold: 0.1}")).threshold == 0.1
    share = one_rule("{}", "{target_large_share: 0.9}")
    assert plan(share, classifier=Calibrated(0.2)).threshold == pytest.approx(0.1)
    assert plan(one_rule("{}", "{tier: large}")).threshold == 0.5  # auto, a rule picked the tier
    assert plan("rules: []", model="small").threshold is None  # pinned: no threshold applies
    assert RoutePlan.from_dict(plan("rules: []").to_dict()).threshold == 0.5


def test_forbid_tiers_and_external() -> None:
    result = plan(one_rule("{}", "{tier: large, forbid_tiers: [external]}"))
    assert "ext-a" not in result.deployments
    result = plan(one_rule("{}", "{forbid_external: true}"), score=0.9)
    assert result.deployments == ("large-a", "small-a", "small-b")
    with pytest.raises(ModelNotAllowed, match="rule r"):
        plan(one_rule("{}", "{forbid_external: true}"), model="ext-a")
    with pytest.raises(ModelNotAllowed, match="rule r"):
        plan(one_rule("{}", "{forbid_tiers: [large]}"), model="large")


def test_max_tokens_cap_and_context_fit() -> None:
    result = plan(one_rule("{}", "{max_tokens: 64}"), max_tokens=4000)
    assert result.max_tokens == 64
    # 8k large fits 7,000 prompt tokens only when the cap shrinks the output budget
    prompt = "word " * 5200
    capped = plan(one_rule("{}", "{tier: large, max_tokens: 64}"), prompt, max_tokens=4000)
    assert capped.tier is Tier.LARGE
    uncapped = plan(one_rule("{}", "{tier: large}"), prompt, max_tokens=4000)
    assert uncapped.tier is Tier.EXTERNAL


def test_cost_cap_drops_expensive_and_unpriced() -> None:
    # 1,000 output tokens: large 0.0007 + prompt, external 0.0006 + prompt, small 0.00006
    result = plan(one_rule("{}", "{tier: large, max_cost_usd: '0.0005'}"), max_tokens=1000)
    assert result.deployments == ("small-a",)  # small-b has no price
    assert "over $0.0005" in result.reason
    with pytest.raises(ModelNotAllowed, match="within"):
        plan(one_rule("{}", "{max_cost_usd: '0.000001'}"), max_tokens=1000)


def test_priority_fallback_continuation() -> None:
    text = one_rule(
        "{}", "{tier: small, priority: batch, fallback: [external], continuation: false}"
    )
    result = plan(text)
    assert result.priority == "batch"
    assert result.continuation is False
    assert result.deployments == ("small-a", "small-b", "ext-a")
    assert plan(one_rule("{}", "{tier: large, fallback: []}")).deployments == ("large-a",)
    assert RoutePlan.from_dict(result.to_dict()) == result


# ---------- stickiness and spill-over ----------


def test_sticky_conversation_stays_large_unless_a_rule_says_so() -> None:
    sticky = RequestContext(now=NOON, sticky_tier=Tier.LARGE, conversation="c1")
    result = plan("", score=0.1, context=sticky)
    assert (result.tier, result.rule) == (Tier.LARGE, "sticky:conversation")
    assert plan("", score=0.1).tier is Tier.SMALL
    released = plan(one_rule("{}", "{sticky: false}"), score=0.1, context=sticky)
    assert released.tier is Tier.SMALL
    pinned = plan(one_rule("{}", "{tier: small}"), score=0.1, context=sticky)
    assert pinned.tier is Tier.SMALL


def test_default_spill_over_when_large_wait_is_over_target() -> None:
    slow = Signals(expected_wait_s={Tier.LARGE: 45.0})
    result = plan("", score=0.9, signals=slow)
    assert (result.tier, result.rule) == (Tier.EXTERNAL, "spill:large_wait")
    assert "45.0 s > target 30 s" in result.reason
    assert plan("", score=0.9, signals=Signals(expected_wait_s={Tier.LARGE: 10.0})).tier is (
        Tier.LARGE
    )
    own = "defaults: {large_wait_target_s: 5, spill_to: small}\n"
    quick = plan(own, score=0.9, signals=Signals(expected_wait_s={Tier.LARGE: 10.0}))
    assert (quick.tier, quick.rule) == (Tier.SMALL, "spill:large_wait")
    on_prem = plan(one_rule("{}", "{forbid_external: true}"), score=0.9, signals=slow)
    assert on_prem.tier is Tier.SMALL


def test_the_wait_spill_skips_a_tier_without_a_deployment() -> None:
    """No external deployment configured: the default ``spill_to`` (external, then small) goes to
    small, rather than to external and from there back onto the large tier as a spill."""
    slow = Signals(expected_wait_s={Tier.LARGE: 45.0})
    result = decide(
        requested_model="auto", features=PromptFeatures.from_text("hi"), max_tokens=64,
        policy=POLICY, catalog=Catalog((SMALL, LARGE)), signals=slow,
        classifier=FixedScore(0.9), rules=rules_of(""),
    )  # fmt: skip
    assert (result.tier, result.rule) == (Tier.SMALL, "spill:large_wait")
    assert result.deployments[0] == "small-a"
    assert result.reason == (
        "score 0.90 ≥ threshold 0.50 → large; large tier's expected wait 45.0 s > target 30 s "
        "→ small"
    )


@pytest.mark.parametrize(
    ("rules", "signals", "max_tokens", "expected"),
    [
        # external's only deployment has its circuit open
        ("", Signals(expected_wait_s={Tier.LARGE: 45.0}, unavailable=frozenset({"ext-a"})), 256,
         Tier.SMALL),
        # external (and small-b, unpriced) are over the rule's cost cap; small-a is within it
        (one_rule("{}", "{max_cost_usd: 0.0001}"), Signals(expected_wait_s={Tier.LARGE: 45.0}),
         256, Tier.SMALL),
        # small's deployments cannot hold 17,000 tokens; external's can
        ("defaults: {spill_to: [small, external]}\n", Signals(expected_wait_s={Tier.LARGE: 45.0}),
         17_000, Tier.EXTERNAL),
    ],
)  # fmt: skip
def test_the_wait_spill_goes_to_a_tier_with_a_deployment_for_the_request(
    rules: str, signals: Signals, max_tokens: int, expected: Tier
) -> None:
    result = plan(rules, score=0.9, signals=signals, max_tokens=max_tokens)
    assert (result.tier, result.rule) == (expected, "spill:large_wait")
    assert f"> target 30 s → {expected.value}" in result.reason, result.reason


def test_a_wait_spill_that_finds_no_tier_stays_large_and_says_so() -> None:
    slow = Signals(expected_wait_s={Tier.LARGE: 45.0}, unavailable=frozenset({"ext-a"}))
    result = plan("defaults: {spill_to: external}\n", score=0.9, signals=slow)
    assert (result.tier, result.rule) == (Tier.LARGE, "auto:threshold")
    assert result.deployments[0] == "large-a"
    assert result.reason == (
        "score 0.90 ≥ threshold 0.50 → large; large tier's expected wait 45.0 s > target 30 s, "
        "but no tier to spill to can serve it"
    )
    on_prem = plan(one_rule("{}", "{forbid_tiers: [small, external]}"), score=0.9, signals=slow)
    assert (on_prem.tier, on_prem.rule) == (Tier.LARGE, "rule:r")
    assert on_prem.reason.endswith("but no tier to spill to can serve it")


def waits(large: float, *, job: float = 0.0, **others: float) -> Signals:
    """The large tier's expected wait and typical job time, and other tiers' waits."""
    return Signals(
        expected_wait_s={Tier.LARGE: large, **{Tier(t): w for t, w in others.items()}},
        service_s={Tier.LARGE: job} if job else {},
    )


def left(seconds: float | None) -> RequestContext:
    return RequestContext(now=NOON, time_left_s=seconds)


def test_deadline_spill_when_the_wait_is_longer_than_the_time_left() -> None:
    """12 s of wait is under the 30 s target, but the request has 5 s: it moves."""
    result = plan("", score=0.9, signals=waits(12.0), context=left(5.0))
    assert (result.tier, result.rule) == (Tier.EXTERNAL, "spill:deadline")
    assert result.deployments[0] == "ext-a"
    assert result.reason == (
        "score 0.90 ≥ threshold 0.50 → large; deadline in 5.0 s: large tier's expected wait "
        "12.0 s does not fit → external"
    )


def test_deadline_spill_leaves_time_for_a_typical_job() -> None:
    """The allowance is the large tier's typical job time: a worker does not start a job with
    less time left than that, so 3 s of wait + 4 s of job do not fit into 5 s."""
    result = plan("", score=0.9, signals=waits(3.0, job=4.0), context=left(5.0))
    assert (result.tier, result.rule) == (Tier.EXTERNAL, "spill:deadline")
    assert "deadline in 5.0 s: large tier's expected wait 3.0 s + a typical job 4.0 s" in (
        result.reason
    )


@pytest.mark.parametrize(
    ("signals", "time_left_s"),
    [
        (waits(3.0, job=2.0), 5.0),  # 3 + 2 fit into 5
        (waits(5.0), 5.0),  # exactly fits
        (waits(0.0, job=6.0), 5.0),  # nothing waits: it starts at once, the queue is not late
        (waits(12.0), None),  # no deadline known
        (Signals(), 1.0),  # no estimate
    ],
)
def test_no_deadline_spill_when_the_job_can_start_in_time(
    signals: Signals, time_left_s: float | None
) -> None:
    result = plan("", score=0.9, signals=signals, context=left(time_left_s))
    assert (result.tier, result.rule) == (Tier.LARGE, "auto:threshold")
    assert "deadline" not in result.reason


def test_over_the_target_the_wait_spill_says_so_first() -> None:
    result = plan("", score=0.9, signals=waits(45.0), context=left(5.0))
    assert result.rule == "spill:large_wait"


def test_deadline_spill_respects_forbidden_tiers_and_spill_to() -> None:
    late = {"signals": waits(12.0), "context": left(5.0), "score": 0.9}
    on_prem = plan(one_rule("{}", "{forbid_external: true}"), **late)
    assert (on_prem.tier, on_prem.rule) == (Tier.SMALL, "spill:deadline")
    assert "ext-a" not in on_prem.deployments
    small_only = plan("defaults: {spill_to: small}\n", **late)
    assert (small_only.tier, small_only.rule) == (Tier.SMALL, "spill:deadline")
    nowhere = plan(one_rule("{}", "{forbid_tiers: [external, small]}"), **late)
    assert (nowhere.tier, nowhere.rule) == (Tier.LARGE, "rule:r")
    assert nowhere.reason.endswith("does not fit, nor does any tier to spill to")
    assert plan("defaults: {spill_to: []}\n", **late).tier is Tier.LARGE  # no spill-over at all
    no_external = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.SMALL, Tier.LARGE}))
    result = decide(
        requested_model="auto", features=PromptFeatures.from_text("hi"), max_tokens=64,
        policy=no_external, catalog=CATALOG, signals=waits(12.0), classifier=FixedScore(0.9),
        rules=rules_of(""), context=left(5.0),
    )  # fmt: skip
    assert (result.tier, result.rule) == (Tier.SMALL, "spill:deadline")


def test_deadline_spill_skips_tiers_that_are_late_too_or_have_no_deployment() -> None:
    late = {"context": left(5.0), "score": 0.9}
    busy = plan("", signals=waits(12.0, external=8.0), **late)
    assert (busy.tier, busy.rule) == (Tier.SMALL, "spill:deadline")
    assert "→ small (external tier's expected wait 8.0 s neither)" in busy.reason
    stuck = plan("", signals=waits(12.0, external=8.0, small=6.0), **late)
    assert (stuck.tier, stuck.rule) == (Tier.LARGE, "auto:threshold")
    without_external = decide(
        requested_model="auto", features=PromptFeatures.from_text("hi"), max_tokens=64,
        policy=POLICY, catalog=Catalog((SMALL, LARGE)), signals=waits(12.0),
        classifier=FixedScore(0.9), rules=rules_of(""), context=left(5.0),
    )  # fmt: skip
    assert (without_external.tier, without_external.rule) == (Tier.SMALL, "spill:deadline")


def test_deadline_spill_skips_a_tier_whose_deployments_cannot_serve_the_request() -> None:
    """The same check as the wait spill's: external's only deployment is unavailable, so the
    request goes to small instead of external and from there back onto the large tier."""
    broken = dataclasses.replace(waits(12.0), unavailable=frozenset({"ext-a"}))
    result = plan("", score=0.9, signals=broken, context=left(5.0))
    assert (result.tier, result.rule) == (Tier.SMALL, "spill:deadline")
    assert result.deployments[0] == "small-a"


@pytest.mark.parametrize(
    ("rules", "model", "expected"),
    [
        ("", "large", (Tier.LARGE, "pin:tier")),
        ("", "large-a", (Tier.LARGE, "pin:model")),
        (one_rule("{}", "{tier: large}"), "auto", (Tier.LARGE, "rule:r")),
    ],
)
def test_a_request_pinned_to_the_large_tier_is_not_moved(
    rules: str, model: str, expected: tuple[Tier, str]
) -> None:
    result = plan(rules, model=model, score=0.9, signals=waits(12.0), context=left(5.0))
    assert (result.tier, result.rule) == expected
    assert "deadline" not in result.reason


def test_a_sticky_conversation_spills_on_its_deadline_too() -> None:
    sticky = RequestContext(now=NOON, sticky_tier=Tier.LARGE, conversation="c1", time_left_s=5.0)
    result = plan("", score=0.1, signals=waits(12.0), context=sticky)
    assert (result.tier, result.rule) == (Tier.EXTERNAL, "spill:deadline")
    assert "stays large; deadline in 5.0 s" in result.reason


def test_spill_on_deadline_can_be_turned_off_and_is_inherited() -> None:
    late = {"signals": waits(12.0), "context": left(5.0), "score": 0.9}
    off = plan("defaults: {spill_on_deadline: false}\n", **late)
    assert (off.tier, off.rule) == (Tier.LARGE, "auto:threshold")
    global_off = rules_of("defaults: {spill_on_deadline: false}\n").scoped("global")
    assert rules_of("").then(global_off).deadline_spill is False
    assert rules_of("defaults: {spill_on_deadline: true}\n").then(global_off).deadline_spill
    assert rules_of("").then(rules_of("")).deadline_spill  # built-in: on
    with pytest.raises(RulesInvalid) as caught:
        rules_of("defaults:\n  spill_on_deadline: sometimes\n")
    assert caught.value.line == 2 and caught.value.path == "defaults.spill_on_deadline"


def test_evaluation_is_fast() -> None:
    """Not a timing test: 200 rules that all miss are evaluated without recompiling."""
    body = "".join(
        f"  - id: r{i}\n    when: {{last_message: {{regex: 'x{i}y'}}}}\n    then: {{}}\n"
        for i in range(200)
    )
    result = plan("rules:\n" + body)
    assert len(result.skipped_rules) == 200
