from __future__ import annotations

from typing import Any

import pytest

from router.content_flags import numbers, quantities, sentences
from router.features import (
    MESSAGE_OVERHEAD_TOKENS,
    PROMPT_OVERHEAD_TOKENS,
    PromptFeatures,
    estimate_tokens,
    extract_text,
    message_text,
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": "hello"}, "hello"),
        ({"role": "user", "content": None}, ""),
        ({"role": "user"}, ""),
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at this"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                    {"type": "text", "text": "and this"},
                ],
            },
            "look at this\nand this",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "lookup", "arguments": '{"q": 1}'}}],
            },
            'lookup({"q": 1})',
        ),
        ({"role": "user", "content": [{"type": "text", "text": None}]}, ""),
    ],
)
def test_message_text(message: dict[str, Any], expected: str) -> None:
    assert message_text(message) == expected


def test_extract_text_joins_every_role_and_skips_empty() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
    ]
    assert extract_text(messages) == "Be brief.\n\nHi\n\nBye"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("abcd", 1), ("abcde", 2), ("a" * 400, 100), ("你好世界", 3)],
)
def test_estimate_tokens_of_text(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_estimate_tokens_of_messages_adds_overheads() -> None:
    messages = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "a" * 40}]
    expected = PROMPT_OVERHEAD_TOKENS + 2 * MESSAGE_OVERHEAD_TOKENS + 1 + 10
    assert estimate_tokens(messages) == expected
    assert PromptFeatures.from_messages(messages).estimated_prompt_tokens == expected


def test_non_latin_text_is_not_underestimated() -> None:
    chinese = "请解释量子纠缠的基本原理" * 10
    assert estimate_tokens(chinese) >= len(chinese) // 2


def test_from_messages_summarises_the_conversation() -> None:
    messages = [
        {"role": "system", "content": "You are terse. ```format``` rules"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    features = PromptFeatures.from_messages(messages)
    assert features.last_user_text == "What is the capital of France?"
    assert features.text.startswith("You are terse.")
    assert features.n_messages == 4
    assert features.n_turns == 2
    assert features.has_system
    assert not features.has_code  # the system prompt's code fence does not count
    assert features.chars == len("What is the capital of France?")


def test_without_user_message_the_whole_text_is_scored() -> None:
    features = PromptFeatures.from_messages([{"role": "system", "content": "Say hi"}])
    assert features.last_user_text == "Say hi"
    assert features.n_turns == 0


def test_empty_conversation() -> None:
    features = PromptFeatures.from_messages([])
    assert features.last_user_text == ""
    assert features.estimated_prompt_tokens == PROMPT_OVERHEAD_TOKENS
    assert features.script == "none"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\nprint(1)\n```", True),
        ("def add(a, b):\n    return a + b", True),
        ("#include <stdio.h>\nint main() {\n}", True),
        ("Why does df.groupby('a').sum() drop columns?", True),
        ("Write a haiku about spring", False),
        ("What is the capital of France?", False),
    ],
)
def test_has_code(text: str, code: bool) -> None:
    assert PromptFeatures.from_text(text).has_code is code


@pytest.mark.parametrize(
    ("text", "math"),
    [
        ("Solve x^2 + 3 = 7", True),
        ("Compute $\\int_0^1 x\\,dx$", True),
        ("Prove that the square root of 2 is irrational.", True),
        ("What is 12 * 7?", True),
        ("Find the derivative of sin(x)", True),
        ("Write a haiku about spring", False),
        ("I have 3 cats and 2 dogs.", False),
    ],
)
def test_has_math(text: str, math: bool) -> None:
    assert PromptFeatures.from_text(text).has_math is math


@pytest.mark.parametrize(
    ("text", "options"),
    [
        ("Which is a fruit?\nA. apple\nB. brick\nC. car", 3),
        ("Pick one:\n(A) yes\n(B) no", 2),
        ("Pick one:\nA) yes\nB) no\nC) maybe\nD) later", 4),
        ("Plan A. then plan B.", 0),
        ("Only\nA. one option", 0),
        ("Skipping\nA. one\nC. three", 0),
    ],
)
def test_options(text: str, options: int) -> None:
    features = PromptFeatures.from_text(text)
    assert features.n_options == options
    assert features.has_options is (options >= 2)


def test_question_shape_of_a_multiple_choice_prompt() -> None:
    text = (
        "A 2 kg ball falls 20 m; g = 9.8 m/s^2. What is its speed?\nA. 19.8 m/s\nB. 14 m/s\nC. none"
    )
    features = PromptFeatures.from_text(text)
    assert features.option_lengths == (8, 6, 4)
    assert features.numeric_options == 2
    assert features.quantities == 3  # 2 kg, 20 m, 9.8 m (the options are not the stem)
    assert features.formula_chars == 2  # = and ^
    assert features.question_marks == 1
    stem = "A 2 kg ball falls 20 m; g = 9.8 m/s^2. What is its speed?"
    assert features.upper_share == pytest.approx(2 / len(stem))


def test_question_shape_without_options_reads_the_whole_text() -> None:
    features = PromptFeatures.from_text("Why is the sky BLUE? And why 5 apples?")
    assert features.option_lengths == ()
    assert features.numeric_options == 0
    assert features.quantities == 0  # "apples" is not a unit
    assert features.question_marks == 2
    assert features.upper_share == pytest.approx(6 / 38)


@pytest.mark.parametrize("text", ["", "   ", "\x00\xff", "日本語のテキスト 5 kg", "A. only"])
def test_question_shape_of_odd_text(text: str) -> None:
    features = PromptFeatures.from_text(text)
    assert 0.0 <= features.upper_share <= 1.0
    assert features.quantities >= 0


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("What is the capital of France?", "latin"),
        ("Ça va très bien, merci à vous", "latin"),
        ("请用中文解释一下递归是什么意思", "cjk"),
        ("こんにちは、元気ですか", "cjk"),
        ("Привет, как дела?", "cyrillic"),
        ("مرحبا كيف حالك", "arabic"),
        ("Γειά σου κόσμε, τι κάνεις;", "other"),  # noqa: RUF001
        ("Translate: 你好", "latin"),
        ("12345 !!!", "none"),
        ("", "none"),
    ],
)
def test_script(text: str, script: str) -> None:
    assert PromptFeatures.from_text(text).script == script


def test_features_are_frozen() -> None:
    features = PromptFeatures.from_text("hi")
    with pytest.raises(AttributeError):
        features.has_code = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "math"),
    [
        ("The theorem was proved in 1995.", True),
        ("Find the eigenvalues of this matrix.", True),
        ("We need to improve our provenance tracking.", False),
        ("Call me on 555-1234 between 9-5 on 2024-01-05.", False),
        ("Compute 2^10", True),
    ],
)
def test_math_words_and_false_friends(text: str, math: bool) -> None:
    assert PromptFeatures.from_text(text).has_math is math


def test_flags_look_only_at_the_scan_window() -> None:
    code = "```python\nprint(1)\n```"
    assert PromptFeatures.from_text("x " * 5_000 + code).has_code  # in the tail
    assert PromptFeatures.from_text(code + "x " * 5_000).has_code  # in the head
    assert not PromptFeatures.from_text("x " * 1_000 + code + "x " * 1_000).has_code


@pytest.mark.parametrize(
    ("text", "n_numbers", "n_quantities"),
    [
        ("no digits at all, only words", 0, 0),
        ("x² and ³ are superscripts, not digits", 0, 0),
        ("Tom has 12 apples and 3.5 kg of flour; 1,200 g in all", 3, 2),
        ("٣ kg of rice and ٤٥ apples", 2, 1),  # Arabic-Indic digits are digits too
        ("a" * 5_000 + " 7 m", 1, 1),
    ],
)
def test_numbers_and_quantities(text: str, n_numbers: int, n_quantities: int) -> None:
    assert numbers(text) == n_numbers
    assert quantities(text) == n_quantities


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("One. Two? Three!", 3), ("v1.2 is out", 0), ("Ends with a dot.", 1), ("a.\nb.", 2)],
)
def test_sentence_ends(text: str, count: int) -> None:
    assert sentences(text) == count
