"""The backend contract: a small class with a name, its precisions, and `run`.

A backend computes every case of a fixture in one precision and returns
`{case name: {tap name: numpy array}}`, one array per tap it declares in `supported_taps`, with
the manifest's shape and the precision's dtype (float32 for "fp32", float64 for "fp64"). A tap it
cannot produce is left out of `supported_taps` and reported "not supported", never silently
missing. Heavy imports (torch, onnxruntime, ...) happen inside `run`, never at import time.

Optionally, a backend decodes incrementally from a key/value cache (parity_harness/_fixture/decoding.py):
`supports_decoding(fixture)` returns True and `decode(fixture, precision, requests)` returns
`{prompt: {"step{k}/{tap}": array}}` for steps 0 (the prefill) .. N, taps
`blocks.{i}.attn.cache_k|cache_v` [H, T, d_head] and `logits` [V]. A backend without it is
"not supported" for decoding.

Two optional additions, for fixtures of GPT-2 size: a backend that sets `streams = True` also
defines `run_cases`, a generator of `(case name, {tap: array})` in the fixture's case order, and the
harness compares and drops each case as it comes (memory bounded by one case); `declines` returns
a reason to not run at all on a fixture (e.g. too big for a pure-Python interpreter), reported once
as "not supported".

Optionally, a backend computes the backward and the training step (parity_reference/training.py defines
both; `parity run --grad` judges them): `supports_grad(fixture)` returns True, `grad(fixture, precision)`
returns `{case: {"loss": array [], "{tap}.grad": array, "{param}.grad": array}}` for every case of
`fixture.training().cases` (the gradient of that case's loss, in the tap's or parameter's shape), and
`train(fixture, precision)` returns `{"step{s}/loss": [], "step{s}/grad_norm": [], "step{s}/{param}": array}`
for s = 1 .. `fixture.training().steps`. Only "fp32" and "fp64". A gradient it cannot produce is left out of
`supported_grads(fixture)` (by default every name of `fixture.grad_names()`) and reported "not supported";
`supports_training(fixture)` (by default `supports_grad`) says whether it runs the training step at all.

Optionally, for `parity attribute` (docs/attribution.md), a backend runs one layer from a given input:
`supports_layers(fixture)` returns True and `run_layer(fixture, precision, layer, stream)` computes
`layer`, one of `layer_names(n_layer)`: "blocks.{i}.attn" (LN1 + attention + the residual add, from
`stream` = the block's resid_pre [T, d]; taps `blocks.{i}.ln1.hook_scale` .. `blocks.{i}.hook_resid_mid`),
"blocks.{i}.mlp" (LN2 + MLP + the add, from resid_mid; taps `blocks.{i}.ln2.hook_scale` ..
`hook_resid_post`) or "unembed" (the final LayerNorm and the logits, from the last stream; taps
`ln_final.hook_scale`, `ln_final.hook_normalized`, `logits`, every position). `stream` is a float32
array holding values of `precision` (`Fixture.model.layer_taps(layer)` lists the layer's taps, from the
model family's table).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, ClassVar

from parity_harness._core.precision import PRECISIONS, BackendOutput, Precision, is_tier

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import numpy as np

    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture
    from parity_reference.training import TrainingSpec

__all__ = ["PRECISIONS", "Backend", "BackendOutput", "Precision", "layer_names", "module_available", "training_spec"]

def layer_names(n_layer: int) -> list[str]:
    """The layers `run_layer` computes, in dataflow order: blocks.{i}.attn, blocks.{i}.mlp, ..., unembed."""
    return [f"blocks.{i}.{part}" for i in range(n_layer) for part in ("attn", "mlp")] + ["unembed"]


def training_spec(fixture: Fixture, backend: str, precision: Precision) -> TrainingSpec:
    """The fixture's training section for a backend's `grad`/`train`, checked: one line when the precision is not
    fp32 or fp64 (BackendFailed), the fixture has none, or a training case holds a token outside the vocabulary
    (FixtureError)."""
    from parity_harness._core.errors import BackendFailed, FixtureError

    if not is_tier(precision):  # the backward's tiers
        raise BackendFailed(f"backend {backend!r}: the backward computes in fp32 and fp64 only, not {precision}")
    spec = fixture.training()
    if spec is None:
        raise FixtureError(f"{fixture.manifest_path}: the fixture has no training section (no gradient goldens)")
    vocab_size = fixture.model.config.vocab_size
    for name in spec.cases:
        bad = [t for t in fixture.case(name).tokens if not 0 <= t < vocab_size]
        if bad:
            raise FixtureError(f"case {name!r}: token id {bad[0]} out of range [0, {vocab_size})")
    return spec


def checked_tokens(what: str, tokens: Sequence[int], vocab_size: int, n_ctx: int, consequence: str = "") -> None:
    """FixtureError naming `what` (a case or a prompt) unless 1 <= len(tokens) <= n_ctx and every id is in range,
    for a backend whose runtime would not refuse them itself (`consequence`: what it would do instead)."""
    from parity_harness._core.errors import FixtureError

    if not 1 <= len(tokens) <= n_ctx:
        raise FixtureError(f"{what}: {len(tokens)} tokens, expected 1 to {n_ctx}")
    for position, token in enumerate(tokens):
        if not 0 <= int(token) < vocab_size:
            raise FixtureError(f"{what}: token id {int(token)} at position {position} out of range [0, {vocab_size})"
                               + (f" ({consequence})" if consequence else ""))


def module_available(name: str) -> bool:
    """True if `name` can be imported; a dotted name whose parent is missing is missing, not an error."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # find_spec("a.b") raises ModuleNotFoundError when `a` is missing
        return False


class Backend:
    """Subclass this, set the class attributes, and implement `run`."""

    name: ClassVar[str] = ""  # the name users type: `parity run --backends NAME`
    description: ClassVar[str] = ""  # one line for `parity backends`
    precisions: ClassVar[tuple[Precision, ...]] = ()  # what it computes in: ("fp32",), ("fp64",) or both
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules it needs, checked before running
    # The model families it implements (parity_reference/families/): a fixture of another family is declined, one
    # line, before any of its code sees it. The lesson's GPT-2 by default.
    families: ClassVar[tuple[str, ...]] = ("gpt2",)
    install_hint: ClassVar[str] = ""  # how to get them, e.g. "pip install 'parity-harness[onnx]'"
    streams: ClassVar[bool] = False  # True: `run_cases` yields one case at a time (the harness uses it)
    # True: it computes from the fixture's ONNX graph (model.onnx, ...), which embeds its own weights, not from
    # weights.safetensors. `parity check-backend` then asks it to reject a fixture without the graph instead of
    # a broken weights file (the harness checks weights.safetensors itself before any backend runs).
    runs_graph: ClassVar[bool] = False
    # False: `parity run` without --backends does not run it (said in one line); it runs when named. For a backend
    # far slower than the rest (a software GPU), so the default run stays a gate of seconds.
    by_default: ClassVar[bool] = True
    # True: it may run on a worker thread while another backend runs (`parity run --jobs 2`):
    # it changes no process-wide state while it runs (sys.stdout/stderr, warnings filters, logging levels,
    # environment variables, signal handlers, torch's global settings beyond its thread count of one).
    # False (the default, and what a plugin gets unless it says otherwise): it runs on the main thread only.
    # Not inherited: a subclass is concurrent only if it says so itself (it may patch what its parent uses).
    concurrent: ClassVar[bool] = False
    # True: what it computes is computed in another process (Node, a browser); the Python side starts it, waits,
    # and reads the results back. With `concurrent` too, `parity run` runs it on a side lane beside the other
    # backends on a fixture under 1 M parameters unless --jobs is given: its wait then overlaps their imports and
    # compute (parity_harness/_run/lanes.py). Not inherited, as `concurrent`.
    out_of_process: ClassVar[bool] = False

    def missing_dependencies(self) -> list[str]:
        """What is missing to run this backend (empty when it can run). Must be cheap: no heavy imports."""
        return [m for m in self.requires if not module_available(m)]

    def import_requirements(self) -> None:
        """Import what it computes with. With `parity run --jobs N` (N > 1), parity calls it for a concurrent
        backend just before the backend runs, holding a lock, so that no two backends import at once: a library
        half-imported on one thread can be seen half-made from another. By default it imports `requires`;
        override it where a module must be imported a certain way (openvino, without its telemetry)."""
        for module in self.requires:
            importlib.import_module(module)

    def supported_taps(self, fixture: Fixture) -> list[str]:
        """The taps this backend produces for this fixture; by default every tap of the manifest."""
        return list(fixture.tap_names)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        """Every case of `fixture` in `precision`: {case: {tap: array}}."""
        raise NotImplementedError

    def supports_decoding(self, fixture: Fixture) -> bool:
        """True when `decode` works for this fixture; by default a backend does not decode."""
        return False

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        """Prefill and decode step by step: {request name: {"step{k}/{tap}": array}}.

        `requests` default to the fixture's decoding prompts, each step fed the golden's token.
        """
        raise NotImplementedError

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Optional, with `streams = True`: yield (case name, {tap: array}) for every case, in order."""
        yield from self.run(fixture, precision).items()

    def supports_grad(self, fixture: Fixture) -> bool:
        """True when `grad` works for this fixture (`parity run --grad`); by default a backend has no backward."""
        return False

    def supported_grads(self, fixture: Fixture) -> list[str]:
        """The gradients `grad` returns for this fixture; by default every one (`fixture.grad_names()`)."""
        return list(fixture.grad_names())

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        """Each training case's loss and gradients: {case: {"loss": [], "{tap}.grad": ..., "{param}.grad": ...}}."""
        raise NotImplementedError

    def supports_training(self, fixture: Fixture) -> bool:
        """True when `train` works for this fixture; by default whenever it has a backward."""
        return self.supports_grad(fixture)

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        """The fixture's training steps: {"step{s}/loss": [], "step{s}/grad_norm": [], "step{s}/{param}": array}."""
        raise NotImplementedError

    def supports_layers(self, fixture: Fixture) -> bool:
        """True when `run_layer` works for this fixture (`parity attribute`); by default it does not."""
        return False

    def run_layer(self, fixture: Fixture, precision: Precision, layer: str,
                  stream: np.ndarray) -> dict[str, np.ndarray]:
        """One layer (`layer_names`) from `stream` [T, d] (float32, values of `precision`): {tap: array}
        for `fixture.model.layer_taps(layer)`, in the precision's container dtype."""
        raise NotImplementedError

    def declines(self, fixture: Fixture) -> str | None:
        """Why this backend does not run on `fixture` at all (reported once as not supported), or None."""
        return None

    def tap_sources(self, fixture: Fixture) -> dict[str, str] | None:
        """What stood for each tap it returns ({tap: "tensor (op node; how found)"}), when that is not the obvious
        (a user's ONNX graph, matched by value): printed and kept in the JSON's `sources`. None by default."""
        return None

    def locate_op(self, fixture: Fixture, precision: Precision, case: str, tap: str) -> str | None:
        """Where, inside the first diverging tap, the divergence starts: one line naming the op (a graph's node,
        its inputs and constants, the size of the break), or None (by default: the tap is as far as it tells).
        Called once per backend and precision whose run failed, for its first failing tap and case."""
        return None

    def build_info(self) -> str | None:
        """What it computed with, one line, for the report (after it ran): a native library's version, build and
        the CPU features it used. None by default (nothing to say beyond its name)."""
        return None
