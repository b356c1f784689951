"""The `pytorch` backend: the reference model itself (parity_reference/model.py), in fp32, fp64, fp16 and bf16.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds. In fp16 and bf16 (on the CPU) the
weights are rounded to torch.float16 / torch.bfloat16, every op computes in that dtype, and the taps
are widened to float32 arrays (exactly: the reduced precisions' container). It streams: one case at a
time. Decoding is checked in fp32 and fp64 only. It runs one layer from a given input (`run_layer`,
for `parity attribute`) with the same functions of model.py, its weights cast once per precision.

On a Llama fixture (`fixture.family == "llama"`) it runs parity_reference/llama_model.py the same way, in
the same four precisions, and decodes with its `prefill`/`decode_step` (a [n_kv_heads, T, d_head] cache);
`run_layer` is GPT-2's only.

It also runs the stored weight formats (f16, q8_0, q4_0, q4_k: parity_harness/_fixture/stored_weights.py): the
weights as that GGUF type stores them, dequantized, computed in float32, judged like any runtime given those
weights (against their goldens); exact arithmetic on them, so what it shows is the format's own cost.

Its backward (`parity run --grad`, fp32 and fp64, both families) is the goldens' own computation:
`parity_reference.backward.case_gradients` (torch autograd through the reference, every tap on the loss's path
and every parameter) for each training case, and `train_steps` (torch.optim.AdamW, one tensor at a time) on the
fixture's weights and its training batch (the manifest's `training` section). On a fixture of THREADED_FROM
parameters or more (gpt2-small) both run on torch's default thread count (`backward_threads`): a backend's
backward must agree within tolerance, not bit for bit; a smaller fixture's run on one thread, as its goldens
were written, so the toys' stay bit-identical to them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision, training_spec
from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import is_stored
from parity_harness._fixture.decoding import reference_decode
from parity_harness._fixture.stored_weights import stored_weights
from parity_reference.run import reference_taps, torch_params

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture


THREADED_FROM = 1_000_000  # parameters: a fixture this large runs its backward on torch's default thread count


def backward_threads(fixture: Fixture) -> int | None:
    """torch's thread count for a fixture's backward and training step: None (torch's default) from THREADED_FROM
    parameters, else 1 (the goldens' writer's, bit-reproducible)."""
    import math

    size = sum(math.prod(shape) for shape in fixture.model.param_shapes().values())
    return None if size >= THREADED_FROM else 1


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"
    description: ClassVar[str] = "the PyTorch reference (parity_reference/model.py); fp16 and bf16 on the CPU"
    # and the stored weight formats: the weights as f16/q8_0/q4_0/q4_k store them, computed in float32
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64", "fp16", "bf16", "f16", "q8_0", "q4_0", "q4_k")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")
    install_hint: ClassVar[str] = "pip install 'parity-harness[torch]'"

    streams: ClassVar[bool] = True  # one case at a time: memory bounded by one case
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        config = fixture.model.config
        vocab_size = config.vocab_size
        for case in fixture.cases:  # torch's embedding would raise an IndexError (a crash) on a bad id
            bad = [t for t in case.tokens if not 0 <= t < vocab_size]
            if bad:
                raise FixtureError(f"case {case.name!r}: token id {bad[0]} out of range [0, {vocab_size})")
        if is_stored(precision):  # the weights as the format stores them (dequantized), computed in float32
            weights, precision = stored_weights(fixture, precision), "fp32"
        else:
            weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        params = torch_params(weights, precision, consume=True)  # each float32 array freed once cast
        lens_rows = fixture.lens_rows()
        run_with_taps = _family_run_with_taps(fixture.family)
        for case in fixture.cases:
            yield case.name, dict(reference_taps(params, config, [case], precision,  # type: ignore[arg-type]
                                                 run_with_taps, lens_rows=lens_rows, cast=False)[case.name])

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True

    def locate_op(self, fixture: Fixture, precision: Precision, case: str, tap: str) -> str | None:
        """fp32: the aten op inside `tap` whose float32 kernel is off its float64 recomputation (torch_ops.py); the
        model is the reference itself, so nothing else can be told apart. None when every kernel agrees."""
        if precision != "fp32":
            return None
        from parity_harness._backends.torch_ops import locate_in_forward
        from parity_reference.run import torch_params

        params = torch_params(fixture.weights(), "fp32")
        forward = fixture.model.family.module("torch").run_with_taps
        tokens = list(fixture.case(case).tokens)
        return locate_in_forward(lambda: forward(params, fixture.model.config, tokens), None, fixture.tap_names, tap)

    def supports_grad(self, fixture: Fixture) -> bool:
        return True

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        from parity_reference.backward import case_gradients

        spec = training_spec(fixture, self.name, precision)
        weights, config = fixture.weights(), fixture.model.config
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        # lens_rows=1: probs and the logit lens are off the loss's path (no gradient), so one row of them, as the
        # numpy backward's forward computes them; the gradients are the same numbers
        threads = backward_threads(fixture)
        return {name: case_gradients(weights, config, fixture.case(name).tokens, precision, threads, lens_rows=1)
                for name in spec.cases}

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        from parity_reference.backward import train_steps

        spec = training_spec(fixture, self.name, precision)
        batch = [fixture.case(name).tokens for name in spec.cases]
        weights = fixture.weights()
        fixture.release_weights()
        return train_steps(weights, fixture.model.config, batch, spec, precision, threads=backward_threads(fixture))

    def supports_layers(self, fixture: Fixture) -> bool:
        return fixture.family == "gpt2"

    def run_layer(self, fixture: Fixture, precision: Precision, layer: str,
                  stream: np.ndarray) -> dict[str, np.ndarray]:
        import torch

        from parity_reference import model

        key = (str(fixture.root), precision)
        cached: dict[tuple[str, str], Any] = self.__dict__.setdefault("_layer_params", {})
        if key not in cached:
            cached.clear()  # one fixture and precision at a time
            cached[key] = torch_params(fixture.weights(), precision)
        params, config = cached[key], fixture.config
        taps: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            x = torch.tensor(np.asarray(stream), dtype=params["wte.weight"].dtype)  # (T, d)
            if layer == "unembed":
                taps["logits"] = model.unembed(x, params, config, taps, "ln_final")  # (T, V)
            else:
                name, part = layer.rsplit(".", 1)
                p = "h." + name.split(".")[1] + "."
                if part == "attn":
                    ln1 = model.layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps,
                                           taps, f"{name}.ln1")  # (T, d)
                    taps[f"{name}.hook_attn_out"] = model.attention(ln1, params, p + "attn.", config, taps,
                                                                    f"{name}.attn")  # (T, d)
                    taps[f"{name}.hook_resid_mid"] = x + taps[f"{name}.hook_attn_out"]  # (T, d)
                else:
                    ln2 = model.layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps,
                                           taps, f"{name}.ln2")  # (T, d)
                    taps[f"{name}.hook_mlp_out"] = model.mlp(ln2, params, p + "mlp.", config, taps,
                                                                f"{name}.mlp")  # (T, d)
                    taps[f"{name}.hook_resid_post"] = x + taps[f"{name}.hook_mlp_out"]  # (T, d)
        out = torch.float32 if precision in ("fp16", "bf16") else params["wte.weight"].dtype
        return {tap: t.to(out).contiguous().numpy() for tap, t in taps.items()}

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        from parity_reference import llama_model, model

        return reference_decode(fixture, precision, requests,
                                llama_model.decode if fixture.family == "llama" else model.decode)


def _family_run_with_taps(family: str) -> Any:
    """The family's `run_with_taps` (None: parity_reference.model's, reference_taps' default)."""
    if family == "llama":
        from parity_reference import llama_model

        return llama_model.run_with_taps
    return None
