"""Simulator profiles: what one simulated deployment looks like and how fast it is.

A profile is data. The numbers are rough public figures, chosen so that the relative behaviour of
the tiers (small/fast, large/slow, external/high-TTFT) is right; none of them is a benchmark.

``llama-3.1-8b-instruct`` (vLLM, one H100 80 GB, bf16)
    Prefill on an H100 runs at roughly 20k tokens/s for an 8B model, hence 0.05 ms per prompt
    token on top of a ~20 ms fixed cost (scheduling, first forward pass, detokenizing).
    Single-stream decode is ~80 tokens/s (ITL 12 ms); a full batch of 32 decodes about 1.5x
    slower per token.
    KV cache: 0.9 x 80 GB minus 16 GB of weights and ~4 GB of activations leaves ~48 GiB; Llama 3.1
    8B needs 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token, so ~393k tokens
    (24,576 blocks of 16).
``llama-3.1-70b-instruct-awq`` (vLLM, one H100 80 GB, AWQ INT4)
    ~37 GB of INT4 weights. Prefill ~5k tokens/s (0.2 ms per token) on a ~60 ms fixed cost; decode
    ~28 tokens/s single-stream (ITL 35 ms), 2x slower per token at a full batch of 16. KV: ~30 GiB
    left at 320 KiB per token (80 layers) is ~98k tokens (6,144 blocks), so 16 long requests can
    fill it.
``bge-m3`` (vLLM ``--task embed``, one L4 24 GB, an embedding model)
    An encoder only: no decode, so a request costs its prefill alone, ~40k tokens/s for a
    568M-parameter model (0.025 ms per token) on a ~5 ms fixed cost. 1024-dimensional vectors,
    8192 tokens per input. Serves ``/v1/embeddings`` only (chat answers 400, as vLLM does).
``gpt-4o-mini`` (a hosted OpenAI-style API)
    Public latency trackers put TTFT at 0.3-0.5 s and output speed at ~80-120 tokens/s (ITL 8 ms).
    Capacity is effectively unbounded from one client's point of view: 1024 concurrent requests and
    no visible slowdown under load. It answers with OpenAI's error bodies.

The load slowdown follows llm-d-inference-sim's ``time-factor-under-load``: every latency is
multiplied by ``1 + (load_slowdown - 1) x (running - 1) / (max_num_seqs - 1)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = ["PROFILES", "Flavor", "Kind", "SimProfile"]

Flavor = Literal["vllm", "openai"]
Kind = Literal["chat", "embedding"]


@dataclass(frozen=True, slots=True)
class SimProfile:
    """One simulated deployment. The served model id is ``name``.

    ``flavor`` picks the wire dialect: ``"vllm"`` (vLLM's error bodies, ``max_model_len`` in
    ``/v1/models``, ``continue_final_message``) or ``"openai"`` (OpenAI's error bodies; the
    continuation flags are ignored, as a hosted API would).
    """

    name: str
    flavor: Flavor
    max_model_len: int
    max_num_seqs: int
    ttft_base_s: float
    """Fixed part of the time to first token (an idle engine, an empty prompt)."""
    ttft_per_prompt_token_s: float
    """Prefill time per prompt token."""
    itl_s: float
    """Inter-token latency of one request decoding alone."""
    kv_cache_tokens: int
    """KV-cache capacity in tokens: ``kv_cache_tokens // block_size`` blocks (vLLM's
    ``num_gpu_blocks``); ``vllm:kv_cache_usage_perc`` is the blocks running requests hold over
    that."""
    load_slowdown: float = 1.0
    """Latency multiplier when all ``max_num_seqs`` slots are busy (1.0 = no slowdown)."""
    max_num_queued: int | None = None
    """Waiting-queue cap (vLLM's ``--max-num-queued-reqs``); beyond it requests get 503."""
    min_output_tokens: int = 20
    max_output_tokens: int = 300
    """Range of the natural answer length, before ``max_tokens`` caps it."""
    block_size: int = 16
    """Tokens per KV block (vLLM's ``--block-size``, 16 by default on GPUs)."""
    enable_prefix_caching: bool = True
    """Automatic prefix caching, on by default as in vLLM V1 (``backends.sim.prefix_cache``)."""
    vision: bool = False
    """Whether image parts are accepted (a vision model); a text-only model answers them 400."""
    kind: Kind = "chat"
    """``embedding``: serves ``/v1/embeddings`` (``backends.sim.embeddings``) and not chat."""
    dimensions: int = 0
    """An embedding model's vector length."""

    def __post_init__(self) -> None:
        if self.max_model_len < 1 or self.max_num_seqs < 1 or self.block_size < 1:
            raise ValueError(f"profile {self.name!r}: sizes must be positive")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError(f"profile {self.name!r}: the KV cache must hold at least one block")
        if self.load_slowdown < 1.0:
            raise ValueError(f"profile {self.name!r}: load_slowdown must be >= 1")
        if not 1 <= self.min_output_tokens <= self.max_output_tokens:
            raise ValueError(f"profile {self.name!r}: bad output-length range")
        if (self.kind == "embedding") != (self.dimensions > 0):
            raise ValueError(
                f"profile {self.name!r}: an embedding model, and only it, has dimensions"
            )

    @property
    def supports_continuation(self) -> bool:
        """Whether ``continue_final_message`` is honoured (vLLM only)."""
        return self.flavor == "vllm"


PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            SimProfile(
                name="llama-3.1-8b-instruct",
                flavor="vllm",
                max_model_len=16384,
                max_num_seqs=32,
                ttft_base_s=0.020,
                ttft_per_prompt_token_s=0.000_05,
                itl_s=0.012,
                kv_cache_tokens=393_216,
                load_slowdown=1.5,
            ),
            SimProfile(
                name="llama-3.1-70b-instruct-awq",
                flavor="vllm",
                max_model_len=8192,
                max_num_seqs=16,
                ttft_base_s=0.060,
                ttft_per_prompt_token_s=0.000_2,
                itl_s=0.035,
                kv_cache_tokens=98_304,
                load_slowdown=2.0,
            ),
            SimProfile(
                name="bge-m3",
                flavor="vllm",
                max_model_len=8192,
                max_num_seqs=64,
                ttft_base_s=0.005,
                ttft_per_prompt_token_s=0.000_025,
                itl_s=0.0,
                kv_cache_tokens=262_144,
                enable_prefix_caching=False,
                kind="embedding",
                dimensions=1024,
            ),
            SimProfile(
                name="gpt-4o-mini",
                flavor="openai",
                max_model_len=128_000,
                max_num_seqs=1024,
                ttft_base_s=0.300,
                ttft_per_prompt_token_s=0.000_01,
                itl_s=0.008,
                kv_cache_tokens=1024 * 128_000,
                vision=True,
            ),
        )
    }
)
"""The built-in profiles by name (read-only)."""
