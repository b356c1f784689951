"""Hostile reports and dumps: `parity merge` and `parity compare` never turn a failed shard into exit 0.

Each case is a report or a dump that once fooled a command into a verdict the runs behind it do not
support: the JSON of a run that exited 2, a report whose rows disagree with its own verdict, a run
listed without results, two backends whose dumps are one file. Each test checks the exit code (2),
exactly one `parity: error:` line naming the file (or both backends) and the field, no traceback,
and, from the same data, that the verdict would have been wrong without the check (a shard that
failed, a backend that disagrees). The backends come from tests/report_plugin, registered by an
entry-point file as tests/hostile_plugin is. Case ids start with their class (merge, dump, compare);
docs/security.md has the command that counts them.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, assert_exit_2_one_line, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

PLUGIN_DIR = REPO / "tests" / "report_plugin"
Doc = dict[str, Any]


def run_reports(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m parity_harness ARGS` with tests/report_plugin discoverable (PYTHONPATH), as users run it."""
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return run_cli(*args, env={"PYTHONPATH": path}, timeout=300)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """JSON reports of real runs: a passing shard, a failing one, both backends in one, numpy with decoding."""
    root = tmp_path_factory.mktemp("shards")
    runs = {"good": ("report-control", 0), "wrong": ("report-wrong", 1), "pair": ("report-control,report-wrong", 1),
            "numpy": ("numpy", 0)}
    out = {}
    for name, (backends, code) in runs.items():
        path = root / f"{name}.json"
        proc = run_reports("run", "--backends", backends, "--precision", "fp32", "-q", "--json", str(path),
                           "--save-outputs", str(root / name))
        assert proc.returncode == code, proc.stdout[-1500:] + proc.stderr[-1500:]
        out[name] = path
    return out


def load(path: Path) -> Doc:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def save(doc: Doc, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def passing_rows(doc: Doc, backend: str) -> None:
    """Forge `backend`'s failing rows as passing, numbers included (what a consistent liar writes)."""
    for r in doc["results"]:
        if r["backend"] == backend and r["status"] == "fail":
            r.update(status="ok", passed=True, n_bad=0, max_abs=0.0, max_rel=0.0, min_atol=0.0)


def derived_fields(doc: Doc, *, counts: bool = True, verdict: bool = True, taps: bool = True,
                   divergences: bool = True) -> None:
    """Rewrite the fields a report derives from its rows to match the (forged) rows."""
    rows = doc["results"]
    if counts:
        doc["counts"] = {"passed": sum(r["passed"] is True for r in rows), "failed": sum(r["passed"] is False
                                                                                         for r in rows),
                         "not_supported": sum(r["status"] == "not_supported" for r in rows)}
    if verdict:
        failed = any(r["passed"] is False for r in rows)
        doc["passed"], doc["exit_code"] = not failed, int(failed)
    if taps:
        for s in doc["taps"]:
            at_tap = [r for r in rows if (r["backend"], r["precision"], r["golden"], r["tap"])
                      == (s["backend"], s["precision"], s["golden"], s["tap"]) and r["status"] != "not_supported"]
            if at_tap:
                n_failed = sum(r["passed"] is False for r in at_tap)
                s.update(status="fail" if n_failed else "ok", passed=not n_failed, n_failed=n_failed)
    if divergences:
        failing = {r["backend"] for r in rows if r["passed"] is False}
        doc["first_divergence"] = {b: d for b, d in doc["first_divergence"].items() if b in failing}


def drop_backend_rows(doc: Doc, backend: str) -> None:
    """Remove every result, tap summary, divergence and budget row of `backend` (its run stays listed)."""
    doc["results"] = [r for r in doc["results"] if r["backend"] != backend]
    doc["taps"] = [s for s in doc["taps"] if s["backend"] != backend]
    doc["budget"] = [b for b in doc["budget"] if b["backend"] != backend]
    doc["first_divergence"].pop(backend, None)
    doc["taps_compared"].pop(backend, None)


def assert_failed(doc: Doc) -> None:
    """The shard the forgery starts from really failed: a merge that trusts the forgery passes a failure."""
    assert doc["exit_code"] == 1 and doc["counts"]["failed"] > 0 and doc["first_divergence"]


# -- merge: a shard whose run exited 2 ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["merge-unusable-nothing-compared"])
def test_merge_refuses_the_json_of_a_run_that_compared_nothing(
    shards: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """A backend that declines every fixture: its run exits 2, and its --json is the unusable marker."""
    shard = tmp_path / "declined.json"
    run = run_reports("run", "--backends", "declines-everything", "-q", "--json", str(shard))
    assert_exit_2_one_line(run, "nothing was compared")
    marker = load(shard)
    assert marker["usable"] is False and marker["exit_code"] == 2 and "nothing was compared" in marker["error"]
    assert_exit_2_one_line(run_reports("merge", str(shards["good"]), str(shard)), str(shard), "unusable",
                           "parity run", "nothing was compared")


@pytest.mark.parametrize("case", ["merge-unusable-stale-report", "compare-unusable-stale-report"])
def test_a_failed_rerun_replaces_the_report_an_earlier_run_left(
    shards: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """A good report is at PATH; the same job reruns and fails (exit 2): merge must not take the old one."""
    report = tmp_path / "shard.json"
    report.write_bytes(shards["good"].read_bytes())  # what the earlier run left: it merges (exit 0)
    assert run_reports("merge", str(report)).returncode == 0
    (tmp_path / "file").write_text("not a directory")
    if case.startswith("merge"):  # --save-outputs into a regular file: refused after the report paths are checked
        rerun = run_reports("run", "--backends", "report-control", "-q", "--json", str(report),
                            "--save-outputs", str(tmp_path / "file"))
        needle = "--save-outputs"
    else:  # a dump that is not one
        rerun = run_reports("compare", str(tmp_path / "file"), "--json", str(report))
        needle = "not a safetensors file"
    assert_exit_2_one_line(rerun, needle)
    assert load(report)["usable"] is False
    assert_exit_2_one_line(run_reports("merge", str(report)), str(report), "unusable", needle)


@pytest.mark.parametrize("case", ["merge-nothing-compared-full-report"])
def test_merge_refuses_a_report_that_compared_nothing_even_without_the_marker(
    shards: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """As an earlier parity wrote it: every run 'not supported', no rows, exit_code 2, no "usable" field."""
    doc = load(shards["good"])
    del doc["usable"]
    drop_backend_rows(doc, "report-control")
    for run in doc["runs"]:
        run.update(status="not_supported", message="declined")
    doc.update(counts={"passed": 0, "failed": 0, "not_supported": 0}, passed=False, exit_code=2)
    bad = save(doc, tmp_path / "nothing.json")
    assert_exit_2_one_line(run_reports("merge", str(shards["numpy"]), str(bad)), str(bad), "compared nothing")


# -- merge: a shard that disagrees with its own rows ----------------------------------------------------------

Forgery = Callable[[Doc], None]


def rows_pass_counts_stale(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")


def rows_pass_passed_stale(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")
    derived_fields(doc, verdict=False, taps=False, divergences=False)


def rows_pass_exit_code_stale(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")
    derived_fields(doc, verdict=False, taps=False, divergences=False)
    doc["passed"] = True


def rows_pass_taps_stale(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")
    derived_fields(doc, taps=False, divergences=False)


def rows_pass_divergence_stale(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")
    derived_fields(doc, divergences=False)


def row_says_ok_numbers_fail(doc: Doc) -> None:
    for r in doc["results"]:
        if r["status"] == "fail":
            r.update(status="ok", passed=True)
    derived_fields(doc)


def row_judged_looser(doc: Doc) -> None:
    for r in doc["results"]:
        if r["status"] == "fail":
            r.update(status="ok", passed=True, n_bad=0, atol=1.0)
    derived_fields(doc)


def run_without_results(doc: Doc) -> None:
    drop_backend_rows(doc, "report-wrong")
    derived_fields(doc)


def case_dropped(doc: Doc) -> None:
    failing = {r["case"] for r in doc["results"] if r["status"] == "fail"}
    doc["results"] = [r for r in doc["results"] if not (r["backend"] == "report-wrong" and r["case"] in failing)]
    for s in doc["taps"]:
        if s["backend"] == "report-wrong" and s["status"] != "not_supported":
            s["n_cases"] -= len(failing)
    derived_fields(doc)


def row_twice(doc: Doc) -> None:
    passing_rows(doc, "report-wrong")
    doc["results"].append(copy.deepcopy(doc["results"][0]))
    derived_fields(doc)


# (case id, the shard forged, forgery, words the one stderr line must hold)
DISAGREE: list[tuple[str, str, Forgery, tuple[str, ...]]] = [
    ("merge-counts-disagree-with-rows", "wrong", rows_pass_counts_stale, ("'counts'", "its rows give")),
    ("merge-passed-disagrees-with-rows", "wrong", rows_pass_passed_stale, ("'passed' is false", "its rows give true")),
    ("merge-exit-code-disagrees-with-rows", "wrong", rows_pass_exit_code_stale, ("'exit_code' is 1", "give 0")),
    ("merge-tap-summary-disagrees-with-rows", "wrong", rows_pass_taps_stale, ("'taps' entry report-wrong", "status")),
    ("merge-divergence-of-a-passing-tier", "wrong", rows_pass_divergence_stale,
     ("first_divergence of report-wrong fp32 vs fp32", "all pass")),
    ("merge-row-ok-with-cells-out-of-tolerance", "wrong", row_says_ok_numbers_fail,
     ("says 'ok' but its numbers fail",)),
    ("merge-row-judged-at-another-tolerance", "wrong", row_judged_looser, ("judged at atol 1.0", "tolerances give")),
    ("merge-run-listed-without-results", "pair", run_without_results,
     ("runs list report-wrong fp32 as 'ran'", "no results")),
    ("merge-tier-missing-a-case", "pair", case_dropped, ("report-wrong fp32 vs fp32 hold 473 rows", "12 x 43")),
    ("merge-row-twice", "wrong", row_twice, ("is there twice",)),
]


@pytest.mark.parametrize(("case", "shard", "forge", "needles"), DISAGREE, ids=[c[0] for c in DISAGREE])
def test_merge_refuses_a_shard_that_disagrees_with_its_own_rows(
    shards: dict[str, Path], tmp_path: Path, case: str, shard: str, forge: Forgery, needles: tuple[str, ...]
) -> None:
    doc = load(shards[shard])
    assert_failed(doc)
    forge(doc)
    bad = save(doc, tmp_path / "forged.json")
    assert_exit_2_one_line(run_reports("merge", str(shards["numpy"]), str(bad)), str(bad), *needles)


@pytest.mark.parametrize("case", ["merge-results-without-a-run"])
def test_merge_refuses_results_without_a_run(shards: dict[str, Path], tmp_path: Path, case: str) -> None:
    """The same backend's rows twice, one copy with its run removed: its checks would be counted twice."""
    doc = load(shards["good"])
    doc["runs"] = [r for r in doc["runs"] if r["status"] != "ran"]
    bad = save(doc, tmp_path / "no-run.json")
    assert_exit_2_one_line(run_reports("merge", str(shards["good"]), str(bad)), str(bad),
                           "results of report-control fp32, and no run of it")


def greedy_ok_other_tokens(doc: Doc) -> None:
    g = doc["decoding"]["greedy"][0]
    g["actual"] = [(t + 1) % 12 for t in g["actual"]]  # other words, still "ok"


def decoding_counts_stale(doc: Doc) -> None:
    doc["decoding"]["counts"]["failed"] += 3


def decoding_run_without_results(doc: Doc) -> None:
    dec = doc["decoding"]
    dec["results"], dec["greedy"], dec["summaries"] = [], [], []
    dec["counts"] = {"passed": 0, "failed": 0, "near_ties": 0}


DECODING: list[tuple[str, Forgery, tuple[str, ...]]] = [
    ("merge-decoding-greedy-ok-with-other-tokens", greedy_ok_other_tokens, ("greedy tokens of numpy fp32", "'ok'")),
    ("merge-decoding-counts-disagree", decoding_counts_stale, ("'decoding.counts'", "decoding rows give")),
    ("merge-decoding-run-without-results", decoding_run_without_results,
     ("decoding runs list numpy fp32", "no decoding results")),
]


@pytest.mark.parametrize(("case", "forge", "needles"), DECODING, ids=[c[0] for c in DECODING])
def test_merge_checks_the_decoding_section_the_same_way(
    shards: dict[str, Path], tmp_path: Path, case: str, forge: Forgery, needles: tuple[str, ...]
) -> None:
    doc = load(shards["numpy"])
    assert doc["decoding"]["available"] and doc["decoding"]["runs"] and doc["decoding"]["greedy"]
    forge(doc)
    bad = save(doc, tmp_path / "forged.json")
    assert_exit_2_one_line(run_reports("merge", str(shards["good"]), str(bad)), str(bad), *needles)


def test_the_forgeries_start_from_shards_that_merge(shards: dict[str, Path]) -> None:
    """The control: the untouched shards merge, with the verdict of their runs (exit 1: report-wrong fails)."""
    proc = run_reports("merge", str(shards["numpy"]), str(shards["pair"]))
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert proc.stdout.splitlines()[-1].startswith("FAIL: disagreement in report-wrong fp32 vs fp32")
    proc = run_reports("merge", str(shards["numpy"]), str(shards["good"]))
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("PASS"), proc.stdout[-800:] + proc.stderr


# -- dumps: names that would collide ---------------------------------------------------------------------------

COLLIDE = [
    ("dump-names-collide-after-sanitizing", "collide/dump", "collide_dump", "would both write 'collide_dump.fp32"),
    ("dump-names-collide-by-case", "Collide-Case", "collide-case", "where case is not significant"),
]


@pytest.mark.parametrize(("case", "wrong", "right", "needle"), COLLIDE, ids=[c[0] for c in COLLIDE])
def test_dump_names_that_would_collide_are_refused_before_the_run(
    tmp_path: Path, case: str, wrong: str, right: str, needle: str
) -> None:
    """The first backend disagrees: had the second's dump replaced its own, `compare DIR/*` would pass."""
    both = f"{wrong},{right}"
    assert run_reports("run", "--backends", both, "-q").returncode == 1  # one of them really disagrees
    proc = run_reports("run", "--backends", both, "--save-outputs", str(tmp_path / "dumps"))
    assert_exit_2_one_line(proc, repr(wrong), repr(right), needle)
    assert proc.stdout == "" and "parity: running" not in proc.stderr  # refused before any backend ran
    assert not list((tmp_path / "dumps").glob("*.safetensors"))


@pytest.mark.parametrize("case", ["compare-two-dumps-of-one-backend"])
def test_compare_refuses_two_dumps_of_the_same_backend_and_precision(
    shards: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """A failing dump and a passing one, both saying report-control fp32: the verdict would be about either."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    good = shards["good"].parent / "good" / "report-control.fp32.safetensors"
    with safe_open(str(shards["wrong"].parent / "wrong" / "report-wrong.fp32.safetensors"), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        meta = {**f.metadata(), "backend": "report-control"}
    save_file(tensors, str(tmp_path / "renamed.safetensors"), metadata=meta)
    assert run_reports("compare", str(tmp_path / "renamed.safetensors")).returncode == 1  # it disagrees
    proc = run_reports("compare", str(good), str(tmp_path / "renamed.safetensors"))
    assert_exit_2_one_line(proc, "renamed.safetensors", "a second dump of report-control fp32", str(good))
