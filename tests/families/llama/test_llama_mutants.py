"""The Llama family's porting bugs as mutants (parity_harness/_tools/llama_mutants.py, LLAMA): each patched copy of
parity_reference/llama_model.py first diverges from the reference at its catalog tap, and diagnose names it there
(a Likely cause recomputed from the golden's upstream taps and the weights); a wrong value that is none of them
gets no cause. The same bugs in the NumPy Llama (LLAMA_NUMPY, patches of parity_reference/llama_numpy.py) are
caught at the same taps with the same causes, and the unpatched NumPy Llama agrees with the torch golden."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parity_harness._compare.diagnose import diagnose  # noqa: E402
from parity_harness._compare.patterns import TapContext  # noqa: E402
from parity_harness._tools.llama_mutants import LLAMA, LLAMA_NUMPY  # noqa: E402
from parity_harness._tools.mutants import by_name  # noqa: E402
from parity_harness._tools.selftest import copy_target, load_module  # noqa: E402
from parity_reference import llama_model, llama_numpy  # noqa: E402
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
TOKENS = [1, 5, 3, 7, 2, 9, 0, 4, 11, 6]
TOLERANCE = {"fp32": 1e-5, "fp64": 1e-12}  # atol = rtol, the tiers' default scale
DTYPE = {"fp32": torch.float32, "fp64": torch.float64}
NP_DTYPE = {"fp32": np.float32, "fp64": np.float64}
CAUSE = {  # each mutant's likely cause begins with its pattern's name
    "llama-rope-pairing": "RoPE pairing swapped",
    "llama-rope-base": "RoPE base",
    "llama-gqa-repeat": "grouped-query heads repeated, not interleaved",
    "llama-swiglu-swapped": "SwiGLU gate and up swapped",
    "llama-rms-eps": "RMSNorm eps",
    "llama-rms-one-plus-w": "RMSNorm weight applied as (1 + w)",
}
CONFIGS = [TOY_LLAMA, LlamaConfig(rope_pairing="interleaved", rope_base=500000.0, rms_eps=1e-6, bias=True)]


def taps(run: Any, config: LlamaConfig, tier: str) -> dict[str, np.ndarray]:
    params = {k: v.to(DTYPE[tier]) for k, v in llama_model.init_params(config, 3, torch.float64).items()}
    return {k: v.numpy() for k, v in run(params, config, TOKENS).items()}


def weights(config: LlamaConfig) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in llama_model.init_params(config, 3, torch.float64).items()}


def numpy_taps(forward: Any, config: LlamaConfig, tier: str) -> dict[str, np.ndarray]:
    """A NumPy Llama's taps on the same weights, computed in the tier's dtype (as the numpy backend does)."""
    params = {k: v.astype(NP_DTYPE[tier]) for k, v in weights(config).items()}
    out: dict[str, np.ndarray] = forward(params, config, TOKENS)
    return out


def twin_of(name: str) -> str:
    """The NumPy twin's name of a torch Llama mutant."""
    return name.replace("llama-", "llama-np-", 1)


def first_failing(golden: dict[str, np.ndarray], got: dict[str, np.ndarray], tol: float) -> str | None:
    for tap, b in golden.items():
        a = got[tap]
        if a.shape != b.shape:
            return tap
        with np.errstate(invalid="ignore"):
            fin = np.isfinite(b)
            if not np.all(np.abs(np.where(fin, a - b, 0.0)) <= tol + tol * np.abs(np.where(fin, b, 0.0))) or \
                    not np.all(a[~fin] == b[~fin]):
                return tap
    return None


def causes_at(tap: str, golden: dict[str, np.ndarray], got: dict[str, np.ndarray], config: LlamaConfig,
              tier: str) -> list[str]:
    tol = TOLERANCE[tier]
    ctx = TapContext(tap, config, golden, got, weights(config), tier)
    return diagnose(got[tap], golden[tap], tier, atol=tol, rtol=tol, context=ctx)


def test_the_catalog_lists_six_llama_mutants_on_the_llama_fixture() -> None:
    assert [m.name for m in LLAMA] == list(CAUSE)
    assert [m.name for m in by_name(list(CAUSE))] == list(CAUSE)
    assert all(m.file == "llama_model.py" and (m.caught_on, m.family) == ("family", "llama")
               and m.target == "reference" for m in LLAMA)


@pytest.mark.parametrize("config", CONFIGS, ids=["toy-llama", "interleaved-5e5-bias"])
@pytest.mark.parametrize("tier", ["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CAUSE))
def test_each_llama_mutant_is_caught_at_its_tap_with_its_cause(name: str, tier: str, config: LlamaConfig,
                                                               tmp_path: Path) -> None:
    mutant = next(m for m in LLAMA if m.name == name)
    root = copy_target("reference", tmp_path / name, mutant)
    module = load_module(root / "llama_model.py", f"_parity_test_{name.replace('-', '_')}")
    golden, got = taps(llama_model.run_with_taps, config, tier), taps(module.run_with_taps, config, tier)
    tap = first_failing(golden, got, TOLERANCE[tier])
    assert tap == mutant.expected_tap
    causes = causes_at(tap, golden, got, config, tier)
    assert any(c.startswith(CAUSE[name]) for c in causes), causes
    assert not [c for c in causes if any(c.startswith(other) for other in CAUSE.values() if other != CAUSE[name])]


def test_each_llama_mutant_has_a_numpy_twin_at_its_tap() -> None:
    twins = {m.name: m for m in LLAMA_NUMPY}
    assert list(twins) == [twin_of(name) for name in CAUSE]
    assert [m.name for m in by_name(list(twins))] == list(twins)  # in the catalog
    for m in LLAMA:
        twin = twins[twin_of(m.name)]
        assert (twin.target, twin.file, twin.caught_on, twin.family) == ("numpy", "llama_numpy.py", "family",
                                                                         "llama"), twin
        assert (twin.expected_tap, twin.expected_step, twin.fp64_only) == (m.expected_tap, None, False), twin


@pytest.mark.parametrize("config", CONFIGS, ids=["toy-llama", "interleaved-5e5-bias"])
@pytest.mark.parametrize("tier", ["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CAUSE))
def test_each_numpy_twin_is_caught_at_its_tap_with_its_cause(name: str, tier: str, config: LlamaConfig,
                                                             tmp_path: Path) -> None:
    """The bug in a patched copy of llama_numpy.py, against the torch golden (what a fixture holds): its torch
    twin's tap and cause, and no other Llama cause."""
    twin = next(m for m in LLAMA_NUMPY if m.name == twin_of(name))
    root = copy_target(twin.target, tmp_path / twin.name, twin)
    module = load_module(root / twin.file, f"_parity_test_{twin.name.replace('-', '_')}")
    golden, got = taps(llama_model.run_with_taps, config, tier), numpy_taps(module.forward, config, tier)
    tap = first_failing(golden, got, TOLERANCE[tier])
    assert tap == twin.expected_tap
    causes = causes_at(tap, golden, got, config, tier)
    assert any(c.startswith(CAUSE[name]) for c in causes), causes
    assert not [c for c in causes if any(c.startswith(other) for other in CAUSE.values() if other != CAUSE[name])]


@pytest.mark.parametrize("config", CONFIGS, ids=["toy-llama", "interleaved-5e5-bias"])
@pytest.mark.parametrize("tier", ["fp32", "fp64"])
def test_the_unpatched_numpy_llama_agrees_with_the_torch_golden(tier: str, config: LlamaConfig) -> None:
    """The twins' control: without a patch, the NumPy Llama passes every tap where its twins fail one."""
    golden = taps(llama_model.run_with_taps, config, tier)
    got = numpy_taps(llama_numpy.forward, config, tier)
    assert set(got) == set(golden)
    assert first_failing(golden, got, TOLERANCE[tier]) is None


@pytest.mark.parametrize("tier", ["fp32", "fp64"])
def test_an_honest_run_gets_no_cause(tier: str) -> None:
    golden = taps(llama_model.run_with_taps, TOY_LLAMA, tier)
    assert first_failing(golden, taps(llama_model.run_with_taps, TOY_LLAMA, tier), TOLERANCE[tier]) is None
    for tap in {m.expected_tap for m in LLAMA}:  # the honest values: nothing fails, nothing to name
        assert causes_at(tap, golden, golden, TOY_LLAMA, tier) == []
        wrong = dict(golden)
        wrong[tap] = np.where(np.isfinite(golden[tap]), golden[tap] * 1.01 + 1e-3, golden[tap])  # no known bug
        assert causes_at(tap, golden, wrong, TOY_LLAMA, tier) == [], tap


def test_float32_round_off_judged_at_fp64_gets_no_llama_cause() -> None:
    golden = taps(llama_model.run_with_taps, TOY_LLAMA, "fp64")
    got = {k: v.astype(np.float64) for k, v in taps(llama_model.run_with_taps, TOY_LLAMA, "fp32").items()}
    for tap in {m.expected_tap for m in LLAMA}:  # an honest float32 run fails the fp64 tier: no porting bug named
        causes = causes_at(tap, golden, got, TOY_LLAMA, "fp64")
        assert not [c for c in causes if any(c.startswith(name) for name in CAUSE.values())], (tap, causes)


# -- the selftest on fixtures/toy-llama (the toy's sibling) ----------------------------------------------------


def test_selftest_catches_each_llama_mutant_at_its_tap_with_its_likely_cause() -> None:
    """Both implementations' mutants on fixtures/toy-llama: llama_model.py's run like the pytorch backend,
    llama_numpy.py's by the numpy backend's code; each control (the unpatched file) passes there."""
    import io

    from parity_harness._fixture.fixture import load_fixture
    from parity_harness._tools.selftest import format_table, print_selftest, run_selftest

    result = run_selftest(load_fixture(REPO / "fixtures" / "toy"), [*LLAMA, *LLAMA_NUMPY])  # toy-llama: beside the toy
    doc = result.to_json()
    families = doc["families"]
    assert isinstance(families, dict) and list(families) == ["llama"] and doc["controls"] == {}, families
    assert families["llama"]["fixture"] == str(REPO / "fixtures" / "toy-llama")
    assert families["llama"]["controls"] == {"reference": "", "numpy": ""}, families
    mutants = doc["mutants"]
    assert isinstance(mutants, list)
    rows = {str(r["name"]): r for r in mutants}
    assert list(rows) == [*CAUSE, *map(twin_of, CAUSE)]
    for name, cause in CAUSE.items():
        for row, file in ((rows[name], "llama_model.py"), (rows[twin_of(name)], "llama_numpy.py")):
            assert row["caught"] and not row["error"] and row["localized"], row
            assert row["caught_on"] == "family" and row["family"] == "llama" and row["file"] == file, row
            assert str(row["likely_cause"]).startswith(cause), row
    assert families["llama"]["mutants"] == families["llama"]["caught_at_tap_with_cause"] == 12, families
    # the subset has no fp64-only mutant (a catalog-wide count): every other requirement holds
    assert [f for f in result.failures() if "fp64 tier alone" not in f] == []
    table = format_table(result)
    assert any(line.startswith("Llama mutants: caught on toy-llama") for line in table)
    assert any(line.startswith("llama-np-gqa-repeat ") and " llama_numpy.py " in line for line in table), table
    out = io.StringIO()
    print_selftest(result, out)
    assert "control (numpy, unpatched llama_numpy.py, toy-llama): pass" in out.getvalue()
    assert ("Llama mutants caught at their tap with a likely cause: 12/12 (llama_model.py 6/6, llama_numpy.py 6/6)"
            in out.getvalue())


def test_selftest_without_a_llama_fixture_is_one_line(tmp_path: Path) -> None:
    import shutil

    from parity_harness._core.errors import ParityError
    from parity_harness._fixture.fixture import load_fixture
    from parity_harness._tools.selftest import run_selftest

    toy = tmp_path / "toy"
    shutil.copytree(REPO / "fixtures" / "toy", toy)
    with pytest.raises(ParityError) as info:
        run_selftest(load_fixture(toy), list(LLAMA[:1]))
    assert "the llama mutants" in str(info.value) and "toy-llama" in str(info.value) and "\n" not in str(info.value)


def test_selftest_refuses_a_family_fixture_of_another_family() -> None:
    from parity_harness._core.errors import ParityError
    from parity_harness._fixture.fixture import load_fixture
    from parity_harness._tools.selftest import run_selftest

    toy = load_fixture(REPO / "fixtures" / "toy")
    with pytest.raises(ParityError, match="toy is a gpt2 fixture, not a llama one") as info:
        run_selftest(toy, list(LLAMA[:1]), family_fixtures={"llama": toy})
    assert "\n" not in str(info.value)
