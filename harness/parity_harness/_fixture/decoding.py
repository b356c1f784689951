"""Incremental (key/value cache) decoding: the fixture's `decoding` section, its goldens, the requests.

A fixture may carry decoding goldens (optional and additive: format version 1 is unchanged, and a
fixture without them simply has no decoding check). The manifest then holds

    "decoding": {"steps": N, "cache_layout": ["H", "T", "d_head"], "taps": [...],
                 "prompts": [{"name", "tokens", "text", "generated", "generated_text"}],
                 "platform": {...}}
    "files": {..., "decoding": {"fp32": "golden.decode.fp32.safetensors",
                                "fp64": "golden.decode.fp64.safetensors", "onnx": "model.decode.onnx"}}

For every prompt: step 0 is the prefill (the prompt through the full forward), steps 1..N each
feed one token, `generated[k - 1]`; `generated[k]` is the greedy (argmax) token of step k's logits,
so `generated` holds N + 1 tokens and the first N are fed. The golden files hold, under
`"{prompt}/step{k}/{tap}"`, the cache of every block after step k, keys and values
`blocks.{i}.attn.cache_k|cache_v` [H, T, d_head] (T = len(prompt) + k positions), and the step's
logits `logits` [V] (the newest position's). They are made by the **full forward** over the
prompt and the fed tokens (parity_reference/model.py `run_with_taps`): position T - 1's logits, and
`hook_k`/`hook_v` of positions 0..T-1 transposed to [H, T, d_head]. So a backend's incremental
decoding is checked against the full forward, within each tier's tolerance.

A backend's decoding output (`Backend.decode`) has the same keys without the prompt prefix:
{prompt: {"step{k}/{tap}": array}}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.errors import FixtureError, ParityError
from parity_harness._core.precision import DTYPES, Precision
from parity_harness._fixture.decoding_section import (
    CACHE_LAYOUT,
    DecodeRequest,
    Decoding,
    Prompt,
    decode_tap_names,
    parse_decoding_section,
)
from parity_reference.tensor_check import DECODING_GOLDEN, Expected

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

GOLDEN_FILES: dict[Precision, str] = {
    "fp32": "golden.decode.fp32.safetensors",
    "fp64": "golden.decode.fp64.safetensors",
}
ONNX_FILE = "model.decode.onnx"
DEFAULT_STEPS = 6
# The toy's decoding prompts: (name, words). The start marker "." comes first, as in training.
DEFAULT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("the_cat", ". the cat"),
    ("a_small_bird", ". a small bird sees"),
    ("full_sentence", ". the dog eats the fish ."),
    ("single_token", "."),
)

DecodeOutput = dict[str, dict[str, np.ndarray]]  # {prompt: {"step{k}/{tap}": array}}


def step_key(step: int, tap: str) -> str:
    return f"step{step}/{tap}"


def requests_for(fixture: Fixture, requests: list[DecodeRequest] | None) -> list[DecodeRequest]:
    """`requests`, or by default the fixture's prompts fed the golden tokens; FixtureError if it has none."""
    if requests is not None:
        return requests
    decoding = fixture.decoding()
    if decoding is None:
        raise FixtureError(f"{fixture.manifest_path}: the fixture has no decoding section")
    return decoding.requests()


def parse_decoding(fixture: Fixture) -> Decoding | None:
    """The manifest's `decoding` section, checked; None when the fixture has none."""
    return parse_decoding_section(fixture.manifest, fixture.files, fixture.model.config, str(fixture.manifest_path))


def reference_decode(
    fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None, decode: Callable[..., Any]
) -> DecodeOutput:
    """Every request through `decode` (parity_reference.model.decode, llama_model.decode for a Llama fixture, or a
    patched copy): {name: {"step{k}/{tap}": array}}.

    The `pytorch` backend's decoding, the decoding goldens, and the self-test's patched reference.
    """
    from parity_reference.run import torch_params

    params = torch_params(fixture.weights(), precision)
    config = fixture.model.config  # the family's config (GPTConfig, LlamaConfig): `decode` is the family's
    out: DecodeOutput = {}
    for req in requests_for(fixture, requests):
        steps = decode(params, config, list(req.prompt), req.steps,
                       list(req.feed) if req.feed is not None else None)
        out[req.name] = steps_to_output(config.n_layer, [
            (logits.numpy(), [(k.numpy(), v.numpy()) for k, v in cache]) for logits, cache in steps
        ])
    return out


def decoding_table(fixture: Fixture, precision: Precision) -> dict[str, Expected]:
    """What a tier's decoding golden file holds: {"prompt/step{k}/tap": its dtype and shape}, every prompt,
    step and tap; FixtureError if the fixture has no decoding goldens."""
    decoding = fixture.decoding()
    if decoding is None:
        raise FixtureError(f"{fixture.manifest_path}: the fixture has no decoding goldens")
    dtype = np.dtype(DTYPES[precision]).name
    return {f"{prompt.name}/{step_key(k, tap)}": Expected((dtype,), fixture.model.decode_tap_shape(
                tap, len(prompt.tokens) + k))
            for prompt in decoding.prompts for k in range(decoding.steps + 1) for tap in decoding.taps}


def golden_decoding(fixture: Fixture, precision: Precision) -> DecodeOutput:
    """The decoding goldens of one tier {prompt: {"step{k}/{tap}": array}}, by the one checked reader (files.py):
    every key, dtype and shape of `decoding_table` against the header, nothing extra, then no NaN, one tensor at
    a time (each read-only)."""
    from parity_harness._fixture.files import open_checked, read_checked

    table = decoding_table(fixture, precision)
    path = fixture.root / fixture.files["decoding"][precision]
    out: DecodeOutput = {}
    for key, tensor in read_checked(open_checked(path, table, DECODING_GOLDEN), table, DECODING_GOLDEN):
        prompt, step = key.split("/", 1)  # a prompt's name has no "/" (the manifest's schema)
        out.setdefault(prompt, {})[step] = tensor
    return out


def steps_to_output(n_layer: int, steps: Sequence[tuple[Any, Sequence[tuple[Any, Any]]]]) -> dict[str, np.ndarray]:
    """[(logits (V,), cache [(keys, values) (H, T, dh) per block])] per step -> {"step{k}/{tap}": array}."""
    out: dict[str, np.ndarray] = {}
    for k, (logits, cache) in enumerate(steps):
        for i in range(n_layer):
            keys, values = cache[i]
            out[step_key(k, f"blocks.{i}.attn.cache_k")] = np.ascontiguousarray(np.asarray(keys))
            out[step_key(k, f"blocks.{i}.attn.cache_v")] = np.ascontiguousarray(np.asarray(values))
        out[step_key(k, "logits")] = np.asarray(logits)
    return out


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how far the greedy choice is from a tie."""
    top = np.sort(np.asarray(logits, dtype=np.float64))[::-1]
    return float(top[0] - top[1]) if top.size > 1 else float("inf")


def encode_words(text: str, vocab: Sequence[str]) -> tuple[int, ...]:
    """Words separated by spaces -> token ids, with the start marker (vocab[0], '.') put first when absent.

    ParityError naming the first unknown word.
    """
    words = text.split()
    if not words:
        raise ParityError("the prompt is empty: give at least one word")
    unknown = [w for w in words if w not in vocab]
    if unknown:
        raise ParityError(f"unknown word {unknown[0]!r} in the prompt (the vocabulary: {' '.join(vocab)})")
    ids = tuple(vocab.index(w) for w in words)
    return ids if ids[0] == 0 else (0, *ids)


__all__ = [
    "CACHE_LAYOUT",
    "DEFAULT_PROMPTS",
    "DEFAULT_STEPS",
    "GOLDEN_FILES",
    "ONNX_FILE",
    "DecodeOutput",
    "DecodeRequest",
    "Decoding",
    "Prompt",
    "decode_tap_names",
    "decoding_table",
    "encode_words",
    "golden_decoding",
    "parse_decoding",
    "reference_decode",
    "requests_for",
    "step_key",
    "steps_to_output",
    "top2_margin",
]
