"""The NumPy backend: parity_reference/numpy_model.py on every case of a fixture, in float32, float64 and fp16.

This is the backend to copy when you add one (docs/adding-a-backend.md walks through it): the
model is one plain-NumPy function per step (parity_reference/numpy_model.py); the class below casts the
weights once to the precision's dtype, checks the tokens, and yields every tap case by case.

fp16 is NumPy's float16 arithmetic: every op rounds to float16 (erf is taken in float64 and rounded, as
in the other dtypes); the taps leave as float32 arrays (the reduced precisions' container, exact). There
is no bf16: NumPy has no bfloat16 dtype, and emulating it would mean rounding after every op inside
numpy_model.py, whose matmuls would still accumulate in float32 between roundings: a model of a
bf16 kernel, not bf16 arithmetic (docs/tolerances.md, "Reduced precision").

It runs one layer from a given input (`run_layer`, for `parity attribute`) with the same functions.

On a Llama fixture (`fixture.family == "llama"`) the model is parity_reference/llama_numpy.py (forward and
decoding with its [n_kv_heads, T, d_head] cache), in the same three precisions; `run_layer` is GPT-2's only.

It has a backward, hand-written (`parity run --grad`; docs/training-port.md): `grad` and `train` run the family's
backward module (parity_reference/numpy_backward.py, llama_numpy_backward.py) in float32 and float64 only.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._core.precision import DTYPES
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest, requests_for, steps_to_output
from parity_harness._fixture.fixture import Fixture
from parity_reference.numpy_model import attention, layer_norm, mlp, unembed
from parity_reference.training import TrainingSpec

# The dtype each precision computes in (DTYPES is the dtype results are returned in).
COMPUTE: dict[Precision, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}

# Each family's hand-written backward (its `backward`, and the shared `train` taking it as `family`).
BACKWARD: dict[str, str] = {
    "gpt2": "parity_reference.numpy_backward",
    "llama": "parity_reference.llama_numpy_backward",
}
GRAD_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp64")  # the backward's tiers: no fp16


class NumpyBackend(Backend):
    """parity_reference/numpy_model.py's forward pass, on every case of a fixture."""

    name = "numpy"
    description = "plain NumPy forward pass (math.erf for the exact GELU), float32, float64 and float16"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64", "fp16")
    requires = ("numpy",)
    install_hint = "pip install numpy"
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")

    streams = True  # one case at a time (`run_cases`): memory bounded by one case
    concurrent = True  # touches no process-wide state: may run beside another backend

    def model_module(self, fixture: Fixture) -> ModuleType:
        """The module that computes (its `forward` and `decode`): the family's NumPy model, its table's `numpy`
        code (llama_numpy.py, numpy_model.py). `parity selftest` overrides it with a patched copy."""
        return fixture.model.family.module("numpy")

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        config, dtype = fixture.model.config, COMPUTE[precision]
        forward = self.model_module(fixture).forward  # llama_numpy.py's on a Llama fixture, else numpy_model.py's
        # fixture.weights() checks names, shapes and finiteness (FixtureError otherwise).
        weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: each float32 array is freed once cast (pop)
        params = {name: weights.pop(name).astype(dtype) for name in list(weights)}
        lens_rows = fixture.lens_rows()  # the positions the fixture keeps of probs and the lens
        for case in fixture.cases:
            tokens = list(case.tokens)
            # Bad input is a ParityError with one clear line, never an IndexError or garbage numbers.
            if not 1 <= len(tokens) <= config.n_ctx:
                raise FixtureError(f"case {case.name!r}: {len(tokens)} tokens, expected 1 to {config.n_ctx}")
            bad = [t for t in tokens if not 0 <= t < config.vocab_size]
            if bad:
                raise FixtureError(
                    f"case {case.name!r}: token id {bad[0]} out of range [0, {config.vocab_size})"
                )
            taps = forward(params, config, tokens, lens_rows)
            out = DTYPES[precision]  # fp16: widened to the float32 container (exact)
            yield case.name, {tap: taps[tap].astype(out, copy=False) for tap in self.supported_taps(fixture)}

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True

    def supports_layers(self, fixture: Fixture) -> bool:
        return fixture.family == "gpt2"

    def run_layer(self, fixture: Fixture, precision: Precision, layer: str,
                  stream: np.ndarray) -> dict[str, np.ndarray]:
        dtype, config = COMPUTE[precision], fixture.config
        params = {name: w.astype(dtype) for name, w in fixture.weights().items()}
        x = np.asarray(stream).astype(dtype)  # (T, d)
        taps: dict[str, np.ndarray] = {}
        if layer == "unembed":
            taps["logits"] = unembed(x, params, config, taps, "ln_final")  # (T, V)
        else:
            name, part = layer.rsplit(".", 1)
            p = "h." + name.split(".")[1] + "."
            if part == "attn":
                ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, taps,
                                 f"{name}.ln1")  # (T, d)
                taps[f"{name}.hook_attn_out"] = attention(ln1, params, p + "attn.", config, taps, f"{name}.attn")
                taps[f"{name}.hook_resid_mid"] = x + taps[f"{name}.hook_attn_out"]  # (T, d)
            else:
                ln2 = layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, taps,
                                 f"{name}.ln2")  # (T, d)
                taps[f"{name}.hook_mlp_out"] = mlp(ln2, params, p + "mlp.", config, taps, f"{name}.mlp")  # (T, d)
                taps[f"{name}.hook_resid_post"] = x + taps[f"{name}.hook_mlp_out"]  # (T, d)
        return {tap: t.astype(DTYPES[precision], copy=False) for tap, t in taps.items()}

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        """Prefill and decode every request (_fixture/decoding.py) with parity_reference/numpy_model.py."""
        dtype = DTYPES[precision]
        params = {name: w.astype(dtype) for name, w in fixture.weights().items()}
        config = fixture.model.config
        run = self.model_module(fixture).decode
        return {req.name: steps_to_output(config.n_layer, run(
                    params, config, list(req.prompt), req.steps,
                    list(req.feed) if req.feed is not None else None))
                for req in requests_for(fixture, requests)}

    # -- the backward and the training step -------------------------------------------------------------

    def backward_module(self, fixture: Fixture) -> ModuleType:
        """The module whose `backward` and `train` compute the gradients: the family's hand-written backward
        (BACKWARD). A selftest mutant of the backward overrides it with a patched copy."""
        return importlib.import_module(BACKWARD[fixture.family])

    def supports_grad(self, fixture: Fixture) -> bool:
        return fixture.family in BACKWARD

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        """Each training case's loss and every gradient of `supported_grads`, from the family's `backward`."""
        params, spec = self._grad_inputs(fixture, precision)
        module, config, names = self.backward_module(fixture), fixture.model.config, self.supported_grads(fixture)
        out: dict[str, dict[str, np.ndarray]] = {}
        for name in spec.cases:
            loss, grads = module.backward(params, config, _training_tokens(fixture, name))
            out[name] = {"loss": loss, **{n: grads[n] for n in names}}
        return out

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        """The fixture's training steps (AdamW on its batch), from the family's backward module's `train`."""
        params, spec = self._grad_inputs(fixture, precision)
        module = self.backward_module(fixture)
        batch = [_training_tokens(fixture, name) for name in spec.cases]
        records: dict[str, np.ndarray] = module.train(params, fixture.model.config, batch, spec, family=module)
        return records

    def _grad_inputs(self, fixture: Fixture, precision: Precision) -> tuple[dict[str, np.ndarray], TrainingSpec]:
        """The weights in the precision's dtype and the fixture's training spec, or one clear error."""
        if precision not in GRAD_PRECISIONS:
            raise BackendFailed(f"numpy: no backward in {precision} (only {', '.join(GRAD_PRECISIONS)})")
        spec = fixture.training()
        if spec is None:
            raise FixtureError(f"{fixture.manifest_path}: the fixture has no training section (no gradient goldens)")
        dtype = COMPUTE[precision]
        weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: the float32 copy is freed once cast
        return {name: weights.pop(name).astype(dtype) for name in list(weights)}, spec


def _training_tokens(fixture: Fixture, name: str) -> list[int]:
    """A training case's tokens, checked as the forward checks them (and >= 2 tokens: a loss needs one cell)."""
    config, tokens = fixture.model.config, list(fixture.case(name).tokens)
    if not 2 <= len(tokens) <= config.n_ctx:
        raise FixtureError(f"case {name!r}: {len(tokens)} tokens, a training case needs 2 to {config.n_ctx}")
    bad = [t for t in tokens if not 0 <= t < config.vocab_size]
    if bad:
        raise FixtureError(f"case {name!r}: token id {bad[0]} out of range [0, {config.vocab_size})")
    return tokens
