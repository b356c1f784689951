"""Hostile tolerances: a re-sealed fixture that looks unchanged while it is judged far more loosely.

Three ways it once passed, each run as a user would (exit code, exactly one `parity: error:` line,
no traceback; see tests/test_hostile_plugins.py), with the case ids' class first, as in
docs/security.md:

- `tol-`: a per-tap override on a bounded tap (probabilities, attention patterns) loose enough to
  pass uniform probabilities, legal before because the ceiling followed the magnitude carried from
  upstream (1.9e4 on the stress fixture: a ceiling of 19 on a probability);
- `rows-`: `rows` on every tap (only the last position compared), invisible in the report;
- `onnx-`: an ONNX graph whose baked-in weights are not `weights.safetensors`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from parity_harness._compare.judge import compare_tensors
from parity_harness._core.precision import TIERS, Precision
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.tolerances import CEILINGS, override_atol_ceiling, tap_magnitude
from tests.conftest import REPO, edit_manifest, rehash, run_cli
from tests.test_hostile_plugins import assert_exit_2_one_line

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

STRESS = REPO / "fixtures" / "toy-stress"
FIXTURES = {"toy": REPO / "fixtures" / "toy", "stress": STRESS}


def null_answer(fixture: Fixture, tap: str, golden: np.ndarray) -> np.ndarray:
    """What a broken implementation could return for a bounded tap: uniform probabilities (1/V, and
    1/(i+1) over the causal keys of query i), or zeros for a normalized LayerNorm output."""
    if tap.endswith("hook_normalized"):
        return np.zeros_like(golden)
    if tap.endswith("attn.hook_pattern"):
        t = golden.shape[-1]
        uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
        return np.broadcast_to(uniform, golden.shape).astype(golden.dtype)
    return np.full_like(golden, 1.0 / golden.shape[-1])


def carried_magnitudes(fixture: Fixture, precision: Precision) -> dict[str, float]:
    """The largest |golden| up to each tap in dataflow order (what the ceilings scale with)."""
    golden = fixture.golden(precision)
    out, carried = {}, 0.0
    for tap in fixture.tap_names:
        carried = max(carried, tap_magnitude(golden[c.name][tap] for c in fixture.cases))
        out[tap] = carried
    return out


def passes_everywhere(fixture: Fixture, precision: Precision, tap: str, atol: float, rtol: float) -> bool:
    """Would the null answer pass on every case under this tolerance?"""
    golden = fixture.golden(precision)
    return all(compare_tensors(null_answer(fixture, tap, golden[c.name][tap]), golden[c.name][tap], atol, rtol).passed
               for c in fixture.cases)


def bounded_taps(fixture: Fixture) -> list[str]:
    return [t for t in fixture.tap_names if fixture.model.value_range(t) is not None]


# -- tol: the ceiling of a bounded tap follows its own range -------------------------------------------------

def test_bounded_taps_are_the_softmax_outputs_and_the_normalized_layernorm_outputs() -> None:
    fixture = load_fixture(FIXTURES["toy"])
    probability = [t for t in bounded_taps(fixture) if fixture.model.value_range(t) == (0.0, 1.0)]
    assert probability == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern", "probs",
                           "logit_lens.0", "logit_lens.1", "logit_lens.2"]
    normalized = [t for t in bounded_taps(fixture) if t not in probability]
    assert normalized == [t for t in fixture.tap_names if t.endswith("hook_normalized")] and len(normalized) == 5
    # The ranges are true of the goldens (both tiers, every case): nothing outside them.
    for precision in TIERS:
        for case_taps in fixture.golden(precision).values():
            for tap in bounded_taps(fixture):
                lo, hi = fixture.model.value_range(tap)  # type: ignore[misc]
                assert lo <= case_taps[tap].min() and case_taps[tap].max() <= hi, tap


@pytest.mark.parametrize("name", ["toy", "stress"])
@pytest.mark.parametrize("precision", TIERS)
def test_tol_no_legal_override_lets_uniform_probabilities_pass(name: str, precision: Precision) -> None:
    """At its ceiling (atol and rtol), an override of a bounded tap still fails the null answer."""
    fixture = load_fixture(FIXTURES[name])
    carried = carried_magnitudes(fixture, precision)
    for tap in bounded_taps(fixture):
        atol = override_atol_ceiling(precision, carried[tap], fixture.model.value_range(tap))
        assert not passes_everywhere(fixture, precision, tap, atol, CEILINGS[precision].rtol), (tap, atol)


def test_tol_the_carried_magnitude_alone_would_let_uniform_probabilities_pass_on_stress() -> None:
    """The review's finding, kept as a measurement: without the range the fp32 ceiling of `probs` is ~19."""
    fixture = load_fixture(STRESS)
    carried = carried_magnitudes(fixture, "fp32")
    for tap in ("probs", "blocks.1.attn.hook_pattern", "logit_lens.0"):
        unbounded = override_atol_ceiling("fp32", carried[tap], None)
        assert unbounded > 10 and passes_everywhere(fixture, "fp32", tap, unbounded, 0.0), (tap, unbounded)
        assert override_atol_ceiling("fp32", carried[tap], fixture.model.value_range(tap)) == pytest.approx(0.1)


def test_tol_the_committed_stress_overrides_are_within_the_bounded_ceilings() -> None:
    fixture = load_fixture(STRESS)
    for precision in TIERS:
        carried = carried_magnitudes(fixture, precision)
        for tap, tol in fixture.tolerances[precision].overrides.items():
            bounds = fixture.model.value_range(tap)
            if bounds is not None:
                assert tol.atol <= override_atol_ceiling(precision, carried[tap], bounds), (precision, tap)
    assert fixture.loose == []


def uniform_passing_atol(fixture: Fixture, tap: str) -> float:
    """The smallest atol (rtol 0, two digits, rounded up) under which uniform probabilities pass `tap`."""
    golden = fixture.golden("fp32")
    worst = max(float(np.abs(null_answer(fixture, tap, golden[c.name][tap]).astype(np.float64)
                             - golden[c.name][tap]).max()) for c in fixture.cases)
    return float(f"{worst * 1.01:.2g}")


@pytest.fixture
def stress_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "toy-stress"
    shutil.copytree(STRESS, dst)
    return dst


@pytest.mark.parametrize("tap", ["probs", "blocks.1.attn.hook_pattern"],
                         ids=["tol-uniform-probs-override-resealed", "tol-uniform-pattern-override-resealed"])
def test_tol_uniform_passing_override_is_refused_by_seal_and_run_and_loose_with_the_flag(
    stress_copy: Path, tmp_path: Path, tap: str
) -> None:
    """tol-uniform-probs-override-resealed: refused (exit 2, one line) unless --allow-loose-tolerances,
    and then every report says LOOSE."""
    fixture = load_fixture(STRESS)
    atol = uniform_passing_atol(fixture, tap)
    assert passes_everywhere(fixture, "fp32", tap, atol, 0.0)  # the override really lets uniform pass
    edit_manifest(stress_copy, lambda m: m["tolerances"]["fp32"]["overrides"].update(
        {tap: {"atol": atol, "rtol": 0.0}}), seal=False)
    before = (stress_copy / "manifest.json").read_bytes()
    needles = (f"overrides[{tap!r}].atol {atol:g} is above the ceiling 0.1", "a tap in the range [0, 1]")
    assert_exit_2_one_line(run_cli("seal", "--fixture", str(stress_copy)), *needles)
    assert (stress_copy / "manifest.json").read_bytes() == before  # nothing sealed
    sealed = run_cli("seal", "--fixture", str(stress_copy), "--allow-loose-tolerances")
    assert sealed.returncode == 0, sealed.stderr
    run = ["run", "--fixture", str(stress_copy), "--backends", "numpy", "--precision", "fp32", "-q"]
    assert_exit_2_one_line(run_cli(*run), str(stress_copy / "manifest.json"), *needles, "--allow-loose-tolerances")
    report = tmp_path / "r.json"
    proc = run_cli(*run, "--allow-loose-tolerances", "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    last = proc.stdout.splitlines()[-2:]
    assert last[0].startswith("LOOSE TOLERANCES") and needles[0] in last[0]
    assert last[1].startswith("PASS (LOOSE TOLERANCES)")
    data = json.loads(report.read_text())
    assert data["loose"] is True and any(needles[0] in p for p in data["tolerances_loose"])


# -- rows: the rows in force are shown and pinned --------------------------------------------------------------

def add_rows(root: Path, rows: int) -> None:
    """`rows` on every tap, the golden files cut to match, hashes and seal rewritten (a deliberate edit)."""
    fixture = load_fixture(root)
    for precision in TIERS:
        path = fixture.golden_path(precision)
        tensors = load_file(str(path))
        for key, value in tensors.items():
            tap = key.split("/", 1)[1]
            index = [slice(None)] * value.ndim
            index[fixture.model.rows_axis(tap)] = slice(-rows, None)  # type: ignore[index]
            tensors[key] = np.ascontiguousarray(value[tuple(index)])
        save_file(tensors, str(path))
    edit_manifest(root, lambda m: [t.update(rows=rows) for t in m["taps"]], seal=False)
    rehash(root)


RowsRuns = tuple[Path, Path, subprocess.CompletedProcess[str]]  # the toy's report, the rows copy's, its run


@pytest.fixture(scope="module")
def rows_reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RowsRuns]:
    """The toy and a copy with rows 1 on every tap, each run with numpy (JSON report)."""
    tmp = tmp_path_factory.mktemp("rows")
    root = tmp / "toy"
    shutil.copytree(FIXTURES["toy"], root)
    add_rows(root, 1)
    reports = []
    for name, fx in (("toy", FIXTURES["toy"]), ("rows", root)):
        reports.append(tmp / f"{name}.json")
        proc = run_cli("run", "--fixture", str(fx), "--backends", "numpy", "-q", "--json", str(reports[-1]))
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    yield reports[0], reports[1], proc


def test_rows_are_on_the_tolerances_line(rows_reports: RowsRuns) -> None:
    line = rows_reports[2].stdout.splitlines()[-2]
    assert line.startswith("tolerances: fp32 atol 1e-05, rtol 1e-05; fp64 atol 1e-12; "
                           "reduced atol c x eps x M_tap: fp16 c 32, bf16 c 32; "
                           "rows: last 1 position of 43 taps (hook_embed .. logit_lens.2); manifest_sha256 "), line


def test_rows_are_in_the_pinned_tolerance_summary(rows_reports: RowsRuns) -> None:
    toy, rows = (json.loads(p.read_text()) for p in rows_reports[:2])
    assert toy["fixture_id"] == rows["fixture_id"]  # same weights, cases, config: the id cannot tell them apart
    names = load_fixture(FIXTURES["toy"]).tap_names
    for tier in TIERS:
        assert "rows" not in toy["tolerances"][tier]
        assert rows["tolerances"][tier]["rows"] == dict.fromkeys(names, 1)
        assert {k: v for k, v in rows["tolerances"][tier].items() if k != "rows"} == toy["tolerances"][tier]


@pytest.mark.parametrize("case", ["rows-on-every-tap-merged-with-the-toy"])
def test_rows_merge_refuses_shards_judged_on_other_rows(rows_reports: RowsRuns, case: str) -> None:
    toy, rows, _ = rows_reports
    proc = run_cli("merge", str(toy), str(rows))
    assert_exit_2_one_line(proc, str(rows), "judged with other tolerances")


# -- onnx: a graph's baked-in weights are the fixture's ------------------------------------------------------

def change_initializer(path: Path, name: str) -> None:
    """One element of initializer `name` moved by one float32 ulp, the graph file rewritten."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    model = onnx.load(str(path))
    (init,) = [t for t in model.graph.initializer if t.name == name]
    value = numpy_helper.to_array(init).copy()
    value.flat[0] = np.nextafter(value.flat[0], np.float32(np.inf))
    init.CopyFrom(numpy_helper.from_array(value, name))
    onnx.save(model, str(path))


ONNX = [  # (case, graph file, initializer, backend, the parameter the line names)
    ("onnx-named-weight-onnxruntime", "model.onnx", "h__1__mlp__c_proj__weight", "onnxruntime",
     "'h.1.mlp.c_proj.weight'"),
    ("onnx-tied-unembedding-onnx-reference", "model.onnx", "permute", "onnx-reference", "'wte.weight'"),
    ("onnx-embedding-onnxruntime-optimized", "model.logits.onnx", "val_1", "onnxruntime-optimized", "'wte.weight'"),
    ("onnx-layernorm-bias-onnxruntime-web", "model.onnx", "ln_f__bias", "onnxruntime-web", "'ln_f.bias'"),
    ("onnx-decode-graph-onnxruntime", "model.decode.onnx", "h__0__attn__c_attn__bias", "onnxruntime",
     "'h.0.attn.c_attn.bias'"),
]


@pytest.mark.parametrize(("case", "graph", "initializer", "backend", "parameter"), ONNX, ids=[c[0] for c in ONNX])
def test_onnx_a_graph_with_one_changed_initializer_is_refused(
    fixture_copy: Path, case: str, graph: str, initializer: str, backend: str, parameter: str
) -> None:
    if backend == "onnxruntime-web":
        from parity_harness._backends.browser.onnxruntime_web_backend import OnnxRuntimeWebBackend

        missing = OnnxRuntimeWebBackend().missing_dependencies()
        if missing:
            pytest.skip(f"onnxruntime-web needs {', '.join(missing)}")
    change_initializer(fixture_copy / graph, initializer)
    rehash(fixture_copy)  # hashes and seal rewritten: only the weights check can tell
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", backend, "-q")
    assert_exit_2_one_line(proc, str(fixture_copy / graph), parameter, "weights.safetensors")


def test_onnx_every_committed_graph_embeds_its_fixtures_weights() -> None:
    pytest.importorskip("onnx")
    from parity_harness._backends.onnx.graph import load_onnx
    from parity_harness._backends.onnx.weights import graph_weight_problem

    for root in FIXTURES.values():
        fixture = load_fixture(root)
        graphs = sorted(root.glob("*.onnx"))
        assert graphs
        for path in graphs:
            assert graph_weight_problem(load_onnx(path), fixture.weights()) is None, path


def test_onnx_a_missing_parameter_is_named() -> None:
    pytest.importorskip("onnx")
    from parity_harness._backends.onnx.graph import load_onnx
    from parity_harness._backends.onnx.weights import graph_weight_problem

    fixture = load_fixture(FIXTURES["toy"])
    model = load_onnx(FIXTURES["toy"] / "model.onnx")
    weights = fixture.weights()
    weights["h.0.ln_1.weight"] = weights["h.0.ln_1.weight"] * np.float32(2)  # the graph holds the other one
    assert graph_weight_problem(model, weights) == (
        "initializer 'h__0__ln_1__weight' differs from parameter 'h.0.ln_1.weight'")
    kept = [t for t in model.graph.initializer if t.name != "ln_f__weight"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    assert graph_weight_problem(model, fixture.weights()) == "parameter 'ln_f.weight' is not in the graph"
