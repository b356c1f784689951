"""`parity export --from-hf CHECKPOINT_DIR --fixture DIR`: a fixture of a local Hugging Face GPT-2 or Llama checkpoint.

Reads `config.json` and `model.safetensors` (never pickle: a `pytorch_model.bin` is refused) of a
`GPT2LMHeadModel` / `GPT2Model` checkpoint, with or without the `transformer.` prefix; `lm_head.weight`
must equal `wte.weight` (tied embeddings, as GPT-2's are) and is dropped; the causal-mask buffers of
older checkpoints (`attn.bias`, `attn.masked_bias`) are dropped. Nothing is downloaded.

Exact or refused: the checkpoint is checked before any golden is computed, and anything parity
cannot represent faithfully is one line naming the file and the field or tensor.
- `config.json` is strict JSON (parity_harness/_core/strict_json.py); its integer fields are JSON integers
  (2.9 and true are refused, not truncated); `model_type` is `gpt2` and `architectures` GPT-2's;
  the attention switches parity does not compute are refused.
- Weights: F32 as they are; F16 and BF16 widened to float32, which is exact; F64 only when every
  value is a float32; integer (quantized), boolean and 8-bit float tensors are refused. The source
  dtype goes into `provenance.source_dtype`. Two keys for one parameter (`transformer.wte.weight`
  and `wte.weight`) are refused, not resolved.
- The activation: GPT-2's checkpoints say `"activation_function": "gelu_new"`, GPT-2's own tanh approximation
  of GELU, and parity's GPT-2 family computes it (config `activation: "gelu_new"`), so such a checkpoint is
  taken as it is. transformers' other names for the same formula and constants (`gelu_pytorch_tanh`: torch's
  fused tanh kernel; `gelu_python_tanh`; `gelu_accurate`) differ from it only by rounding, and are taken as
  `gelu_new` too. `"gelu"` (the exact erf GELU) is taken as it is. `--exact-gelu` takes a tanh-GELU
  checkpoint's weights with the exact GELU instead: a different model (up to ~5e-4 per activation), which
  `provenance.activation` says. `gelu_fast` (the tanh GELU with sqrt(2/pi) cut to 0.7978845608) is not
  parity's gelu_new and is taken only under `--exact-gelu`; any other activation (relu, silu, ...) is refused
  with or without the flag.

A checkpoint of another family is read by that family's authoring module (its table's `authoring`), which
names the `model_type`s it reads (`HF_MODEL_TYPES`): the Llama family's is `_authoring/llama_family.py`.

The fixture is written like a preset's (parity_harness/_authoring/presets.py): probs and the logit lens on the last
positions, per-tap tolerances, both ONNX graphs; it is built in a temporary directory beside the
target and renamed into place only when complete, so a failed export leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.strict_json import load_json_object
from parity_harness._fixture.files import fixture_errors
from parity_harness._fixture.model_spec import DEFAULT_FAMILY
from parity_reference.config import Activation, GPTConfig, param_shapes
from parity_reference.families import family_names, load_family
from parity_reference.tensor_check import Expected, TensorKind, check_table, check_values

Progress = Callable[[str], None]
EXACT = "gelu"  # the exact erf GELU: transformers' "gelu", parity's activation "gelu"
# transformers' names for GPT-2's tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the same formula and
# constants (NewGELUActivation; GELUTanh: torch's fused kernel, or its Python twin; AccurateGELUActivation):
# parity's activation "gelu_new"
GELU_NEW = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate")
# a tanh GELU whose constant is not sqrt(2/pi) (FastGELUActivation's 0.7978845608): not parity's gelu_new
OTHER_TANH = ("gelu_fast",)
TANH_GELU = (*GELU_NEW, *OTHER_TANH)  # what --exact-gelu may replace with the exact GELU
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
DROPPED_BUFFERS = (".attn.bias", ".attn.masked_bias")
WIDENED_EXACTLY = ("F32", "F16", "BF16")  # safetensors dtypes whose every value is a float32
# transformers' GPT2Config defaults, for a field config.json leaves out
INT_FIELDS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
MUST_BE = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "scale_attn_weights": True,
           "add_cross_attention": False}


@dataclass(frozen=True)
class HFConfig:
    """What parity takes from config.json."""

    config: GPTConfig
    activation: str
    tied: bool  # tie_word_embeddings


def _show(value: object) -> str:
    return json.dumps(value)[:40]


def _positive_int(path: Path, key: str, value: object) -> int:
    """A JSON integer >= 1: not 2.9 (truncated once), not true, not "12"."""
    if type(value) is not int or value < 1:
        raise FixtureError(f"{path}: {key} must be a positive integer, got {_show(value)}")
    return value


def read_hf_config(path: Path) -> HFConfig:
    """parity's config from a transformers GPT2Config's config.json (strict JSON, every field checked)."""
    if not path.exists():
        raise FixtureError(f"{path}: file not found (a Hugging Face checkpoint directory holds config.json)")
    raw = load_json_object(path, "config")
    if raw.get("model_type") != "gpt2":
        raise FixtureError(f"{path}: model_type {_show(raw.get('model_type'))} is not \"gpt2\"")
    architectures = raw.get("architectures", list(ARCHITECTURES[:1]))
    if (not isinstance(architectures, list) or not architectures
            or any(a not in ARCHITECTURES for a in architectures)):
        raise FixtureError(f"{path}: architectures {_show(architectures)} is not GPT-2's "
                           f"({' or '.join(ARCHITECTURES)})")
    ints = {key: _positive_int(path, key, raw.get(key, default)) for key, default in INT_FIELDS.items()}
    n_inner = raw.get("n_inner")  # null: 4 * n_embd
    d_mlp = None if n_inner is None else _positive_int(path, "n_inner", n_inner)
    eps = raw.get("layer_norm_epsilon", 1e-5)
    if type(eps) not in (int, float) or not eps > 0:
        raise FixtureError(f"{path}: layer_norm_epsilon must be a positive number, got {_show(eps)}")
    for key, required in MUST_BE.items():
        value = raw.get(key, required)
        if type(value) is not bool:
            raise FixtureError(f"{path}: {key} must be true or false, got {_show(value)}")
        if value is not required:
            raise FixtureError(f"{path}: {key} is {_show(value)}; parity's GPT-2 attention needs "
                               f"{_show(required)} (its reference does not compute the other)")
    tied = raw.get("tie_word_embeddings", True)
    if type(tied) is not bool:
        raise FixtureError(f"{path}: tie_word_embeddings must be true or false, got {_show(tied)}")
    activation = raw.get("activation_function", "gelu_new")
    if not isinstance(activation, str):
        raise FixtureError(f"{path}: activation_function must be a string, got {_show(activation)}")
    d = ints["n_embd"]
    try:
        config = GPTConfig(
            vocab_size=ints["vocab_size"], n_ctx=ints["n_positions"], d_model=d,
            n_layer=ints["n_layer"], n_head=ints["n_head"], d_mlp=d_mlp or 4 * d,
            positions="learned", ln_eps=float(eps), causal=True,
        )
    except ValueError as exc:
        raise FixtureError(f"{path}: unusable GPT-2 config ({exc})") from None
    return HFConfig(config, activation, tied)


def check_activation(path: Path, activation: str, exact_gelu: bool) -> Activation:
    """The config's `activation` for a checkpoint's `activation_function`: "gelu" as it is, GPT-2's tanh GELU (any
    name of its formula) as "gelu_new", or "gelu" for a tanh GELU under --exact-gelu; FixtureError for an
    activation parity would silently change."""
    if activation == EXACT:
        return "gelu"
    if activation in TANH_GELU and exact_gelu:
        return "gelu"
    if activation in GELU_NEW:
        return "gelu_new"
    if activation in OTHER_TANH:
        raise FixtureError(
            f"{path}: activation_function is {activation!r}, a tanh GELU with sqrt(2/pi) cut to 0.7978845608: not "
            f"GPT-2's gelu_new ({', '.join(GELU_NEW)}), which parity computes; pass --exact-gelu to take these "
            "weights with the exact GELU (a different model, by up to ~5e-4 per activation)"
        )
    flag = " (--exact-gelu replaces only a tanh approximation of GELU)" if exact_gelu else ""
    raise FixtureError(f"{path}: activation_function {activation!r} is not one parity computes: it computes "
                       f"the exact GELU ('gelu') and GPT-2's tanh GELU ({', '.join(GELU_NEW)}){flag}; refused "
                       "rather than changed")


HF_WEIGHTS = TensorKind("tensor", finite=True, dtype_note=(
    f"; parity reads floating-point weights only ({', '.join(WIDENED_EXACTLY)}, widened exactly to float32; F64 "
    "when every value is a float32), and refuses to cast others"))


def _checked_tensors(f: Any, path: Path, keys: dict[str, str], expected: dict[str, tuple[int, ...]],
                     tied_head: str | None) -> dict[str, tuple[np.ndarray, str]]:
    """The tensors of an open checkpoint (`keys`: parity's name -> the checkpoint's key) checked by the one tensor
    check (parity_reference/tensor_check.py), each read exactly as float32: {name: (the array, its stored dtype)}.

    The table is `expected`, under the checkpoint's key where it has one (a message names what the file holds),
    plus `lm_head.weight` with the embedding's (`tied_head`) shape when the checkpoint has one to be compared:
    every parameter present, nothing else, a dtype of `WIDENED_EXACTLY` or F64, its shape (from the header,
    before any tensor is read); then each tensor widened (`_float32`) and finite. FixtureError otherwise."""
    allowed = (*WIDENED_EXACTLY, "F64")
    table = {keys.get(name, name): Expected(allowed, shape) for name, shape in expected.items()}
    if tied_head is not None and "lm_head.weight" in keys:
        table[keys["lm_head.weight"]] = Expected(allowed, expected[tied_head])
    found = {key: (str(f.get_slice(key).get_dtype()), tuple(f.get_slice(key).get_shape())) for key in keys.values()}
    with fixture_errors():
        check_table(path, found, table, HF_WEIGHTS)
    return {name: (_float32(path, key, found[key][0], f.get_tensor(key)), found[key][0])  # one at a time
            for name, key in keys.items()}


def _float32(path: Path, key: str, dtype: str, tensor: Any) -> np.ndarray:
    """A safetensors tensor (torch) as float32, exactly, its values finite (`check_values`), or FixtureError
    naming the tensor."""
    import torch

    wide = tensor.to(torch.float64 if dtype == "F64" else torch.float32)  # F16, BF16 -> float32 is exact
    with fixture_errors():
        check_values(path, key, wide.numpy(), HF_WEIGHTS)
    if dtype != "F64":
        return np.ascontiguousarray(wide.numpy())
    narrowed = wide.to(torch.float32)
    if not torch.equal(narrowed.to(torch.float64), wide):
        raise FixtureError(f"{path}: tensor {key!r} is F64 with values float32 cannot hold; parity's weights "
                           "are float32 and it refuses to round them")
    return np.ascontiguousarray(narrowed.numpy())


def _dtype_summary(dtypes: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for dtype in dtypes.values():
        counts[dtype] = counts.get(dtype, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{d} ({n} tensor{'s' if n > 1 else ''})" for d, n in sorted(counts.items()))


def read_hf_weights(path: Path, config: GPTConfig, tied: bool = True) -> tuple[dict[str, np.ndarray], str]:
    """The checkpoint's tensors under parity's names, exactly as float32, and the source dtype(s)."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise FixtureError(f"{path}: file not found (parity reads model.safetensors, never a pickled .bin)")
    expected = param_shapes(config)
    try:
        with safe_open(str(path), framework="pt") as f:
            keys: dict[str, str] = {}  # parity's name -> the checkpoint's key
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = key.removeprefix("transformer.")
                if name in keys:
                    raise FixtureError(f"{path}: tensors {keys[name]!r} and {key!r} are the same parameter "
                                       f"{name!r}; refused rather than choosing one")
                keys[name] = key
            keys = {name: key for name, key in keys.items() if not name.endswith(DROPPED_BUFFERS)}
            if "lm_head.weight" not in keys and not tied:
                raise FixtureError(f"{path}: config.json says tie_word_embeddings false, and there is no "
                                   "lm_head.weight; transformers would initialize it at random")
            read = _checked_tensors(f, path, keys, expected, tied_head="wte.weight")
    except SafetensorError as exc:
        raise FixtureError(f"{path}: not a readable safetensors file ({exc})") from None
    lm_head = read.pop("lm_head.weight", None)
    if lm_head is not None and not np.array_equal(lm_head[0], read["wte.weight"][0]):
        raise FixtureError(f"{path}: lm_head.weight differs from wte.weight; parity's GPT-2 ties its embeddings")
    return {name: read[name][0] for name in expected}, _dtype_summary({name: read[name][1] for name in expected})


def read_vocab(root: Path, vocab_size: int) -> list[str]:
    """The tokens of vocab.json when the checkpoint has one (strict JSON), else "<id>" placeholders."""
    vocab = [f"<{i}>" for i in range(vocab_size)]
    path = root / "vocab.json"
    if not path.is_file():
        return vocab
    table = load_json_object(path, "vocabulary (token -> id)")
    for token, i in table.items():
        if type(i) is int and 0 <= i < vocab_size:
            vocab[i] = token
    return vocab


def model_type(path: Path) -> object:
    """config.json's `model_type` (the file read as strict JSON), or None when it has none."""
    if not path.exists():
        raise FixtureError(f"{path}: file not found (a Hugging Face checkpoint directory holds config.json)")
    return load_json_object(path, "config").get("model_type")


def export_from_hf(checkpoint: Path, root: Path, exact_gelu: bool = False, long: bool = False,
                   progress: Progress = print, with_onnx: bool = True, seed: int = 0) -> None:
    """Write the fixture of `checkpoint` into `root` (see the module docstring)."""
    from parity_harness._authoring.presets import PRESETS, make_cases, write_scaled_fixture
    from parity_harness._fixture.platforms import current_platform

    say: Progress = lambda message: progress(f"parity export: {message}")  # noqa: E731
    if not checkpoint.is_dir():
        raise FixtureError(f"{checkpoint}: not a directory (a Hugging Face checkpoint: config.json, model.safetensors)")
    kind = model_type(checkpoint / "config.json")
    for name in family_names():
        authoring = load_family(name).module("authoring")
        if kind in getattr(authoring, "HF_MODEL_TYPES", ()) and name != DEFAULT_FAMILY:
            if exact_gelu:
                raise FixtureError(f"{checkpoint / 'config.json'}: --exact-gelu is for GPT-2 checkpoints; this is a "
                                   f"{name} checkpoint (model_type {kind!r})")
            authoring.export_from_hf(checkpoint, root, long, say, seed, with_onnx)
            return
    hf = read_hf_config(checkpoint / "config.json")
    activation = hf.activation
    config = replace(hf.config, activation=check_activation(checkpoint / "config.json", activation, exact_gelu))
    weights, source_dtype = read_hf_weights(checkpoint / "model.safetensors", config, hf.tied)
    vocab = read_vocab(checkpoint, config.vocab_size)
    say(f"checkpoint {checkpoint.name}: V {config.vocab_size}, context {config.n_ctx}, d {config.d_model}, "
        f"{config.n_layer} blocks of {config.n_head} heads, activation {activation!r}, weights {source_dtype}")
    small = PRESETS["gpt2-small"]
    lengths = (*small.lengths, config.n_ctx) if long else small.lengths
    cases = make_cases(config, lengths, seed)
    if config.activation == "gelu_new":
        note = f"gelu_new, GPT-2's tanh GELU (the checkpoint's own {activation!r})"
    elif activation == EXACT:
        note = "exact GELU (the checkpoint's own)"
    else:
        note = f"exact GELU, not the checkpoint's {activation!r} (--exact-gelu)"
    # Built beside `root` and swapped in, validated first; a failure leaves nothing
    # (parity_harness/_core/safe_write.py).
    write_scaled_fixture(root, config, weights, cases, vocab, {
        "checkpoint": checkpoint.name, "activation": note, "source_dtype": source_dtype, "seed": seed,
        "command": "parity export --from-hf" + (" --exact-gelu" if exact_gelu else "") + (" --long" if long else ""),
        "platform": current_platform(),
    }, say, with_onnx)
