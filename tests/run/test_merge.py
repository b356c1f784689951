"""`parity merge`: JSON reports of sharded runs combine into the verdict and counts of one run of all."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

SHARDS = ("numpy", "onnxruntime")


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """One `parity run --json` per shard, and one run of both backends: {name: (json path, process)}."""
    root = tmp_path_factory.mktemp("shards")
    out = {}
    for name, backends in [*((s, s) for s in SHARDS), ("both", ",".join(SHARDS))]:
        path = root / f"{name}.json"
        proc = run_cli("run", "-v", "--backends", backends, "--json", str(path), "--save-outputs", str(root / name))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[name] = (path, proc)
    return out


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def checks(report: dict[str, Any]) -> set[tuple[str, ...]]:
    return {(r["backend"], r["precision"], r["golden"], r["case"], r["tap"], r["status"]) for r in report["results"]}


def runs_of(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((r["backend"], r["precision"], r["status"]) for r in report["runs"])


def test_two_shards_merge_to_the_verdict_and_counts_of_one_run_of_both(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    merged_json, junit, md = tmp_path / "merged.json", tmp_path / "merged.xml", tmp_path / "merged.md"
    proc = run_cli("merge", "-v", *(str(runs[s][0]) for s in SHARDS), "--json", str(merged_json), "--junit", str(junit),
                   "--markdown", str(md))
    both_path, both = runs["both"]
    assert proc.returncode == both.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == both.stdout.splitlines()[-1]  # the verdict line, counts included
    assert [ln for ln in proc.stdout.splitlines() if " vs " in ln] == [ln for ln in both.stdout.splitlines()
                                                                        if " vs " in ln]
    merged, one = load(merged_json), load(both_path)
    for key in ("passed", "exit_code", "counts", "fixture_id", "first_divergence"):
        assert merged[key] == one[key], key
    assert checks(merged) == checks(one) and merged["counts"]["passed"] > 0
    assert runs_of(merged) == runs_of(one) and ("onnxruntime", "fp64", "not_supported") in runs_of(one)
    assert len(merged["taps"]) == len(one["taps"]) and len(merged["budget"]) == len(one["budget"])
    # a testcase per tap of every tier, per decoding tap, per prompt's greedy tokens (test_views_decoding.py)
    expected = len(one["taps"]) + len(one["decoding"]["summaries"]) + len(one["decoding"]["greedy"])
    assert ET.parse(junit).getroot().get("tests") == str(expected)
    assert "| onnxruntime | fp32 vs fp32 | pass |" in md.read_text()


def test_a_failing_shard_makes_the_merge_fail(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    """A shard judged from a dump with one cell moved: the merged verdict is FAIL, exit 1, naming it."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    src = runs["numpy"][0].parent / "numpy" / "numpy.fp32.safetensors"
    with safe_open(str(src), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        meta = f.metadata()
    tensors["grammar_0/logits"] = tensors["grammar_0/logits"] + 1e-3
    save_file(tensors, str(tmp_path / "moved.safetensors"), metadata=meta)
    judged = run_cli("compare", str(tmp_path / "moved.safetensors"), "--json", str(tmp_path / "numpy.json"))
    assert judged.returncode == 1, judged.stdout + judged.stderr
    proc = run_cli("merge", str(tmp_path / "numpy.json"), str(runs["onnxruntime"][0]))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "numpy fp32 vs fp32: first divergence at logits, case grammar_0" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("FAIL: disagreement in numpy fp32 vs fp32, first at logits;")


@pytest.mark.parametrize(("change", "needle"), [
    (lambda r: r.update(fixture_id="sha256:" + "0" * 64), "a report of another fixture"),
    (lambda r: r.update(schema_version=2), "report schema version 2"),
    (lambda r: r.pop("fixture_id"), "has no fixture_id"),
    (lambda r: r.update(schema="something-else"), "not a parity report"),
    (lambda r: r.update(results="oops"), "'results' is not a list"),
    (lambda r: r["results"][0].update(backend=["x"]), 'results.backend is ["x"], expected str'),
    (lambda r: r["results"][0].update(max_abs="big"), 'results.max_abs is "big", expected float'),
    (lambda r: r.update(usable="yes"), "'usable' is 'yes'"),
])
def test_reports_that_cannot_be_merged_exit_2_naming_the_file(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path, change: Any, needle: str
) -> None:
    report = load(runs["onnxruntime"][0])
    change(report)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    assert_one_line_error(run_cli("merge", str(runs["numpy"][0]), str(bad)), str(bad), needle)


def test_the_same_backend_twice_or_a_broken_file_exits_2(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    numpy = str(runs["numpy"][0])
    assert_one_line_error(run_cli("merge", numpy, str(runs["both"][0])), "numpy fp32 is in", numpy)
    (tmp_path / "cut.json").write_text(runs["numpy"][0].read_text()[:100])
    assert_one_line_error(run_cli("merge", str(tmp_path / "cut.json")), "cut.json", "not valid JSON")
    assert_one_line_error(run_cli("merge", str(tmp_path / "none.json")), "none.json", "file not found")


def test_merging_one_report_reproduces_its_table_structural_failures_included(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    """A NaN (an infinite error, null in the JSON) reads back as inf: the merged table is the report's own."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    src = runs["numpy"][0].parent / "numpy" / "numpy.fp64.safetensors"
    with safe_open(str(src), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        meta = f.metadata()
    tensors["grammar_0/hook_embed"] = tensors["grammar_0/hook_embed"].copy()
    tensors["grammar_0/hook_embed"][1, 1] = float("nan")
    del tensors["grammar_1/logits"]  # declared in the metadata's "taps": missing, no error to show
    save_file(tensors, str(tmp_path / "nan.safetensors"), metadata=meta)
    judged = run_cli("compare", "-v", str(tmp_path / "nan.safetensors"), "--json", str(tmp_path / "nan.json"),
                     "--budget")
    assert judged.returncode == 1, judged.stdout + judged.stderr
    merged = run_cli("merge", "-v", str(tmp_path / "nan.json"), "--budget")
    assert merged.returncode == 1, merged.stdout + merged.stderr
    assert "max_abs inf" in judged.stdout and "max_abs -" in judged.stdout
    assert merged.stdout.splitlines()[1:] == judged.stdout.splitlines()[1:]  # all but the first line


@pytest.mark.parametrize("flag", ["--json", "--junit", "--markdown"])
def test_compare_and_merge_check_report_paths_before_any_work(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path, flag: str
) -> None:
    """As for `parity run`: an unwritable report path is exit 2 and one line, before anything is read."""
    bad = str(tmp_path / "no-such-dir" / "report.out")
    dumps = sorted(str(p) for p in (runs["numpy"][0].parent / "numpy").glob("*.safetensors"))
    for args in (("compare", *dumps, flag, bad), ("merge", str(runs["numpy"][0]), flag, bad)):
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("parity: error: ") and "no-such-dir" in proc.stderr


def test_a_report_with_nan_or_a_repeated_key_is_refused(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    """Reports are read as strictly as manifests: what parity never writes cannot be merged."""
    text = runs["numpy"][0].read_text()
    for name, bad in (("nan", text.replace('"passed": true', '"passed": NaN', 1)),
                      ("repeated", text.replace('{', '{"passed": true, "passed": false, ', 1))):
        path = tmp_path / f"{name}.json"
        path.write_text(bad)
        proc = run_cli("merge", str(path))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and str(path) in proc.stderr, proc.stderr


def test_shards_judged_with_other_tolerances_are_refused(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    """The fixture id leaves tolerances out (goldens and tolerances may be regenerated): the merge checks them."""
    doc = json.loads(runs["numpy"][0].read_text())
    doc["tolerances"]["fp32"]["atol"] = 1e-4
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps(doc))
    proc = run_cli("merge", str(runs["onnxruntime"][0]), str(loose))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "judged with other tolerances" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_refused_merge_leaves_the_unusable_marker_and_older_reports_still_merge(
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    """A merge that ends in an error writes the marker to --json (merging it again is refused); a report
    written before `usable` existed (the field absent) merges when it agrees with its rows."""
    numpy, onnx = str(runs["numpy"][0]), str(runs["onnxruntime"][0])
    out = tmp_path / "merged.json"
    assert_one_line_error(run_cli("merge", numpy, numpy, "--json", str(out)), "numpy fp32 is in")
    marker = load(out)
    assert marker["usable"] is False and marker["command"] == "merge" and marker["exit_code"] == 2
    assert "numpy fp32 is in" in marker["error"]
    assert_one_line_error(run_cli("merge", str(out), onnx), str(out), "unusable", "parity merge")
    older = load(runs["onnxruntime"][0])
    del older["usable"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    proc = run_cli("merge", numpy, str(tmp_path / "older.json"), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load(out)["usable"] is True and load(out)["counts"] == load(runs["both"][0])["counts"]


def test_statuses_are_enums_and_read_back_as_enums(runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]],
                                                   tmp_path: Path) -> None:
    """A report's statuses are the enums of parity_harness/_core/status.py in memory, their string values in JSON; a
    merged
    report reads them back as the same enums, and refuses a value that is none of them."""
    from parity_harness._core.status import RunStatus, Status
    from parity_harness._run.merge import merge_reports

    path = next(p for p, _ in runs.values())
    merged = merge_reports([path])
    assert merged.results and all(type(r.status) is Status for r in merged.results)
    assert all(type(s.status) is Status for s in merged.summaries)
    assert all(type(r.status) is RunStatus for r in merged.runs)
    assert {r["status"] for r in load(path)["results"]} <= {s.value for s in Status}
    bad = load(path)
    bad["results"][0]["status"] = "passed-trust-me"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = run_cli("merge", str(tmp_path / "bad.json"))
    assert_one_line_error(proc, "results.status is \"passed-trust-me\", expected 'ok' | 'fail' | 'not_supported'")
