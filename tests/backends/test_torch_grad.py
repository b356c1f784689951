"""The torch family's backward and training step against torch autograd on the reference
(`parity_reference.backward.case_gradients` / `train_steps`): `pytorch` (that computation itself), `torch-compile`
(AOTAutograd and inductor through the compiled loss, tap gradients from zero probes) and `hf-transformers`
(autograd through transformers' own GPT2LMHeadModel / LlamaForCausalLM), on toy, toy-stress and toy-llama, in fp32
and fp64, each fixture's own training section.

A gradient's error is `tests.helpers.grad_errors`': max over cases of |got - want| over M, the largest |want| of
that gradient over the cases (the judge's M). fp64 is compared with the fp64 reference, within TIGHT (1e-12) of
M; toy-stress, built ill-conditioned (near-saturated attention), within the bound measured for the hand-written
NumPy backward there (tests/reference/test_numpy_backward.py, 2e-9). fp32 is compared with the fp64 reference
too (the truth), within LOOSE (1e-5) of M or BUDGET_FACTOR (4, the judge's margin) times the reference's own
float32 error there, whichever is larger: on the toy the reference's float32 backward is within 1e-6 of its float64
one and LOOSE decides; on toy-stress it is off by up to 0.16 of M (blocks.0.attn.hook_k.grad; the fixture's
measured `units`), so a second float32 backward can only be asked to be as good as the reference's. A wrong
adjoint is off by O(1) either way. Each test prints its measured worst (pytest -rP shows it).

The training records (each step's loss, gradient norm and every parameter, relative to each record's largest
value) follow the same rule, except the key bias: its gradient is 0 in exact arithmetic, so AdamW turns each
side's round-off into a step of up to lr; there both sides must stay within AdamW's own bound of each other
(2 x sum of lr_t x `adam_bound`: AdamW's largest possible step over those steps).

pytorch and hf-transformers on the toy run in the fast set; the rest is `full` (torch-compile compiles a loss
graph per fixture shape and precision: about 75 s each on an empty inductor cache, about 15 s once saved).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from parity_harness._backends.base import Backend
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training_section import BUDGET_FACTOR
from parity_reference.backward import case_gradients, train_steps
from parity_reference.training import TrainingSpec, adam_bound, step_key
from tests.helpers import REPO, first_over, grad_errors

TIGHT, LOOSE = 1e-12, 1e-5
BOUND = {("toy", "fp64"): TIGHT, ("toy", "fp32"): LOOSE, ("toy-stress", "fp64"): 2e-9, ("toy-stress", "fp32"): LOOSE,
         ("toy-llama", "fp64"): TIGHT, ("toy-llama", "fp32"): LOOSE}
Records = dict[str, dict[str, np.ndarray]]
FAST = {("pytorch", "toy")}  # hf-transformers imports transformers (10 s): the full set (CI) runs it


def _backend(name: str) -> Backend:
    return _backends()[name]


@functools.cache
def _backends() -> dict[str, Backend]:
    """One instance each for the module: torch-compile keeps its loss graph between `grad` and `train`."""
    out: dict[str, Backend] = {}
    try:
        from parity_harness._backends.pytorch_backend import PyTorchBackend

        out["pytorch"] = PyTorchBackend()
        from parity_harness._backends.torch_compile_backend import TorchCompileBackend

        out["torch-compile"] = TorchCompileBackend()
        from parity_harness._backends.hf_transformers_backend import HFTransformersBackend

        out["hf-transformers"] = HFTransformersBackend()
    except ImportError:  # pragma: no cover - the test below skips with the reason
        pass
    return out


def _usable(name: str) -> Backend:
    pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    backend = _backend(name)
    missing = backend.missing_dependencies()
    if missing:
        pytest.skip(f"{name}: missing {', '.join(missing)} ({backend.install_hint})")
    return backend


@functools.cache
def _fixture(name: str) -> tuple[Fixture, TrainingSpec]:
    fixture = load_fixture(REPO / "fixtures" / name)
    spec = fixture.training()
    assert spec is not None, f"{name} has no training section"
    return fixture, spec


@functools.cache
def _reference_grads(name: str, precision: str) -> dict[str, dict[str, np.ndarray]]:
    fixture, spec = _fixture(name)
    weights, config = fixture.weights(), fixture.model.config
    return {case: case_gradients(weights, config, fixture.case(case).tokens, precision) for case in spec.cases}


@functools.cache
def _reference_train(name: str, precision: str) -> dict[str, np.ndarray]:
    fixture, spec = _fixture(name)
    batch = [fixture.case(case).tokens for case in spec.cases]
    return train_steps(fixture.weights(), fixture.model.config, batch, spec, precision)


def _wide(records: Records) -> Records:
    return {case: {k: np.asarray(v, dtype=np.float64) for k, v in r.items()} for case, r in records.items()}


def _ratios(got: Records, name: str, precision: str, reference: Callable[[str, str], Records],
            order: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each record's error against the fp64 reference (in units of its M), and that error over its bound: TIGHT-like
    BOUND in fp64; in fp32 the larger of BOUND and BUDGET_FACTOR x the reference's own float32 error."""
    names = set(next(iter(got.values())))

    def pick(records: Records) -> Records:
        return {c: {k: v for k, v in r.items() if k in names} for c, r in records.items()}

    want = _wide(pick(reference(name, "fp64")))
    errors = grad_errors(_wide(got), want, order=order)
    bound = dict.fromkeys(errors, BOUND[name, precision])
    if precision == "fp32":
        own = grad_errors(_wide(pick(reference(name, "fp32"))), want, order=order)
        bound = {n: max(b, BUDGET_FACTOR * own[n]) for n, b in bound.items()}
    return errors, {n: errors[n] / bound[n] for n in errors}


def _params(backend: str, fixture: str, precision: str) -> Any:
    marks = [] if (backend, fixture) in FAST else [pytest.mark.full]
    return pytest.param(backend, fixture, precision, marks=marks, id=f"{backend}-{fixture}-{precision}")


CASES = [_params(b, f, p) for b in ("pytorch", "torch-compile", "hf-transformers")
         for f in ("toy", "toy-stress", "toy-llama") for p in ("fp32", "fp64")]


@pytest.mark.parametrize(("backend", "name", "precision"), CASES)
def test_gradients_match_autograd(backend: str, name: str, precision: str) -> None:
    """Every declared gradient of every training case, and the loss, in the precision's dtype and shape, within
    its bound; every gradient it leaves out is one its module's docstring names."""
    b = _usable(backend)
    fixture, spec = _fixture(name)
    assert b.supports_grad(fixture)
    declared = b.supported_grads(fixture)
    got = b.grad(fixture, precision)  # type: ignore[arg-type]
    assert list(got) == list(spec.cases)
    same = _reference_grads(name, precision)
    for case, records in got.items():
        assert set(records) == {"loss", *declared}, case
        for key, value in records.items():
            want = same[case][key]
            assert value.dtype == want.dtype and value.shape == want.shape, f"{case}/{key}: {value.dtype}{value.shape}"
    errors, ratios = _ratios(got, name, precision, _reference_grads, ["loss", *declared])
    first, worst, where = first_over(ratios, 1.0)
    print(f"{backend} {name} {precision}: {len(declared)}/{len(fixture.grad_names())} gradients, worst "
          f"{max(errors.values()):.3g} of M at {max(errors, key=lambda n: errors[n])}, {worst:.3g} of its bound "
          f"at {where}")
    assert first is None, f"{first} is {errors[first]:.3g} of its M, {ratios[first]:.3g} x its bound"
    left_out = sorted(set(fixture.grad_names()) - set(declared))
    if backend == "hf-transformers":  # only the taps transformers computes inside one fused call
        from parity_harness._backends.hf_transformers_backend import UNEXPOSED

        assert all(n.startswith("ln_final.") or n.removesuffix(".grad").endswith(UNEXPOSED) for n in left_out)
    else:
        assert not left_out, left_out


def _key_bias(fixture: Fixture) -> dict[str, slice]:
    """Each parameter holding a key bias, and its key part: a gradient 0 in exact arithmetic."""
    config: Any = fixture.model.config
    params = fixture.model.param_shapes()
    if fixture.family == "llama":
        return {n: slice(None) for n in params if n.endswith("self_attn.k_proj.bias")}
    d = config.d_model
    return {n: slice(d, 2 * d) for n in params if n.endswith("attn.c_attn.bias")}


@pytest.mark.parametrize(("backend", "name", "precision"), CASES)
def test_training_steps_match_torch_adamw(backend: str, name: str, precision: str) -> None:
    """Every step's loss, gradient norm and parameters, in the precision's dtype, within the bound of each
    record's own largest value; the key bias within AdamW's bound of the reference's."""
    b = _usable(backend)
    fixture, spec = _fixture(name)
    assert b.supports_training(fixture)
    got = b.train(fixture, precision)  # type: ignore[arg-type]
    same, want = _reference_train(name, precision), _reference_train(name, "fp64")
    assert set(got) == set(same)
    keys = _key_bias(fixture)

    def tight(records: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for key, value in records.items():
            rest = np.ones(value.shape, dtype=bool)
            if key.split("/", 1)[1] in keys:  # the rest of the parameter is judged tightly
                rest[keys[key.split("/", 1)[1]]] = False
            out[key] = value[rest] if value.ndim else value
        return out

    for key, value in got.items():
        assert value.dtype == same[key].dtype and value.shape == same[key].shape, key
    errors, ratios = _ratios({"": tight(got)}, name, precision, lambda n, p: {"": tight(_reference_train(n, p))},
                             list(same))
    first, worst, where = first_over(ratios, 1.0)
    print(f"{backend} {name} {precision} training: worst {max(errors.values()):.3g} of its max at "
          f"{max(errors, key=lambda n: errors[n])}, {worst:.3g} of its bound at {where}")
    assert first is None, f"{first} is {errors[first]:.3g} of its max, {ratios[first]:.3g} x its bound"
    for s in range(1, spec.steps + 1):
        drift = 2 * sum(spec.lr[t - 1] * adam_bound(spec, t) for t in range(1, s + 1))
        for param, part in keys.items():
            key = step_key(s, param)
            moved = float(np.abs(got[key][part].astype(np.float64) - want[key][part]).max())
            assert moved <= drift, f"{key}: the key bias is {moved:.3g} off, beyond AdamW's {drift:.3g}"


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_many_threads_agree_with_one_and_restore_the_count(precision: str) -> None:
    """`case_gradients(threads=None)` (torch's default count) agrees with the goldens' one thread within each
    precision's bound and leaves torch's thread count as it found it."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    fixture, spec = _fixture("toy")
    weights, config = fixture.weights(), fixture.model.config
    torch.set_num_threads(1)
    got = {case: case_gradients(weights, config, fixture.case(case).tokens, precision, threads=None)
           for case in spec.cases}
    assert torch.get_num_threads() == 1
    errors, ratios = _ratios(got, "toy", precision, _reference_grads, list(next(iter(got.values()))))
    print(f"toy {precision} on the default threads: worst {max(errors.values()):.3g} of M")
    assert max(ratios.values()) <= 1.0, first_over(ratios, 1.0)


@pytest.mark.parametrize("name", ["toy", "toy-llama"])
def test_the_lens_rows_leave_every_gradient_bit_identical(name: str) -> None:
    """`case_gradients(lens_rows=1)` (what the pytorch backend asks: one row of probs and of the logit lens, which
    are off the loss's path) gives the very bits of the goldens' call, which computes them at every position."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    fixture, spec = _fixture(name)
    weights, config = fixture.weights(), fixture.model.config
    for case in spec.cases:
        tokens = fixture.case(case).tokens
        full, one = (case_gradients(weights, config, tokens, "fp32", lens_rows=rows) for rows in (None, 1))
        assert list(one) == list(full)
        for key, want in full.items():
            assert one[key].dtype == want.dtype and one[key].tobytes() == want.tobytes(), f"{case}: {key} differs"


def test_the_backward_threads_are_one_on_the_toys_and_torchs_default_from_a_million_parameters() -> None:
    """The toys' backward runs on one thread, as their goldens were written (bit-identical); a fixture of
    THREADED_FROM parameters or more (gpt2-small) on torch's default count (within tolerance)."""
    from parity_harness._backends.pytorch_backend import THREADED_FROM, backward_threads

    for name in ("toy", "toy-stress", "toy-llama"):
        assert backward_threads(_fixture(name)[0]) == 1, name
    fixture = _fixture("toy")[0]
    d = fixture.model.config.d_model

    class Big:  # the toy's model, its embedding grown to THREADED_FROM parameters
        def __init__(self, model: Any) -> None:
            self._shapes = {**model.param_shapes(), "wte.weight": [THREADED_FROM // d + 1, d]}

        def param_shapes(self) -> dict[str, list[int]]:
            return self._shapes

    class Grown:
        model = Big(fixture.model)

    assert backward_threads(Grown()) is None  # type: ignore[arg-type]
