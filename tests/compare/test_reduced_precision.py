"""fp16 and bf16: the container and its check, the per-tap rule, the backends, and overflow named.

Every test here can fail: each planted bug (a value off the precision's grid, a backend that computes in
bf16 but says fp16, a naive fp16 variance, a c beyond its ceiling) is shown to be caught, and the honest
computation is shown to pass, so neither side is asserted by construction.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import BackendMisbehaved, FixtureError
from parity_harness._core.precision import DTYPES, EPS, REDUCED, tiers_for, unrepresentable
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.tolerances import REDUCED_C, REDUCED_C_CEILING, tap_magnitude
from tests.helpers import REPO, edit_manifest, run_cli

STRESS = REPO / "fixtures" / "toy-stress"


def _taps(fixture: Fixture, precision: str, dtype: Any = None, patch: Any = None) -> BackendOutput:
    """The reference model's taps in `precision` (torch), optionally through a patched layer_norm."""
    from parity_reference import model
    from parity_reference.run import reference_taps, torch_params

    params = torch_params(fixture.weights(), dtype or precision)
    with mock.patch.object(model, "layer_norm", patch) if patch else mock.MagicMock():
        return reference_taps(params, fixture.config, fixture.cases, dtype or precision,
                              lens_rows=fixture.lens_rows(), cast=False)


class _Lowp(Backend):
    """A test backend: the reference in one torch dtype, declared as another precision."""

    name: ClassVar[str] = "lowp-test"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp16", "bf16")
    computes_in: ClassVar[str | None] = None  # None: the precision asked for
    layer_norm: ClassVar[Any] = None
    post: ClassVar[Any] = None  # applied to every returned array

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = _taps(fixture, precision, self.computes_in, type(self).layer_norm)
        post = type(self).post
        return {c: {t: post(a) if post else a for t, a in taps.items()} for c, taps in out.items()}


def _naive_layer_norm(x: Any, weight: Any, bias: Any, eps: float, taps: Any, name: str) -> Any:
    """LayerNorm with the one-pass variance E[x^2] - E[x]^2, in x's dtype: in fp16, x^2 passes 65504 at |x| > 256."""
    import torch

    from parity_reference.model import _record

    mean = x.mean(dim=-1, keepdim=True)  # (T, 1)
    var = (x * x).mean(dim=-1, keepdim=True) - mean * mean  # (T, 1): inf - inf = NaN once x^2 overflows
    scale = torch.sqrt(var + eps)  # (T, 1)
    _record(taps, f"{name}.hook_scale", scale)
    normalized = (x - mean) / scale  # (T, d)
    _record(taps, f"{name}.hook_normalized", normalized)
    return normalized * weight + bias  # (T, d)


def _backend(**attrs: Any) -> Backend:
    made: Backend = type("LowpTest", (_Lowp,), attrs)()
    return made


# -- the precisions and their container ------------------------------------------------------------


def test_reduced_precisions_are_declared_next_to_fp32_and_fp64() -> None:
    assert set(REDUCED) == {"fp16", "bf16"}
    assert DTYPES["fp16"] is np.float32 and DTYPES["bf16"] is np.float32  # the container, documented
    assert EPS["fp16"] == float(np.finfo(np.float16).eps) and EPS["bf16"] == 2.0**-7
    assert tiers_for("fp16") == ["fp64", "fp32"] and tiers_for("fp32") == ["fp32"]


def test_unrepresentable_finds_values_off_the_precision_grid() -> None:
    grid16 = np.array([1.0, 1.0 + 2**-10, -65504.0, np.inf, 2.0**-24], dtype=np.float32)  # (5,): fp16 values
    assert unrepresentable(grid16, "fp16") is None
    assert unrepresentable(np.array([1.0, 1.0 + 2**-12], dtype=np.float32), "fp16") == (1,)  # between fp16 values
    assert unrepresentable(np.array([70000.0], dtype=np.float32), "fp16") == (0,)  # finite, fp16 has inf there
    grid_bf = np.array([1.0, 1.0 + 2**-7, 3.0e38, -np.inf], dtype=np.float32)
    grid_bf = (grid_bf.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # (4,): truncated to bf16
    assert unrepresentable(grid_bf, "bf16") is None
    assert unrepresentable(np.array([[1.0, 1.0 + 2**-8]], dtype=np.float32), "bf16") == (0, 1)
    assert unrepresentable(np.array([1.0 + 2**-12], dtype=np.float32), "fp32") is None  # not a reduced precision


def test_a_value_off_the_grid_is_a_broken_contract_in_one_line(toy_dir: Path) -> None:
    pytest.importorskip("torch")
    off_grid = _backend(computes_in="fp32")  # says fp16, returns float32 round-off
    with pytest.raises(BackendMisbehaved) as info:
        api.run(off_grid, toy_dir, "fp16", decoding=False)
    message = str(info.value)
    assert "\n" not in message and "is not a fp16 value" in message and "lowp-test" in message


def test_a_float16_array_is_a_failed_check_naming_the_container(toy_dir: Path) -> None:
    pytest.importorskip("torch")
    report = api.run(_backend(post=lambda a: a.astype(np.float16)), toy_dir, "fp16", decoding=False)
    assert not report.passed
    assert "dtype float16 != expected float32" in report.divergences[0].message


# -- the per-tap rule ---------------------------------------------------------------------------------


def test_the_tolerance_is_c_eps_M_tap_of_the_fp32_golden(toy_dir: Path) -> None:
    fixture = load_fixture(toy_dir)
    for precision in REDUCED:
        for tap in ("hook_embed", "blocks.1.hook_resid_post", "probs"):
            m = tap_magnitude(fixture.golden_case("fp32", c.name)[tap] for c in fixture.cases)
            tol = fixture.reduced_tolerance(precision, tap)
            assert tol.rtol == 0.0 and tol.atol == pytest.approx(REDUCED_C[precision] * EPS[precision] * m, rel=1e-12)


def test_the_manifest_may_state_c_within_its_ceiling(fixture_copy: Path) -> None:
    edit_manifest(fixture_copy, lambda m: m["tolerances"].update(reduced={"fp16": {"c": 8}}))
    fixture = load_fixture(fixture_copy)
    assert fixture.spec.reduced_c == {"fp16": 8.0, "bf16": REDUCED_C["bf16"]}
    too_loose = REDUCED_C_CEILING * REDUCED_C["bf16"] * 2
    edit_manifest(fixture_copy, lambda m: m["tolerances"].update(reduced={"bf16": {"c": too_loose}}))
    with pytest.raises(FixtureError, match=r"tolerances\.reduced\.bf16\.c .* above the ceiling"):
        load_fixture(fixture_copy)
    assert load_fixture(fixture_copy, allow_loose_tolerances=True).loose
    edit_manifest(fixture_copy, lambda m: m["tolerances"].update(reduced={"fp8": {"c": 1}}))
    with pytest.raises(FixtureError):  # the schema knows fp16 and bf16 only
        load_fixture(fixture_copy)


def test_a_smaller_c_makes_the_honest_run_fail(fixture_copy: Path) -> None:
    """The rule is what judges: at c = 0.5 the pytorch fp16 run breaks tolerance (it passes at the default)."""
    pytest.importorskip("torch")
    edit_manifest(fixture_copy, lambda m: m["tolerances"].update(reduced={"fp16": {"c": 0.5}}))
    assert not api.run("pytorch", fixture_copy, "fp16", decoding=False)


# -- the backends ---------------------------------------------------------------------------------------


def test_pytorch_and_numpy_pass_in_reduced_precision_and_fp32_is_unchanged(toy_dir: Path) -> None:
    pytest.importorskip("torch")
    report = api.run(["pytorch", "numpy"], toy_dir, ["fp16", "bf16", "fp32"], decoding=False, keep_outputs=True)
    assert report.passed, [d.message for d in report.divergences]
    ran = {(r.backend, r.precision, r.status.value) for r in report.runs}
    assert {("pytorch", "fp16", "ran"), ("pytorch", "bf16", "ran"), ("numpy", "fp16", "ran")} <= ran
    assert ("numpy", "bf16", "not_supported") in ran
    fp16 = report.outputs[("pytorch", "fp16")]
    assert all(a.dtype == np.float32 for taps in fp16.values() for a in taps.values())
    logits16, logits32 = fp16["grammar_0"]["logits"], report.outputs[("pytorch", "fp32")]["grammar_0"]["logits"]
    assert np.array_equal(logits16, logits16.astype(np.float16).astype(np.float32))  # fp16 values, really
    assert not np.array_equal(logits16, logits32)  # computed in fp16, not fp32 rounded at the end
    # fp32 is unchanged by the reduced precisions run beside it: the same numbers as an fp32 run alone, in this
    # process (a same-platform claim: the golden itself was made on another CPU, whose sums may round otherwise).
    alone = api.run(["pytorch", "numpy"], toy_dir, "fp32", decoding=False, keep_outputs=True)
    for backend in ("pytorch", "numpy"):
        mixed, single = report.outputs[(backend, "fp32")], alone.outputs[(backend, "fp32")]
        assert mixed.keys() == single.keys()
        for case, taps in mixed.items():
            assert taps.keys() == single[case].keys()
            assert all(np.array_equal(a, single[case][t]) for t, a in taps.items()), (backend, case)


def test_bf16_numbers_declared_fp16_are_caught(toy_dir: Path) -> None:
    """bf16 values are on fp16's grid (|x| small): the fp16 rule catches them, and the judge names bf16's grid."""
    pytest.importorskip("torch")
    to_fp16 = staticmethod(lambda a: a.astype(np.float16).astype(np.float32))  # bf16's tiny values: fp16's grid
    report = api.run(_backend(computes_in="bf16", precisions=("fp16",), post=to_fp16), toy_dir, "fp16",
                     decoding=False)
    assert not report.passed and {d.golden for d in report.divergences} == {"fp32", "fp64"}
    assert any("computed in bf16" in d.message for d in report.divergences)


def test_cli_runs_a_precision_list_and_refuses_an_unknown_one() -> None:
    pytest.importorskip("torch")
    ok = run_cli("run", "--backends", "pytorch", "--precision", "fp16,bf16", "--quiet")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    tiers = [ln.split()[1] for ln in ok.stdout.splitlines() if ln.startswith("pytorch ") and " vs " in ln]
    assert tiers and set(tiers) == {"fp16", "bf16"}, ok.stdout  # one line per tier: no fp32 or fp64 tier ran
    bad = run_cli("run", "--backends", "pytorch", "--precision", "fp16,fp8")
    assert bad.returncode == 2 and "fp8" in bad.stderr and len(bad.stderr.strip().splitlines()) <= 3


# -- overflow --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stress() -> Iterator[Path]:
    assert STRESS.is_dir()
    yield STRESS


def test_a_naive_fp16_variance_is_named_overflow_at_its_first_tap(stress: Path) -> None:
    pytest.importorskip("torch")
    naive = _backend(layer_norm=staticmethod(_naive_layer_norm), precisions=("fp16",))
    report = api.run(naive, stress, "fp16", decoding=False)
    assert not report.passed
    for d in report.divergences:
        assert d.tap == "blocks.0.ln1.hook_scale", d.tap
        assert d.message.startswith("overflow:") and "fp16 range" in d.message and "65504" in d.message
    fp32 = api.run(_backend(layer_norm=staticmethod(_naive_layer_norm), precisions=("fp32",)), stress, "fp32",
                   decoding=False)
    assert all("overflow" not in d.message for d in fp32.divergences)  # fp32's range holds 1e6: no overflow


def test_the_honest_fp16_run_on_the_stress_fixture_fails_without_overflow(stress: Path) -> None:
    """fp16 cannot hold the stress fixture's residual stream (1000 + O(0.1), ulp 0.5): a plain disagreement,
    first at the first LayerNorm, never called an overflow (docs/tolerances.md, "Reduced precision")."""
    pytest.importorskip("torch")
    report = api.run("pytorch", stress, "fp16", decoding=False)
    assert not report.passed
    assert {d.tap for d in report.divergences} == {"blocks.0.ln1.hook_scale"}
    assert all("overflow" not in d.message for d in report.divergences)
