"""An example parity backend in its own package: a minimal float64 forward pass in NumPy.

Registered in this package's pyproject.toml under the `parity.backends` entry-point group as
`example-numpy64`. It is self-contained on purpose (parity's own NumPy backend is not imported):
everything a backend needs from parity is `Backend`, the fixture it is given, and `FixtureError`.

It produces a subset of the taps (the residual stream and the outputs); the others are left out
of `supported_taps` and reported "not supported". Set PARITY_EXAMPLE_PLUGIN_BUG=1 to compute the
positions in float32: the fp64 tier then fails at `hook_pos_embed` (a demo of what parity catches).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from parity_harness.plugin import Backend, BackendOutput, Fixture, FixtureError, Precision

BUG_ENV = "PARITY_EXAMPLE_PLUGIN_BUG"
_erf = np.frompyfunc(math.erf, 1, 1)  # math.erf on every element (float64, correctly rounded)


def _wanted(tap: str) -> bool:
    """The taps this backend produces: the residual stream and everything after the last block."""
    return not tap.startswith("blocks.") or tap.endswith(
        ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")
    )


def _layer_norm(
    x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output, scale, normalized) of a LayerNorm with the biased variance."""
    centered = x - x.mean(-1, keepdims=True)  # (T, d)
    scale = np.sqrt((centered * centered).mean(-1, keepdims=True) + eps)  # (T, 1)
    normalized = centered / scale  # (T, d)
    return normalized * g + b, scale, normalized


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))  # same shape as z
    return e / e.sum(-1, keepdims=True)  # type: ignore[no-any-return]


def _forward(
    w: dict[str, np.ndarray], fixture: Fixture, tokens: list[int], bug: bool
) -> dict[str, np.ndarray]:
    """Every tap of one sequence, float64 throughout (positions in float32 when `bug`)."""
    c = fixture.config
    T, H, dh = len(tokens), c.n_head, c.d_head
    taps: dict[str, np.ndarray] = {"hook_embed": w["wte.weight"][tokens]}  # (T, d)
    if c.positions == "learned":
        pos = w["wpe.weight"][:T]  # (T, d)
    else:
        ftype: type[np.floating[Any]] = np.float32 if bug else np.float64  # the demo bug: float32 here
        pair = np.arange(0, c.d_model, 2).astype(ftype)  # (d/2,) = 2i
        inv_freq = np.power(ftype(10000.0), -pair / ftype(c.d_model))  # (d/2,)
        angle = np.arange(T).astype(ftype)[:, None] * inv_freq  # (T, d/2)
        pos = np.zeros((T, c.d_model))  # (T, d)
        pos[:, 0::2], pos[:, 1::2] = np.sin(angle), np.cos(angle)
    taps["hook_pos_embed"] = pos
    x = taps["hook_embed"] + pos  # (T, d)
    streams = [x]
    for i in range(c.n_layer):
        p, name = f"h.{i}.", f"blocks.{i}"
        taps[f"{name}.hook_resid_pre"] = x
        h, _, _ = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], c.ln_eps)  # (T, d)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # (T, 3d)
        q, k, v = (m.reshape(T, H, dh).transpose(1, 0, 2) for m in np.split(qkv, 3, axis=-1))  # (H, T, dh)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(dh)  # (H, T, T)
        if c.causal:
            scores[:, np.triu(np.ones((T, T), dtype=bool), k=1)] = -np.inf
        z = (_softmax(scores) @ v).transpose(1, 0, 2).reshape(T, c.d_model)  # (T, d)
        x = x + z @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]  # (T, d)
        taps[f"{name}.hook_resid_mid"] = x
        h, _, _ = _layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], c.ln_eps)  # (T, d)
        pre = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]  # (T, d_mlp)
        post = 0.5 * pre * (1.0 + _erf(pre / math.sqrt(2.0)).astype(np.float64))  # (T, d_mlp), exact GELU
        x = x + post @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]  # (T, d)
        taps[f"{name}.hook_resid_post"] = x
        streams.append(x)
    ln, scale, normalized = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], c.ln_eps)  # (T, d)
    taps["ln_final.hook_scale"], taps["ln_final.hook_normalized"] = scale, normalized
    taps["logits"] = ln @ w["wte.weight"].T  # (T, V), tied embeddings
    taps["probs"] = _softmax(taps["logits"])  # (T, V)
    for n, stream in enumerate(streams):  # the logit lens
        lens, _, _ = _layer_norm(stream, w["ln_f.weight"], w["ln_f.bias"], c.ln_eps)  # (T, d)
        taps[f"logit_lens.{n}"] = _softmax(lens @ w["wte.weight"].T)  # (T, V)
    return taps


class ExampleBackend(Backend):
    """A float64-only backend with a subset of the taps."""

    name = "example-numpy64"
    description = "example plugin: minimal NumPy forward pass, float64, residual stream and outputs only"
    precisions = ("fp64",)
    requires = ("numpy",)
    install_hint = "pip install ./examples/plugin"

    def declines(self, fixture: Fixture) -> str | None:
        if fixture.config.activation != "gelu":  # GPT-2's tanh gelu_new: this example computes the exact GELU only
            return f"computes the exact GELU only, not this fixture's {fixture.config.activation!r}"
        return None

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [t for t in fixture.tap_names if _wanted(t)]  # manifest order = dataflow order

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        bug = os.environ.get(BUG_ENV, "") not in ("", "0")
        weights = {k: v.astype(np.float64) for k, v in fixture.weights().items()}
        taps = self.supported_taps(fixture)
        out: BackendOutput = {}
        for case in fixture.cases:
            if any(not 0 <= t < fixture.config.vocab_size for t in case.tokens):
                raise FixtureError(
                    f"case {case.name!r}: token id out of range [0, {fixture.config.vocab_size})"
                )
            result = _forward(weights, fixture, list(case.tokens), bug)
            out[case.name] = {t: result[t] for t in taps}
        return out
