"""`parity diff A B` run against run (issue 41, deliverable 3): each side a backend or a dump, compared tap by tap
with each other in units of eps x M_tap, no golden needed for the apart rule (parity_harness/_compare/differential.py,
parity_harness/_tools/diff.py, `api.diff`).

- Acceptance: two dumps of one fixture, one with an error planted in one tap of one case, exit 1 naming that tap,
  its worst cell by axis, the units the plant costs (computed here from the golden's M_tap), and `--json` valid
  against the report schema (a document that breaks the `diff` object does not validate).
- The apart rule flags what the worse-than-peer rule cannot (two sides off in opposite directions, equally far
  from the truth), at a bound of 2c derived from the per-tap rule's c; a plant below the bound and below the
  tolerance is not flagged.
- A dump against a live backend (mixed), and the API's Differential.
- Every refusal is one line and exit 2 on the CLI, and the same line as the API's ParityError. The pytest plugin
  does not expose diff (docs/diagnosis.md says so).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import parity_harness.api as parity
from parity_harness._authoring.presets import SCALED_C
from parity_harness._compare.differential import APART, RATIO, WORSE_THAN_PEER, bound
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import EPS
from parity_harness._fixture.fixture import load_fixture
from parity_harness._fixture.tolerances import tap_magnitude
from parity_harness._tools.diff import per_tap_c
from parity_harness._views.report_schema import report_problems
from tests.helpers import TOY, assert_one_error_line

Parity = Callable[..., tuple[int, str, str]]
TAP = "blocks.1.hook_resid_mid"
CASE = "all_words"
CELL = (2, 5)  # position 2, dim 5


@pytest.fixture
def parity_cli(capsys: pytest.CaptureFixture[str]) -> Parity:
    """`parity ARGS` in-process: (exit code, stdout, stderr)."""
    import parity_harness._cli.main as cli

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="module")
def d1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """numpy's fp32 and fp64 dumps of the toy, as `parity run --backends numpy --save-outputs D1` writes them
    (made once for the module; the acceptance test runs that command itself)."""
    directory = tmp_path_factory.mktemp("diff") / "D1"
    assert parity.run(["numpy"], precisions="all", decoding=False, save_outputs=directory)
    return directory


def edit_dump(src: Path, dst: Path, tensors: Callable[[dict[str, np.ndarray]], None] | None = None,
              metadata: Callable[[dict[str, str]], None] | None = None) -> Path:
    """A copy of a dump with its tensors and/or metadata changed."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(src), "numpy") as f:
        meta = dict(f.metadata())
        data = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open is not a mapping)
    if tensors is not None:
        tensors(data)
    if metadata is not None:
        metadata(meta)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(data, str(dst), metadata=meta)
    return dst


def plant(delta: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(data: dict[str, np.ndarray]) -> None:
        key = f"{CASE}/{TAP}"
        array = data[key].copy()  # [T, d]
        array[CELL] += np.float32(delta)
        data[key] = array

    return change


def units_of(delta_cell: float, precision: str = "fp32") -> float:
    """A change of one cell in units of eps x M_tap, M_tap from the fp32 golden (the per-tap rule's)."""
    fixture = load_fixture(TOY)
    magnitude = tap_magnitude(fixture.golden_tap("fp32", c.name, TAP) for c in fixture.cases)
    return abs(delta_cell) / (EPS[precision] * magnitude)  # type: ignore[index]


def toy_tolerance_units() -> float:
    """The toy's fp32 tolerance at TAP's magnitude, atol + rtol x M_tap, in units of eps32 x M_tap: above c = 64
    there, so it is the apart rule's c at that tap."""
    fixture = load_fixture(TOY)
    tol = fixture.tolerances["fp32"].for_tap(TAP)
    magnitude = abs(1.0) / units_of(1.0) / EPS["fp32"]  # M_tap
    return (tol.atol + tol.rtol * magnitude) / (EPS["fp32"] * magnitude)


def planted_units(d1: Path, d2: Path) -> float:
    from safetensors import safe_open

    key = f"{CASE}/{TAP}"
    with safe_open(str(d1 / "numpy.fp32.safetensors"), "numpy") as f1, \
            safe_open(str(d2 / "numpy.fp32.safetensors"), "numpy") as f2:
        diff = f2.get_tensor(key).astype(np.float64) - f1.get_tensor(key).astype(np.float64)
    return units_of(float(np.abs(diff).max()))


def test_two_dumps_one_planted_exit_1_naming_the_tap_and_the_json_validates(parity_cli: Parity,
                                                                              tmp_path: Path) -> None:
    d1 = tmp_path / "D1"
    code, out, err = parity_cli("run", "-q", "--backends", "numpy", "--precision", "fp32", "--save-outputs", str(d1))
    assert code == 0, (out[-2000:], err)
    d2 = tmp_path / "D2"
    edit_dump(d1 / "numpy.fp32.safetensors", d2 / "numpy.fp32.safetensors", plant(1e-3))
    report = tmp_path / "diff.json"
    code, out, err = parity_cli("diff", "-q", str(d1 / "numpy.fp32.safetensors"), str(d2 / "numpy.fp32.safetensors"),
                                "--json", str(report))
    assert code == 1, (out[-3000:], err)
    lines = out.splitlines()
    (first,) = [ln for ln in lines if ln.startswith("first divergence at ")]
    assert first.startswith(f"first divergence at {TAP} (worse-than-peer, apart: "), first
    assert f"case {CASE}, position {CELL[0]} (" in first and f"dim {CELL[1]} [{CELL[0]}, {CELL[1]}]" in first, first
    assert lines[-1].startswith(f"FLAGGED: 1 tap(s) where one side is far from the other or from the truth, first at "
                                f"{TAP} (taps compared: 43/43)"), lines[-1]
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert report_problems(doc) == []
    diff = doc["diff"]
    assert diff["exit_code"] == 1 and diff["verdict"] == "disagree" and diff["first_divergence"]["tap"] == TAP
    assert diff["first_divergence"]["cell"]["axes"] == {"position": CELL[0], "dim": CELL[1]}
    assert diff["c"] == SCALED_C["fp32"] and diff["bound"] == 2 * SCALED_C["fp32"]
    assert [(f["tap"], f["rule"]) for f in diff["flags"]] == [(TAP, WORSE_THAN_PEER), (TAP, APART)]
    expected = planted_units(d1, d2)  # the plant in units of eps32 x M_tap, from the bytes and the golden
    assert diff["first_divergence"]["between"] == pytest.approx(expected, rel=1e-9)
    (row,) = [t for t in diff["taps"] if t["tap"] == TAP]
    assert row["bound"] == pytest.approx(2 * max(SCALED_C["fp32"], toy_tolerance_units()), rel=1e-12)
    assert expected > row["bound"] > diff["bound"]
    others = [t["between"] for t in diff["taps"] if t["tap"] != TAP]
    assert others == [0.0] * len(others)  # every other tap identical: the plant is the only difference
    broken = json.loads(json.dumps(doc))
    broken["diff"]["flags"][0]["rule"] = "louder"
    assert report_problems(broken)
    broken = json.loads(json.dumps(doc))
    del broken["diff"]["bound"]
    assert report_problems(broken)


def test_the_apart_rule_flags_two_sides_equally_far_from_the_truth(parity_cli: Parity, d1: Path,
                                                                   tmp_path: Path) -> None:
    """+delta in one dump, -delta in the other: neither is worse than its peer (ratio 1), both break the tier
    (notes), and |A - B| = 2 delta is beyond the bound: only the apart rule, which reads no golden value, flags it."""
    delta = 120.0 / units_of(1.0)  # 120 units of eps32 x M_tap, in value
    up = edit_dump(d1 / "numpy.fp32.safetensors", tmp_path / "up" / "numpy.fp32.safetensors", plant(delta))
    down = edit_dump(d1 / "numpy.fp32.safetensors", tmp_path / "down" / "numpy.fp32.safetensors", plant(-delta))
    diff = parity.diff(up, down)
    assert not diff and diff.first is not None and diff.first.tap == TAP
    assert [(f.rule, f.side) for f in diff.flag_list] == [(APART, None)]
    row = diff.first
    a, b = (row.units[label] for label in diff.backends)
    assert a is not None and b is not None and max(a, b) < RATIO * min(a, b)
    assert row.between is not None and row.between > bound(max(per_tap_c(load_fixture(TOY), "fp32"),
                                                                toy_tolerance_units()))
    assert len(diff.notes) == 2  # both break the fp32 tier's tolerance at that tap


def test_a_plant_below_the_tolerance_and_the_bound_is_not_flagged(d1: Path, tmp_path: Path) -> None:
    delta = 5.0 / units_of(1.0)  # 5 units: more than numpy and pytorch differ by (up to ~3), within every rule
    d2 = edit_dump(d1 / "numpy.fp32.safetensors", tmp_path / "D2" / "numpy.fp32.safetensors", plant(delta))
    diff = parity.diff(d1 / "numpy.fp32.safetensors", d2)
    assert diff, [f.text for f in diff.flag_list] + diff.notes
    row = next(r for r in diff.rows if r.tap == TAP)
    assert row.between is not None and 4 < row.between < diff.bound


def test_a_dump_against_a_live_backend(parity_cli: Parity, d1: Path, tmp_path: Path) -> None:
    """A dump and a live run of the same backend: the dump is labelled by its path; the same numbers, 0 apart."""
    dump = str(d1 / "numpy.fp32.safetensors")
    code, out, err = parity_cli("diff", "-q", dump, "numpy")
    assert code == 0, (out[-3000:], err)
    assert out.splitlines()[-1].startswith("NOTHING FLAGGED on every tap"), out[-500:]
    d2 = edit_dump(d1 / "numpy.fp32.safetensors", tmp_path / "D2" / "numpy.fp32.safetensors", plant(1e-3))
    diff = parity.diff("numpy", d2)
    assert not diff and diff.first is not None and diff.first.tap == TAP
    assert [s.source for s in diff.sides] == ["live", "dump"] and diff.backends == ("numpy", str(d2))
    assert [r.between for r in diff.rows if r.tap != TAP] == [0.0] * (len(diff.rows) - 1)
    assert diff.report is not None and {r.backend for r in diff.report.runs} == {"numpy", str(d2)}


def test_fp64_dumps_take_their_own_precision(d1: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "numpy.fp64.safetensors"
    copy.parent.mkdir()
    shutil.copy(d1 / "numpy.fp64.safetensors", copy)
    diff = parity.diff(d1 / "numpy.fp64.safetensors", copy)
    assert diff and diff.precision == "fp64" and diff.c == SCALED_C["fp64"] and diff.eps == EPS["fp64"]


def other_fixture(meta: dict[str, str]) -> None:
    meta["fixture_id"] = "sha256:" + "0" * 64


REFUSALS: dict[str, tuple[Callable[[Path, Path], tuple[list[str], dict[str, object]]], str]] = {
    "the same dump twice": (
        lambda d1, _: ([str(d1 / "numpy.fp32.safetensors")] * 2, {}), "the same dump twice"),
    "a dump of another fixture": (
        lambda d1, tmp: ([str(d1 / "numpy.fp32.safetensors"),
                          str(edit_dump(d1 / "numpy.fp32.safetensors", tmp / "other" / "numpy.fp32.safetensors",
                                        metadata=other_fixture))], {}), "made for another fixture"),
    "a dump of a precision other than asked": (
        lambda d1, _: ([str(d1 / "numpy.fp64.safetensors"), "numpy"], {"precision": "fp32"}),
        "a dump of fp64 results; parity diff was asked for fp32"),
    "dumps of two precisions": (
        lambda d1, _: ([str(d1 / "numpy.fp32.safetensors"), str(d1 / "numpy.fp64.safetensors")], {}),
        "both sides must be in one precision"),
    "an unknown name": (lambda d1, _: (["numpy", "no-such-backend"], {}), "unknown backend 'no-such-backend'"),
    "the same backend twice": (lambda d1, _: (["numpy", "numpy"], {}), "diff names 'numpy' more than once"),
    "a missing dump": (lambda d1, _: ([str(d1 / "nothing.fp32.safetensors"), "numpy"], {}), "file not found"),
    "a backend without the precision": (lambda d1, _: (["typescript", "numpy"], {"precision": "fp32"}),
                                        "typescript computes in fp64 only"),
}


@pytest.mark.parametrize("what", list(REFUSALS))
def test_each_refusal_is_one_line_the_same_on_the_cli_and_the_api(parity_cli: Parity, d1: Path, tmp_path: Path,
                                                                  what: str) -> None:
    make, needle = REFUSALS[what]
    args, options = make(d1, tmp_path)
    flags = [f"--{k}={v}" for k, v in options.items()]
    code, out, err = parity_cli("diff", "-q", *args, *flags)
    assert_one_error_line(code, out, err, needle)
    with pytest.raises(ParityError) as caught:
        parity.diff(args[0], args[1], precision=options.get("precision"))  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and err.strip() == f"parity: error: {caught.value}", (err, caught.value)


def test_the_api_refuses_a_stored_format_and_a_wrong_type(d1: Path) -> None:
    with pytest.raises(ParityError, match="a stored weight format has no float64 truth"):
        parity.diff("numpy", d1 / "numpy.fp32.safetensors", precision="q8_0")
    with pytest.raises(ParityError, match="diff: B: expected a backend name, a Backend instance or a dump's path"):
        parity.diff("numpy", 3)  # type: ignore[arg-type]


def test_json_left_unusable_on_a_refusal(parity_cli: Parity, d1: Path, tmp_path: Path) -> None:
    report = tmp_path / "diff.json"
    code, out, err = parity_cli("diff", "-q", "numpy", "numpy", "--json", str(report))
    assert_one_error_line(code, out, err, "more than once")
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert doc["usable"] is False and doc["command"] == "diff" and report_problems(doc) == []


def test_the_pytest_plugin_does_not_expose_diff() -> None:
    """docs/diagnosis.md says the plugin has no diff; this fails the day it gains one, so the docs are updated."""
    import parity_harness.pytest_plugin as plugin

    assert not [name for name in vars(plugin) if "diff" in name.lower()]


def test_fp16_in_fp16_units_with_the_fixtures_c(tmp_path: Path) -> None:
    """A reduced precision: eps 2^-10 and the fixture's c (32), bound 2c = 64 units; a plant on the fp16 grid."""
    directory = tmp_path / "F"
    assert parity.run(["numpy"], precisions="fp16", decoding=False, save_outputs=directory)
    dump = directory / "numpy.fp16.safetensors"

    def on_grid(data: dict[str, np.ndarray]) -> None:
        key = f"{CASE}/{TAP}"
        array = data[key].copy()  # [T, d], float32 holding fp16 values
        array[CELL] = np.float32(np.float16(array[CELL] + np.float32(2.0)))  # ~95 units of eps16 x M_tap (21.6)
        data[key] = array

    planted = edit_dump(dump, tmp_path / "G" / "numpy.fp16.safetensors", on_grid)
    fixture = load_fixture(TOY)
    same = parity.diff("numpy", dump, precision="fp16")
    assert same and same.eps == EPS["fp16"] and same.c == fixture.spec.reduced_c["fp16"] and same.bound == 64
    diff = parity.diff(dump, planted)
    assert diff.precision == "fp16" and diff.first is not None and diff.first.tap == TAP
    row = diff.first
    assert row.c == diff.c  # the per-tap atol of fp16 is c x eps x M_tap itself: its tolerance is c units
    assert row.between is not None and row.between > diff.bound
    assert row.between == pytest.approx(units_of(2.0, "fp16"), rel=0.01)
