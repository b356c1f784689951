"""`parity export --from-hf CHECKPOINT_DIR --fixture DIR`: a fixture of a local Hugging Face GPT-2 checkpoint.

Reads `config.json` and `model.safetensors` (never pickle: a `pytorch_model.bin` is refused) of a
`GPT2LMHeadModel` / `GPT2Model` checkpoint, with or without the `transformer.` prefix; `lm_head.weight`
must equal `wte.weight` (tied embeddings, as GPT-2's are) and is dropped; the causal-mask buffers of
older checkpoints (`attn.bias`, `attn.masked_bias`) are dropped. Nothing is downloaded.

The activation: GPT-2's checkpoints say `"activation_function": "gelu_new"`, the tanh approximation,
while parity's reference (and every backend) computes the exact erf GELU. The two differ by up to
~5e-4 per activation, so a gelu_new checkpoint is refused unless `--exact-gelu` says to take its
weights with the exact GELU: the fixture is then the exact-GELU model with those weights (not what
transformers computes for that checkpoint), and `provenance.activation` says so. A checkpoint with
`"gelu"` is taken as is. The fixture is written like a preset's (harness/presets.py): probs and the
logit lens on the last positions, per-tap tolerances, both ONNX graphs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import FixtureError
from reference.config import GPTConfig, param_shapes

Progress = Callable[[str], None]
EXACT = "gelu"  # the exact erf GELU: transformers' "gelu", parity's only activation
DROPPED_BUFFERS = (".attn.bias", ".attn.masked_bias")


def read_hf_config(path: Path) -> tuple[GPTConfig, str]:
    """parity's config from a transformers GPT2Config's config.json, and its activation_function."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FixtureError(f"{path}: file not found (a Hugging Face checkpoint directory holds config.json)") from None
    except (OSError, ValueError) as exc:
        raise FixtureError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise FixtureError(f"{path}: not a JSON object")
    if raw.get("model_type", "gpt2") != "gpt2":
        raise FixtureError(f"{path}: model_type {raw.get('model_type')!r} is not 'gpt2'")
    try:
        d = int(raw.get("n_embd", 768))
        config = GPTConfig(
            vocab_size=int(raw.get("vocab_size", 50257)), n_ctx=int(raw.get("n_positions", 1024)), d_model=d,
            n_layer=int(raw.get("n_layer", 12)), n_head=int(raw.get("n_head", 12)),
            d_mlp=int(raw.get("n_inner") or 4 * d), positions="learned",
            ln_eps=float(raw.get("layer_norm_epsilon", 1e-5)), causal=True,
        )
    except (TypeError, ValueError) as exc:
        raise FixtureError(f"{path}: unusable GPT-2 config ({exc})") from None
    if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("reorder_and_upcast_attn"):
        raise FixtureError(f"{path}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not GPT-2's "
                           "attention; parity's reference does not compute them")
    if raw.get("scale_attn_weights") is False:
        raise FixtureError(f"{path}: scale_attn_weights is false; parity's attention always divides by sqrt(d_head)")
    return config, str(raw.get("activation_function", "gelu_new"))


def read_hf_weights(path: Path, config: GPTConfig) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under parity's names, float32, checked against the config."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise FixtureError(f"{path}: file not found (parity reads model.safetensors, never a pickled .bin)")
    expected = param_shapes(config)
    weights: dict[str, np.ndarray] = {}
    lm_head: np.ndarray | None = None
    try:
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = key.removeprefix("transformer.")
                if name.endswith(DROPPED_BUFFERS):
                    continue
                tensor = f.get_tensor(key)
                if name == "lm_head.weight":
                    lm_head = tensor
                    continue
                if name not in expected:
                    raise FixtureError(f"{path}: unexpected tensor {key!r} (not a GPT-2 parameter)")
                if tuple(tensor.shape) != expected[name]:
                    raise FixtureError(f"{path}: tensor {key!r} has shape {list(tensor.shape)}, "
                                       f"expected {list(expected[name])}")
                weights[name] = np.ascontiguousarray(tensor, dtype=np.float32)
    except SafetensorError as exc:
        raise FixtureError(f"{path}: not a readable safetensors file ({exc})") from None
    missing = [n for n in expected if n not in weights]
    if missing:
        raise FixtureError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing)")
    if lm_head is not None and not np.array_equal(lm_head.astype(np.float32), weights["wte.weight"]):
        raise FixtureError(f"{path}: lm_head.weight differs from wte.weight; parity's GPT-2 ties its embeddings")
    bad = [n for n, w in weights.items() if not np.isfinite(w).all()]
    if bad:
        raise FixtureError(f"{path}: tensor {bad[0]!r} has non-finite values")
    return {name: weights[name] for name in expected}


def read_vocab(root: Path, vocab_size: int) -> list[str]:
    """The tokens of vocab.json when the checkpoint has one, else "<id>" placeholders."""
    vocab = [f"<{i}>" for i in range(vocab_size)]
    path = root / "vocab.json"
    if path.is_file():
        try:
            table: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return vocab
        if isinstance(table, dict):
            for token, i in table.items():
                if isinstance(i, int) and 0 <= i < vocab_size and isinstance(token, str):
                    vocab[i] = token
    return vocab


def export_from_hf(checkpoint: Path, root: Path, exact_gelu: bool = False, long: bool = False,
                   progress: Progress = print, with_onnx: bool = True, seed: int = 0) -> None:
    """Write the fixture of `checkpoint` into `root` (see the module docstring)."""
    from harness.platforms import current_platform
    from harness.presets import PRESETS, make_cases, write_scaled_fixture

    say: Progress = lambda message: progress(f"parity export: {message}")  # noqa: E731
    if not checkpoint.is_dir():
        raise FixtureError(f"{checkpoint}: not a directory (a Hugging Face checkpoint: config.json, model.safetensors)")
    config, activation = read_hf_config(checkpoint / "config.json")
    if activation != EXACT and not exact_gelu:
        raise FixtureError(
            f"{checkpoint / 'config.json'}: activation_function is {activation!r}, but parity computes the exact "
            "GELU ('gelu'); pass --exact-gelu to take these weights with the exact GELU (the fixture then "
            "differs from what transformers computes for this checkpoint, by up to ~5e-4 per activation)"
        )
    weights = read_hf_weights(checkpoint / "model.safetensors", config)
    say(f"checkpoint {checkpoint.name}: V {config.vocab_size}, context {config.n_ctx}, d {config.d_model}, "
        f"{config.n_layer} blocks of {config.n_head} heads, activation {activation!r}")
    small = PRESETS["gpt2-small"]
    lengths = (*small.lengths, config.n_ctx) if long else small.lengths
    cases = make_cases(config, lengths, seed)
    note = ("exact GELU (the checkpoint's own)" if activation == EXACT else
            f"exact GELU, not the checkpoint's {activation!r} (--exact-gelu)")
    write_scaled_fixture(root, config, weights, cases, read_vocab(checkpoint, config.vocab_size), {
        "checkpoint": checkpoint.name, "activation": note, "seed": seed,
        "command": "parity export --from-hf" + (" --exact-gelu" if exact_gelu else "") + (" --long" if long else ""),
        "platform": current_platform(),
    }, say, with_onnx)
