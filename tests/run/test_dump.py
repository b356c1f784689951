"""Tap dumps (docs/dump-format.md): `parity run --save-outputs`, `parity compare`, the Node writer, the fixture id."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from parity_harness._backends.node.runtime import find_node
from parity_harness._core.errors import BackendUnavailable
from parity_harness._fixture.fixture import load_fixture
from parity_harness._fixture.identity import canonical_json, fixture_id
from tests.helpers import REPO, assert_one_line_error, edit_manifest, perturb_weight, rehash, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

TAP = "blocks.0.hook_resid_mid"  # the tap the perturbation tests move


@pytest.fixture(scope="session")
def numpy_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    """`parity run --backends numpy --save-outputs D --json`: the dump directory, the run and its JSON."""
    root = tmp_path_factory.mktemp("numpy-dumps")
    proc = run_cli("run", "-v", "--backends", "numpy", "--save-outputs", str(root / "D"), "--json",
                   str(root / "run.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "D", proc, json.loads((root / "run.json").read_text())


def read_dump(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118


def rewrite(src: Path, dst: Path, tensors: dict[str, np.ndarray] | None = None,
            metadata: dict[str, str] | None = None) -> Path:
    old_tensors, old_meta = read_dump(src)
    save_file(old_tensors if tensors is None else tensors, str(dst),
              metadata=old_meta if metadata is None else metadata)
    return dst


def table(stdout: str) -> list[str]:
    """The forward per-tap table of `-v` (decoding lines, indented, are not part of a dump)."""
    return [ln for ln in stdout.splitlines() if " vs " in ln and not ln.startswith("  ")]


def test_saved_dumps_compare_to_the_runs_verdict_table_and_counts(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    directory, run, run_json = numpy_dumps
    dumps = sorted(directory.iterdir())
    assert [d.name for d in dumps] == ["numpy.fp32.safetensors", "numpy.fp64.safetensors"]
    proc = run_cli("compare", "-v", *map(str, dumps), "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert table(proc.stdout) == table(run.stdout) and len(table(proc.stdout)) == len(run_json["taps"]) > 0
    assert proc.stdout.splitlines()[-1] == run.stdout.splitlines()[-1]
    assert f"numpy fp32  from dump {dumps[0]}" in proc.stdout
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["counts"] == run_json["counts"] and report["counts"]["passed"] > 0
    assert report["fixture_id"] == run_json["fixture_id"] == fixture_id(load_fixture(REPO / "fixtures" / "toy"))
    assert {r["status"] for r in report["runs"]} == {"dump"}
    tensors, meta = read_dump(dumps[0])
    assert meta["backend"] == "numpy" and meta["precision"] == "fp32" and meta["format"] == "parity-dump"
    assert meta["fixture_id"] == run_json["fixture_id"] and meta["platform"] and meta["parity_version"]
    assert all(t.dtype == np.float32 for t in tensors.values())


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_one_cell_of_one_tap_moved_by_1e_3_exits_1_and_names_that_tap(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path, precision: str  # type: ignore[type-arg]
) -> None:
    src = numpy_dumps[0] / f"numpy.{precision}.safetensors"
    tensors, _ = read_dump(src)
    key = f"grammar_1/{TAP}"
    tensors[key] = tensors[key].copy()
    tensors[key][2, 3] += tensors[key].dtype.type(1e-3)
    moved = rewrite(src, tmp_path / "moved.safetensors", tensors)
    proc = run_cli("compare", str(moved), "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence at {TAP}, case grammar_1, position 2 ('cat'), dim 3 [2, 3]" in proc.stdout
    verdict = proc.stdout.splitlines()[-1]
    assert verdict.startswith("FAIL: disagreement in ") and f"numpy {precision} vs {precision}" in verdict
    report = json.loads((tmp_path / "c.json").read_text())
    failing = {(r["case"], r["tap"]) for r in report["results"] if r["status"] == "fail"}
    assert failing == {("grammar_1", TAP)}  # only that cell moved: nothing downstream of it in a dump


def test_nan_in_a_dump_fails_like_nan_from_a_live_backend(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    src = numpy_dumps[0] / "numpy.fp32.safetensors"
    tensors, _ = read_dump(src)
    tensors["single_token/logits"] = tensors["single_token/logits"].copy()
    tensors["single_token/logits"][0, 5] = np.nan
    proc = run_cli("compare", str(rewrite(src, tmp_path / "nan.safetensors", tensors)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence at logits, case single_token" in proc.stdout
    assert "NaN in the candidate at [0, 5]" in proc.stdout


def test_an_fp32_dump_on_fp16_grid_is_named_by_the_grid_check(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    """One tap of one case rounded to fp16: the judge names fp16's grid, not only the tolerance."""
    src = numpy_dumps[0] / "numpy.fp32.safetensors"
    tensors, _ = read_dump(src)
    key = "longest_context/blocks.0.mlp.hook_post"
    tensors[key] = tensors[key].astype(np.float16).astype(np.float32)
    proc = run_cli("compare", str(rewrite(src, tmp_path / "fp16.safetensors", tensors)), "--json",
                   str(tmp_path / "c.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failing = [r for r in json.loads((tmp_path / "c.json").read_text())["results"] if r["status"] == "fail"]
    assert [(r["case"], r["tap"]) for r in failing] == [("longest_context", "blocks.0.mlp.hook_post")]
    assert "(fp16's grid) where fp32 was declared: computed in fp16" in failing[0]["message"]


def test_a_dump_made_for_another_fixture_exits_2(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], fixture_copy: Path  # type: ignore[type-arg]
) -> None:
    perturb_weight(fixture_copy, "h.1.mlp.c_fc.weight", (0, 0), 1e-3)  # another fixture: its weights differ
    dump = numpy_dumps[0] / "numpy.fp32.safetensors"
    proc = run_cli("compare", "--fixture", str(fixture_copy), str(dump))
    assert_one_line_error(proc, str(dump), "made for another fixture")


def _malformed(src: Path, tmp: Path, kind: str) -> Path:
    """A copy of a valid fp32 dump broken in one way."""
    tensors, meta = read_dump(src)
    out = tmp / f"{kind}.safetensors"
    if kind == "truncated":
        out.write_bytes(src.read_bytes()[:-100])
    elif kind == "not-safetensors":
        out.write_text("hello\n")
    elif kind == "missing-file":
        pass
    elif kind == "dtype":
        tensors["grammar_0/hook_embed"] = tensors["grammar_0/hook_embed"].astype(np.float64)
        save_file(tensors, str(out), metadata=meta)
    elif kind == "shape":
        tensors["grammar_0/hook_embed"] = tensors["grammar_0/hook_embed"][:-1]
        save_file(tensors, str(out), metadata=meta)
    elif kind == "unknown-key":
        save_file({**tensors, "no_such_case/hook_embed": tensors["grammar_0/hook_embed"]}, str(out), metadata=meta)
    elif kind == "no-metadata":
        save_file(tensors, str(out))
    elif kind == "format-version":
        save_file(tensors, str(out), metadata={**meta, "format_version": "99"})
    elif kind == "precision":
        save_file(tensors, str(out), metadata={**meta, "precision": "fp8"})
    elif kind == "fp16-off-grid":  # float32 tensors whose values fp16 cannot hold
        save_file(tensors, str(out), metadata={**meta, "precision": "fp16"})
    elif kind == "no-fixture-id":
        save_file(tensors, str(out), metadata={k: v for k, v in meta.items() if k != "fixture_id"})
    elif kind == "no-tensors":
        save_file({}, str(out), metadata=meta)
    elif kind == "taps-unknown":
        save_file(tensors, str(out), metadata={**meta, "taps": "hook_embed,hook_nonsense"})
    elif kind == "case-missing":
        save_file({k: v for k, v in tensors.items() if not k.startswith("grammar_0/")}, str(out), metadata=meta)
    return out


@pytest.mark.parametrize(("kind", "needle"), [
    ("truncated", "not a readable safetensors file"),
    ("not-safetensors", "not a safetensors file"),
    ("missing-file", "file not found"),
    ("dtype", "'grammar_0/hook_embed' is F64, expected F32"),
    ("shape", "'grammar_0/hook_embed' has shape [4, 8], expected [5, 8]"),
    ("unknown-key", "unknown key 'no_such_case/hook_embed'"),
    ("no-metadata", "no parity dump metadata"),
    ("format-version", "unknown dump format version '99'"),
    ("precision", "metadata 'precision' is 'fp8'"),
    ("fp16-off-grid", "not a fp16 value (a fp16 dump holds float32 tensors of fp16 values)"),
    ("no-fixture-id", "lacks 'fixture_id'"),
    ("no-tensors", "holds no tensors"),
    ("taps-unknown", "unknown tap 'hook_nonsense'"),
    ("case-missing", "no tensor for case 'grammar_0'"),
])
def test_malformed_dumps_exit_2_with_one_line_naming_the_file(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path, kind: str, needle: str  # type: ignore[type-arg]
) -> None:
    bad = _malformed(numpy_dumps[0] / "numpy.fp32.safetensors", tmp_path, kind)
    proc = run_cli("compare", str(bad))
    assert_one_line_error(proc, str(bad), needle)


def test_two_dumps_of_the_same_backend_and_precision_exit_2(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    src = numpy_dumps[0] / "numpy.fp32.safetensors"
    again = shutil.copy(src, tmp_path / "again.safetensors")
    assert_one_line_error(run_cli("compare", str(src), str(again)), "a second dump of numpy fp32", str(src))


def test_a_subset_of_taps_is_not_supported_and_a_declared_tap_missing_fails(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    src = numpy_dumps[0] / "numpy.fp32.safetensors"
    tensors, meta = read_dump(src)
    logits_only = {k: v for k, v in tensors.items() if k.endswith("/logits")}
    del meta["taps"]  # without "taps", the taps a dump holds are the ones it supports
    proc = run_cli("compare", str(rewrite(src, tmp_path / "logits.safetensors", logits_only, meta)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n_cases = len(logits_only)
    assert proc.stdout.splitlines()[-1].startswith(
        "PASS: every backend agrees on every tap it was compared on (taps compared: numpy 1/43); "
        f"{n_cases} passed, 0 failed, {42 * n_cases} not supported")
    # Declared in "taps" but absent for one case: "missing", a failure as for a live backend.
    del tensors[f"grammar_2/{TAP}"]
    proc = run_cli("compare", str(rewrite(src, tmp_path / "hole.safetensors", tensors)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence at {TAP}, case grammar_2: missing" in proc.stdout


def test_save_outputs_to_an_unwritable_place_exits_2_before_running(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    proc = run_cli("run", "--backends", "numpy", "--save-outputs", str(blocker / "D"))
    assert_one_line_error(proc, "--save-outputs", str(blocker / "D"), "cannot write there")
    assert "parity: running" not in proc.stderr and proc.stdout == ""


def test_compare_writes_every_report_format(
    numpy_dumps: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path  # type: ignore[type-arg]
) -> None:
    dump = numpy_dumps[0] / "numpy.fp64.safetensors"
    proc = run_cli("compare", str(dump), "--budget", "--junit", str(tmp_path / "j.xml"), "--markdown",
                   str(tmp_path / "m.md"), "--plot", str(tmp_path / "p.svg"), "-vv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Error budget against the float64 truth" in proc.stdout and "    grammar_0 " in proc.stdout
    suites = ET.parse(tmp_path / "j.xml").getroot()
    assert suites.get("failures") == "0" and int(suites.get("tests", "0")) == 2 * 43
    assert "| numpy | fp64 vs fp64 | pass |" in (tmp_path / "m.md").read_text()
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")


def _node() -> str:
    try:
        return find_node()
    except BackendUnavailable as exc:
        pytest.skip(f"no Node: {exc}")


def test_the_node_written_dump_passes_compare(tmp_path: Path) -> None:
    node = _node()
    out = tmp_path / "ts.safetensors"
    script = REPO / "ts_model" / "node" / "dump.mts"
    proc = subprocess.run([node, str(script), str(REPO / "fixtures" / "toy"), str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    _, meta = read_dump(out)
    assert meta["fixture_id"] == fixture_id(load_fixture(REPO / "fixtures" / "toy"))  # computed in TypeScript
    assert meta["backend"] == "typescript" and meta["precision"] == "fp64" and "Node" in meta["platform"]
    compared = run_cli("compare", str(out))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert compared.stdout.splitlines()[-1].startswith(
        "PASS: every backend agrees on every tap it was compared on (taps compared: typescript 43/43); "
        "1032 passed, 0 failed")


def test_canonical_json_matches_javascript(tmp_path: Path) -> None:
    """RFC 8785 numbers and strings as Node's JSON.stringify writes them, through ts_model/node/dump-format.ts."""
    node = _node()
    values = [1e-05, 1e-7, 1.5e-7, 0.1, 100.0, 123.456, 1e21, 1e20, 2.0**-1074, -0.5, 1.7976931348623157e308,
              12, -3, 2**53, True, None, "é \u2028 \x01\n\"\\ \U0001f600", {"b": 1, "a": [1, {"é": 2, "e": 3}]}]
    script = tmp_path / "canon.mts"
    script.write_text(
        f'import {{ canonicalJson }} from "{(REPO / "ts_model" / "node" / "dump-format.ts").as_uri()}";\n'
        'import { readFileSync } from "node:fs";\n'
        'process.stdout.write(canonicalJson(JSON.parse(readFileSync(0, "utf-8"))));\n'
    )
    proc = subprocess.run([node, str(script)], input=json.dumps(values), capture_output=True, text=True,
                          encoding="utf-8", timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert canonical_json(values) == proc.stdout


def test_the_fixture_id_ignores_goldens_and_tolerances_but_not_weights_or_cases(fixture_copy: Path) -> None:
    original = fixture_id(load_fixture(fixture_copy))
    edit_manifest(fixture_copy, lambda m: m["tolerances"]["fp32"].update(atol=2e-5))
    golden = fixture_copy / "golden.fp32.safetensors"
    tensors, _ = read_dump(golden)
    tensors["grammar_0/hook_embed"] = tensors["grammar_0/hook_embed"] + np.float32(1e-7)  # "another CPU"
    save_file(tensors, str(golden))
    rehash(fixture_copy)
    assert fixture_id(load_fixture(fixture_copy)) == original
    edit_manifest(fixture_copy, lambda m: m["cases"][0]["tokens"].__setitem__(1, 2))
    changed_case = fixture_id(load_fixture(fixture_copy))
    assert changed_case != original
    perturb_weight(fixture_copy, "wte.weight", (0, 0), 1e-3)
    assert fixture_id(load_fixture(fixture_copy)) not in (original, changed_case)


def test_the_docs_recipe_writes_a_dump_that_compare_accepts(toy_dir: Path, tmp_path: Path) -> None:
    """docs/dump-format.md's byte-layout recipe (stdlib + NumPy) is literally usable."""
    from parity_harness._backends.numpy_backend import NumpyBackend

    doc = (REPO / "docs" / "dump-format.md").read_text()
    match = re.search(r"<!-- dump-recipe -->\n```python\n(.*?)\n```", doc, re.DOTALL)
    assert match, "the recipe block is gone from docs/dump-format.md"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "dump-format.md", "exec"), namespace)
    fixture = load_fixture(toy_dir)
    output = NumpyBackend().run(fixture, "fp64")
    tensors = {f"{case}/{tap}": value for case, taps in output.items() for tap, value in taps.items()}
    path = tmp_path / "recipe.safetensors"
    namespace["write_dump"](path, tensors, {
        "format": "parity-dump", "format_version": "1", "backend": "recipe", "precision": "fp64",
        "fixture_id": fixture_id(fixture), "platform": "test", "parity_version": "0.1.0",
    })
    proc = run_cli("compare", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(
        "PASS: every backend agrees on every tap it was compared on (taps compared: recipe 43/43); "
        "1032 passed, 0 failed")
