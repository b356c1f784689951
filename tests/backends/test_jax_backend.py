"""The `jax` backend: both families written in jax.numpy, its backward by jax.grad and AdamW in jax.numpy.

Forward: `parity run --backends jax` (the API, the same path) passes every tap of the committed fixtures in both
its precisions, gradients and training steps included (`grad=True`: the gradient goldens' judge), and on
configurations no committed fixture has (GPT-2's learned positions with gelu_new, a non-causal GPT-2; a Llama with
interleaved RoPE, tied embeddings, attention biases and one key/value head; a Llama without grouping) every tap
agrees with the torch reference run on the same weights: fp64 within 1e-12, fp32 within 1e-5 (+ 1e-5 relative).

Backward: every gradient of every training case, and the loss, against torch autograd on the reference
(`parity_reference.backward.case_gradients`), and the training steps against `train_steps` (torch.optim.AdamW).
A gradient's error is `tests.helpers.grad_errors`': max over cases of |jax - torch| over M, the largest |torch|
of that gradient. Bounds: fp64 1e-12 of M (toy-stress, built ill-conditioned: 2e-9, the bound measured for the
NumPy backward there); fp32 1e-5 of M. On toy-stress the reference's own float32 backward is far from its float64
one (up to 16% of M at blocks.0.attn.hook_k.grad: near-saturated attention, logits of thousands), so two float32
backwards differ by more than 1e-5 there (jax's by 6e-4 of M from torch's): in fp32 each gradient's error against
the float64 reference must instead be at most twice the float32 reference's own (measured: at most 1.25 times),
and each training record's at most 4 times (measured: 3.2 times, step3/loss: after two steps, every element whose
gradient float32 cannot resolve has been moved by up to lr in a direction its round-off chose, differently on
each side; 4 is the gradient judge's own factor over a measured budget, training.units).
The training records use the same rules, each relative to its own largest value, except the key bias: its
gradient is 0 in exact arithmetic, so AdamW turns each side's round-off into a step of up to lr; there the two
must stay within AdamW's own bound of each other. Each test prints its worst.

The toy and toy-llama run in the fast set; toy-stress and the configurations of no fixture are `full`.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.jax_backend import JaxBackend, padded_length
from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_reference.backward import case_gradients, lesson_spec, train_steps
from parity_reference.config import GPTConfig
from parity_reference.families import load_family
from parity_reference.llama_config import LlamaConfig
from parity_reference.training import TrainingSpec, adam_bound, backward_names, has_backward, step_key
from tests.helpers import REPO, first_over, grad_errors

pytest.importorskip("jax", reason="jax is not installed (pip install 'parity-harness[jax]')")
torch = pytest.importorskip("torch", reason="the reference's backward is torch autograd")

TIGHT, LOOSE = 1e-12, 1e-5
BOUND = {("toy", "fp64"): TIGHT, ("toy", "fp32"): LOOSE, ("toy-stress", "fp64"): 2e-9, ("toy-stress", "fp32"): LOOSE,
         ("toy-llama", "fp64"): TIGHT, ("toy-llama", "fp32"): LOOSE}
AS_OWN_FP32 = {"toy-stress"}  # fp32 judged against the float64 reference, at a multiple of the float32 reference's
OWN_FACTOR = {"grad": 2.0, "train": 4.0}  # error against it
FAST: set[str] = set()  # `parity run --grad` with jax takes 15-20 s a fixture: the full set (CI) runs all three
BACKEND = JaxBackend()


def _params(name: str, precision: str) -> Any:
    return pytest.param(name, precision, marks=[] if name in FAST else [pytest.mark.full], id=f"{name}-{precision}")


COMMITTED = [_params(f, p) for f in ("toy", "toy-stress", "toy-llama") for p in ("fp32", "fp64")]


@functools.cache
def _fixture(name: str) -> tuple[Fixture, TrainingSpec]:
    fixture = load_fixture(REPO / "fixtures" / name)
    spec = fixture.training()
    assert spec is not None, f"{name} has no training section"
    return fixture, spec


@pytest.mark.parametrize("name", [pytest.param(f, marks=[] if f in FAST else [pytest.mark.full])
                                  for f in ("toy", "toy-stress", "toy-llama")])
def test_parity_run_passes_every_tap_gradient_and_step(name: str) -> None:
    """What `parity run --grad --backends jax --fixture fixtures/NAME` runs: every tap in both tiers it computes
    in, every gradient and training record, each judged against the goldens."""
    fixture, spec = _fixture(name)
    report = api.run(["jax"], fixture, ["fp32", "fp64"], grad=True)
    assert report.passed, api.failure_message(report)
    compared: dict[str, set[str]] = {}
    for r in report.results:
        compared.setdefault(r.precision, set()).add(r.tap)
    assert compared == {"fp32": set(fixture.tap_names), "fp64": set(fixture.tap_names)}
    assert report.grad is not None and report.grad.n_failed == 0
    per_case = 1 + len(fixture.grad_names())  # the loss and every gradient
    records = spec.steps * (2 + len(fixture.model.param_shapes()))  # each step: the loss, the norm, every param
    tiers = 3  # fp32 vs fp32, fp64 vs fp64, fp64 vs fp32
    assert report.grad.n_passed == tiers * (len(spec.cases) * per_case + records), report.grad.n_passed


# -- the backward and the training step against torch autograd and torch.optim.AdamW ------------------------------


@functools.cache
def _reference_grads(name: str, precision: str) -> dict[str, dict[str, np.ndarray]]:
    fixture, spec = _fixture(name)
    weights, config = fixture.weights(), fixture.model.config
    return {case: case_gradients(weights, config, fixture.case(case).tokens, precision) for case in spec.cases}


def _key_bias(family: str, config: Any, params: list[str]) -> dict[str, slice]:
    """Each parameter holding a key bias, and its key part: a gradient 0 in exact arithmetic."""
    if family == "llama":
        return {n: slice(None) for n in params if n.endswith("self_attn.k_proj.bias")}
    d = config.d_model
    return {n: slice(d, 2 * d) for n in params if n.endswith("attn.c_attn.bias")}


def _bounds(got_names: list[str], want: Any, truth: Any, bound: float, factor: float) -> tuple[Any, dict[str, float]]:
    """What the errors are measured against and each name's bound: `want` at `bound`, or with `truth` (the float64
    reference) the truth, at max(bound, factor x the float32 reference's own error against it)."""
    if truth is None:
        return want, {n: bound for n in got_names}
    own = grad_errors({c: {k: v.astype(np.float64) for k, v in g.items()} for c, g in want.items()}, truth)
    return truth, {n: max(bound, factor * own[n]) for n in got_names}


def _largest_ratio(errors: dict[str, float], bounds: dict[str, float], floor: float) -> float:
    """The largest error over the bound's measured part (the float32 reference's own error), where it is above the
    floor: how close to its bound the rule ran."""
    return max((errors[n] / bounds[n] for n in errors if bounds[n] > floor), default=0.0)


def _widened(got: dict[str, dict[str, np.ndarray]], truth: Any) -> dict[str, dict[str, np.ndarray]]:
    return got if truth is None else {c: {k: v.astype(np.float64) for k, v in g.items()} for c, g in got.items()}


def _check_grads(fixture: Any, spec: TrainingSpec, precision: str, want: dict[str, dict[str, np.ndarray]],
                 bound: float, label: str, truth: dict[str, dict[str, np.ndarray]] | None = None) -> None:
    got = BACKEND.grad(fixture, precision)  # type: ignore[arg-type]
    assert list(got) == list(spec.cases)
    names = backward_names(fixture.tap_names, list(fixture.weights()))
    for case, grads in got.items():
        assert list(grads) == ["loss", *names], case  # every gradient, in backward order
    against, bounds = _bounds(["loss", *names], want, truth, bound, OWN_FACTOR["grad"])
    errors = grad_errors(_widened(got, truth), against, order=["loss", *names])
    over = [n for n, e in errors.items() if e > bounds[n]]
    _, worst, where = first_over(errors, bound)
    print(f"jax {label} {precision}: {len(names)} gradients, worst {worst:.3g} of M at {where}"
          + ("" if truth is None else f" against float64 (bound {bounds[where]:.3g}: the float32 reference's x2)"))
    if truth is not None:
        print(f"  largest ratio to the float32 reference's own error: {_largest_ratio(errors, bounds, bound):.3g}")
    assert not over, f"{over[0]} is {errors[over[0]]:.3g} of its M (bound {bounds[over[0]]:.3g})"


def _check_training(fixture: Any, spec: TrainingSpec, precision: str, want: dict[str, np.ndarray], bound: float,
                    label: str, truth: dict[str, np.ndarray] | None = None) -> None:
    got = BACKEND.train(fixture, precision)  # type: ignore[arg-type]
    assert set(got) == set(want)
    keys = _key_bias(fixture.family, fixture.model.config, list(fixture.weights()))
    rest: dict[str, np.ndarray] = {}  # each record's cells judged by the rule (all but a key bias's)
    for key, value in want.items():
        param = key.split("/", 1)[1]
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
        rest[key] = np.ones(value.shape, dtype=bool)
        if param in keys:
            rest[key][keys[param]] = False

    def cut(records: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        return {"": {k: v[rest[k]] for k, v in records.items()}}

    against, bounds = _bounds(list(want), cut(want), None if truth is None else cut(truth), bound, OWN_FACTOR["train"])
    errors = grad_errors(_widened(cut(got), truth), against)
    over = [n for n, e in errors.items() if e > bounds[n]]
    _, worst, where = first_over(errors, bound)
    print(f"jax {label} {precision} training: worst {worst:.3g} of its max at {where}"
          + ("" if truth is None else f" against float64 (bound {bounds[where]:.3g}: the float32 reference's x4)"))
    if truth is not None:
        print(f"  largest ratio to the float32 reference's own error: {_largest_ratio(errors, bounds, bound):.3g}")
    assert not over, f"{over[0]} is {errors[over[0]]:.3g} of its max (bound {bounds[over[0]]:.3g})"
    for s in range(1, spec.steps + 1):
        drift = 2 * sum(spec.lr[t - 1] * adam_bound(spec, t) for t in range(1, s + 1))
        for param, part in keys.items():
            moved = float(np.abs(got[step_key(s, param)][part].astype(np.float64)
                                 - want[step_key(s, param)][part]).max())
            assert moved <= drift, f"{step_key(s, param)}: the key bias is {moved:.3g} off, beyond AdamW's {drift:.3g}"


@pytest.mark.parametrize(("name", "precision"), COMMITTED)
def test_gradients_match_torch_autograd(name: str, precision: str) -> None:
    fixture, spec = _fixture(name)
    assert BACKEND.supports_grad(fixture) and BACKEND.supports_training(fixture)
    truth = _reference_grads(name, "fp64") if precision == "fp32" and name in AS_OWN_FP32 else None
    _check_grads(fixture, spec, precision, _reference_grads(name, precision), BOUND[name, precision], name, truth)


@pytest.mark.parametrize(("name", "precision"), COMMITTED)
def test_training_steps_match_torch_adamw(name: str, precision: str) -> None:
    fixture, spec = _fixture(name)
    batch = [fixture.case(case).tokens for case in spec.cases]
    want = train_steps(fixture.weights(), fixture.model.config, batch, spec, precision)
    truth = (train_steps(fixture.weights(), fixture.model.config, batch, spec, "fp64")
             if precision == "fp32" and name in AS_OWN_FP32 else None)
    _check_training(fixture, spec, precision, want, BOUND[name, precision], name, truth)


# -- configurations no committed fixture has --------------------------------------------------------------------

CASES = {"ten": (1, 5, 3, 7, 2, 11, 0, 4, 9, 6), "one": (3,), "full": tuple((7 * k) % 12 for k in range(16)),
         "two": (4, 4)}
VARIANTS: dict[str, GPTConfig | LlamaConfig] = {
    "gpt2-learned-gelu_new": GPTConfig(positions="learned", activation="gelu_new"),
    "gpt2-not-causal": GPTConfig(causal=False, n_head=4),
    "llama-interleaved-tied-bias-mqa": LlamaConfig(rope_pairing="interleaved", tied=True, bias=True, n_kv_heads=1,
                                                   rope_base=500000.0, rms_eps=1e-6),
    "llama-mha-not-causal": LlamaConfig(n_kv_heads=4, causal=False),
}


def _variant(config: GPTConfig | LlamaConfig) -> SimpleNamespace:
    """What the backend reads of a fixture, in memory: seeded weights (rounded to float32, as a fixture stores them)
    with biases and gains away from 0 and 1, the cases above, and a training section with weight decay."""
    family = "llama" if isinstance(config, LlamaConfig) else "gpt2"
    shapes = load_family(family).module("params").param_shapes(config)
    rng = np.random.default_rng(39)
    weights = {k: (rng.standard_normal(s) * 0.3 + (1.0 if k.endswith(("norm.weight", "ln_1.weight", "ln_2.weight",
                                                                         "ln_f.weight")) else 0.0)).astype(np.float32)
               for k, s in shapes.items()}
    cases = [SimpleNamespace(name=n, tokens=t) for n, t in CASES.items()]
    decayed = [k for k in shapes if k.endswith(".weight")][::2]
    spec = lesson_spec([n for n, t in CASES.items() if len(t) >= 2], weight_decay=0.1,
                       no_decay=[k for k in shapes if k not in decayed])
    return SimpleNamespace(family=family, model=SimpleNamespace(config=config), cases=cases,
                           tap_names=load_family(family).tap_names(config), weights=lambda: dict(weights),
                           release_weights=lambda: None, lens_rows=lambda: None, training=lambda: spec)


def _reference_taps(fixture: Any, precision: str) -> dict[str, dict[str, np.ndarray]]:
    from parity_reference.families import family_of

    module = family_of(fixture.model.config).module("torch")
    dtype = {"fp32": torch.float32, "fp64": torch.float64}[precision]
    params = {k: torch.tensor(v, dtype=dtype) for k, v in fixture.weights().items()}
    config = fixture.model.config
    return {c.name: {k: t.numpy() for k, t in module.run_with_taps(params, config, list(c.tokens)).items()}
            for c in fixture.cases}


@pytest.mark.full
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_configuration_of_no_fixture_agrees_with_the_reference(variant: str, precision: str) -> None:
    """Every tap, every gradient and every training record of a configuration no committed fixture holds."""
    fixture = _variant(VARIANTS[variant])
    got = BACKEND.run(fixture, precision)  # type: ignore[arg-type]
    want = _reference_taps(fixture, precision)
    atol, rtol = (1e-12, 0.0) if precision == "fp64" else (1e-5, 1e-5)
    worst = 0.0
    for case, taps in want.items():
        assert list(got[case]) == list(fixture.tap_names)
        for tap, w in taps.items():
            g = got[case][tap]
            assert g.shape == w.shape and g.dtype == w.dtype, (case, tap, g.shape, w.shape, g.dtype)
            inf = np.isinf(w)
            assert np.array_equal(np.isinf(g), inf), (case, tap)  # masked where the reference masks, only there
            diff = np.abs(np.where(inf, 0.0, g) - np.where(inf, 0.0, w))
            assert np.all(diff <= atol + rtol * np.abs(np.where(inf, 0.0, w))), (case, tap, float(diff.max()))
            worst = max(worst, float(diff.max()))
    print(f"jax {variant} {precision}: every tap within {worst:.3g}")
    spec = fixture.training()
    weights, config = fixture.weights(), fixture.model.config
    reference = {case: case_gradients(weights, config, CASES[case], precision) for case in spec.cases}
    bound = TIGHT if precision == "fp64" else LOOSE
    _check_grads(fixture, spec, precision, reference, bound, variant)
    want_train = train_steps(weights, config, [CASES[c] for c in spec.cases], spec, precision)
    _check_training(fixture, spec, precision, want_train, bound, variant)


@pytest.mark.full  # two jit compilations of a second model (~5 s): the full set (CI) runs it
@pytest.mark.parametrize("config", [GPTConfig(), LlamaConfig()], ids=["gpt2", "llama"])
def test_the_read_outs_keep_the_fixtures_rows(config: GPTConfig | LlamaConfig) -> None:
    """A fixture that keeps the last 3 positions of probs and the logit lens (GPT-2-sized ones do): those rows of
    the sequence, not of its padding, also for a case shorter than 3; every tap as the reference's in fp64."""
    fixture = _variant(config)
    fixture.lens_rows = lambda: 3
    got = BACKEND.run(fixture, "fp64")  # type: ignore[arg-type]
    from parity_reference.families import family_of

    module = family_of(config).module("torch")
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in fixture.weights().items()}
    for case in fixture.cases:
        want = module.run_with_taps(params, config, list(case.tokens), 3)
        assert got[case.name]["probs"].shape == (min(3, len(case.tokens)), config.vocab_size)
        for tap, w in want.items():
            w = w.numpy()
            assert got[case.name][tap].shape == w.shape, (case.name, tap)
            finite = np.isfinite(w)
            assert np.array_equal(np.isfinite(got[case.name][tap]), finite), (case.name, tap)
            assert np.allclose(got[case.name][tap][finite], w[finite], rtol=0, atol=1e-12), (case.name, tap)


# -- the probes and the padding --------------------------------------------------------------------------------


def test_a_tap_recorded_twice_has_one_adjoint_and_the_attention_adjoints_are_right_at_masked_cells() -> None:
    """block 0's resid_post and block 1's resid_pre are one tensor (two probes in a row): equal gradients; the
    scores' gradient is 0 where a key is masked, the pattern's is not (g_z . v), as the reference's."""
    fixture, spec = _fixture("toy")
    got = BACKEND.grad(fixture, "fp64")
    case = spec.cases[0]
    g = got[case]
    assert np.array_equal(g["blocks.0.hook_resid_post.grad"], g["blocks.1.hook_resid_pre.grad"])
    assert np.array_equal(g["hook_pos_embed.grad"], g["hook_embed.grad"])
    T = len(fixture.case(case).tokens)
    masked = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores, pattern = g["blocks.0.attn.hook_attn_scores.grad"], g["blocks.0.attn.hook_pattern.grad"]
    assert np.all(scores[:, masked] == 0.0)
    assert np.any(pattern[:, masked] != 0.0)
    want = _reference_grads("toy", "fp64")[case]["blocks.0.attn.hook_pattern.grad"]
    assert np.allclose(pattern, want, rtol=0, atol=1e-12 * float(np.abs(want).max()))


def test_one_program_serves_every_case_length_of_the_toy() -> None:
    """Every case is padded to one bucket on the toy (n_ctx 16): jax compiles the forward once per precision."""
    fixture, _ = _fixture("toy")
    assert {padded_length(len(c.tokens), fixture.config.n_ctx) for c in fixture.cases} == {16}
    assert [padded_length(T, 1024) for T in (1, 16, 17, 100, 1000, 1024)] == [16, 16, 32, 128, 1024, 1024]


@pytest.mark.parametrize("name", ["toy", "toy-llama"])
def test_fp32_computes_in_float32_though_float64_is_enabled(name: str) -> None:
    """jax_enable_x64 is on for the whole process; in fp32 only the position tables (sinusoidal, RoPE: float64, then
    rounded once, as the reference) are float64: no float32 value is upcast, every matmul is float32, forward and
    backward (the compiled programs' jaxprs)."""
    from parity_harness._backends import jax_backend as jb

    fixture, _ = _fixture(name)
    jax = jb._jax()
    params = BACKEND._params(fixture, "fp32")
    ids, length, _ = BACKEND._tokens(fixture, "three", (1, 2, 3), 1)
    forward = jb.FORWARDS[fixture.family]
    on_path = tuple(t for t in fixture.tap_names if has_backward(t))
    programs = {
        "forward": jax.make_jaxpr(lambda p, i, n: forward(p, fixture.model.config, i, n, None, None, True)[1]),
        "backward": jax.make_jaxpr(jb._case_grad_fn(fixture.family, fixture.model.config, on_path)),
    }
    tables = {"iota", "broadcast_in_dim", "mul", "add", "neg", "div", "pow", "sin", "cos", "stack", "reshape",
              "concatenate", "slice"}
    for what, make in programs.items():
        lines = [line.strip() for line in str(make(params, ids, length)).splitlines()]
        wide = [line for line in lines if "f64[" in line.split("=", 1)[0]]
        assert wide, f"{what}: no float64 position table at all"
        assert all(line.split("=", 1)[1].split()[0].split("[")[0] in tables for line in wide), (what, wide)
        assert not [line for line in lines if "new_dtype=float64" in line], what  # nothing upcast
        matmuls = [line for line in lines if " dot_general[" in line]
        assert matmuls and all(":f32[" in line.split("=", 1)[0] for line in matmuls), (what, matmuls[:3])


# -- bad input -------------------------------------------------------------------------------------------------


def test_a_token_id_out_of_range_is_one_line_naming_the_case() -> None:
    fixture = _variant(LlamaConfig())
    fixture.cases = [SimpleNamespace(name="bad", tokens=(1, 12, 3))]
    with pytest.raises(FixtureError, match=r"^case 'bad': token id 12 out of range \[0, 12\)$"):
        BACKEND.run(fixture, "fp32")  # type: ignore[arg-type]


def test_a_fixture_without_a_training_section_is_one_line() -> None:
    fixture = _variant(GPTConfig())
    fixture.training = lambda: None
    with pytest.raises(FixtureError, match="no training section"):
        BACKEND.grad(fixture, "fp64")  # type: ignore[arg-type]
    with pytest.raises(FixtureError, match="no training section"):
        BACKEND.train(fixture, "fp64")  # type: ignore[arg-type]
