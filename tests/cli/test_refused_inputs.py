"""Hostile inputs: fixtures, arguments, report paths and subprocesses that once gave exit 0 or a traceback.

Each case is one way to fool or crash `parity run` (issue: "a gate that cannot be fooled"), run in
a subprocess as a user would: the documented exit code, exactly one `parity: error:` line, no
traceback. The case ids start with their class: `tol` (tolerances: bounded, finite, sealed),
`schema` (the manifest's types, ranges and structure), `report` (report paths), `arg` (arguments),
`subprocess` (Node's timeout). docs/security.md has the command that counts them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from parity_harness._core.strict_json import StrictJSONError, loads_strict
from parity_harness._fixture.schema import SEAL_KEY
from tests.helpers import assert_exit_2_one_line, edit_manifest, rehash, run_all, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

Breaker = Callable[[Path], object]


def text_edit(old: str, new: str, count: int = 1) -> Breaker:
    """Replace text in manifest.json (for what json.dumps cannot write: NaN, repeated keys, ...)."""
    def breaker(root: Path) -> None:
        path = root / "manifest.json"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, count))
    return breaker


def sealed(change: Callable[[dict], object]) -> Breaker:  # type: ignore[type-arg]
    """A manifest change re-sealed, as someone who meant it would do."""
    return lambda root: edit_manifest(root, change)


def unsealed(change: Callable[[dict], object]) -> Breaker:  # type: ignore[type-arg]
    return lambda root: edit_manifest(root, change, seal=False)


def random_weights(root: Path) -> None:
    """Every weight replaced by random numbers, hashes and seal rewritten: a fixture that must not pass."""
    path = root / "weights.safetensors"
    rng = np.random.default_rng(0)
    save_file({k: rng.standard_normal(v.shape).astype(np.float32) for k, v in load_file(str(path)).items()},
              str(path))
    rehash(root)


def loosen(atol: float) -> Callable[[dict], None]:  # type: ignore[type-arg]
    def change(m: dict) -> None:  # type: ignore[type-arg]
        for tier in ("fp32", "fp64"):
            m["tolerances"][tier]["atol"] = atol
    return change


def both(*breakers: Breaker) -> Breaker:
    def breaker(root: Path) -> None:
        for b in breakers:
            b(root)
    return breaker


def set_override(tier: str, tap: str, atol: float, rtol: float = 0.0) -> Callable[[dict], None]:  # type: ignore[type-arg]
    return lambda m: m["tolerances"][tier]["overrides"].update({tap: {"atol": atol, "rtol": rtol}})


DEEP = 100_000
ATOL32 = '"atol": 1e-05'  # the fp32 tier's atol as the committed manifest spells it

TOL: list[tuple[str, Breaker, tuple[str, ...]]] = [
    ("tol-random-weights-atol-1e9-resealed", both(random_weights, sealed(loosen(1e9))),
     ("tolerances.fp32.atol 1e+09 is above the ceiling 0.001", "--allow-loose-tolerances")),
    ("tol-atol-nan", text_edit(ATOL32, '"atol": NaN'), ("NaN is not a JSON number",)),
    ("tol-atol-infinity", text_edit(ATOL32, '"atol": Infinity'), ("Infinity is not a JSON number",)),
    ("tol-atol-minus-infinity", text_edit(ATOL32, '"atol": -Infinity'), ("-Infinity is not a JSON number",)),
    ("tol-atol-1e999", text_edit(ATOL32, '"atol": 1e999'), ("1e999 overflows to infinity",)),
    ("tol-rtol-nan", text_edit('"rtol": 0.0', '"rtol": NaN'), ("NaN is not a JSON number",)),
    ("tol-override-nan", text_edit('"overrides": {}', '"overrides": {"logits": {"atol": NaN, "rtol": 0}}'),
     ("NaN is not a JSON number",)),
    ("tol-duplicate-tolerances-key",
     text_edit('"tolerances": {', '"tolerances": {"fp32": {"atol": 1e9, "rtol": 0}}, "tolerances": {'),
     ("duplicate key 'tolerances'",)),
    ("tol-negative-atol-resealed", sealed(lambda m: m["tolerances"]["fp64"].update(atol=-1e-12)),
     ("tolerances.fp64.atol: -1e-12 must be >= 0",)),
    ("tol-atol-string", sealed(lambda m: m["tolerances"]["fp64"].update(atol="1e-12")),
     ('tolerances.fp64.atol: "1e-12" must be of type number',)),
    ("tol-fp64-rtol-above-ceiling", sealed(lambda m: m["tolerances"]["fp64"].update(rtol=1e-6)),
     ("tolerances.fp64.rtol 1e-06 is above the ceiling 1e-08",)),
    ("tol-override-above-magnitude-ceiling", sealed(set_override("fp32", "logits", 1.0)),
     ("overrides['logits'].atol 1 is above the ceiling", "golden magnitude")),
    ("tol-override-rtol-above-ceiling", sealed(set_override("fp64", "probs", 0.0, 0.5)),
     ("overrides['probs'].rtol 0.5 is above the ceiling 1e-08",)),
    ("tol-edited-within-ceiling-not-resealed", unsealed(lambda m: m["tolerances"]["fp32"].update(atol=1e-4)),
     ("manifest_sha256 mismatch", "parity seal")),
    ("tol-seal-removed", unsealed(lambda m: m.pop(SEAL_KEY)), ("missing key 'manifest_sha256'",)),
]

SCHEMA: list[tuple[str, Breaker, tuple[str, ...]]] = [
    ("schema-n-ctx-string", unsealed(lambda m: m["config"].update(n_ctx="16")),
     ('config.n_ctx: "16" must be of type integer',)),
    ("schema-n-layer-string", unsealed(lambda m: m["config"].update(n_layer="2")),
     ('config.n_layer: "2" must be of type integer',)),
    ("schema-format-version-true", unsealed(lambda m: m.update(format_version=True)),
     ("unknown fixture format version true",)),
    ("schema-format-version-float", unsealed(lambda m: m.update(format_version=1.0)),
     ("unknown fixture format version 1.0",)),
    ("schema-causal-string", unsealed(lambda m: m["config"].update(causal="false")),
     ('config.causal: "false" must be of type boolean',)),
    ("schema-ln-eps-zero", unsealed(lambda m: m["config"].update(ln_eps=0)), ("config.ln_eps: 0 must be > 0",)),
    ("schema-deeply-nested", text_edit('"provenance": {', '"provenance": ' + "[" * DEEP + "]" * DEEP + ', "x": {'),
     ("nested more than 64 levels deep",)),
    ("schema-huge-integer", text_edit('"n_ctx": 16', '"n_ctx": ' + "9" * 5000), ("not valid JSON",)),
    ("schema-unknown-key", unsealed(lambda m: m.update(trust_me=True)), ("unknown key 'trust_me'",)),
    ("schema-sha256-not-hex", unsealed(lambda m: m["sha256"].update({"weights.safetensors": "z" * 64})),
     ('sha256["weights.safetensors"]', "must match"),),
    ("schema-unknown-onnx-kind", unsealed(lambda m: m["files"]["onnx"].update(gpu="model.onnx")),
     ("files.onnx: unknown key 'gpu'",)),
    ("schema-case-name-with-slash", unsealed(lambda m: m["cases"][0].update(name="a/b")),
     ('cases[0].name: "a/b" must be a plain name',)),
    ("schema-not-utf8", lambda r: (r / "manifest.json").write_bytes(b'{"format": "\xff"}'), ("not UTF-8",)),
    ("schema-too-big", lambda r: (r / "manifest.json").write_text(" " * (17 * 1024 * 1024) + "{}"),
     ("more than the 4194304 a manifest may have",)),
]


@pytest.fixture(scope="module")
def hostile_fixture_runs(
    tmp_path_factory: pytest.TempPathFactory, toy_dir: Path
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Each case's broken copy of the toy and `parity run` on it (run once, concurrently)."""
    roots = {}
    for case, breaker, _ in TOL + SCHEMA:
        root = tmp_path_factory.mktemp(case) / "toy"
        shutil.copytree(toy_dir, root)
        breaker(root)
        roots[case] = root
    runs = run_all({case: ["run", "--fixture", str(root), "--backends", "numpy", "-q"] for case, root in roots.items()})
    return {case: (roots[case], runs[case]) for case in roots}


@pytest.mark.parametrize(("case", "breaker", "needles"), TOL + SCHEMA, ids=[c[0] for c in TOL + SCHEMA])
def test_hostile_fixture_exits_2_with_one_line(
    hostile_fixture_runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], case: str, breaker: Breaker,
    needles: tuple[str, ...]
) -> None:
    root, proc = hostile_fixture_runs[case]
    assert_exit_2_one_line(proc, str(root / "manifest.json"), *needles)


def test_strict_json_turns_deep_nesting_into_one_line_not_a_recursion_error() -> None:
    for text in ("[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP):
        with pytest.raises(StrictJSONError, match="nested more than 64 levels deep"):
            loads_strict(text)


@pytest.mark.parametrize("case", ["tol-random-weights-atol-1e9-with-allow-loose-flag"])
def test_loose_tolerances_run_only_with_the_flag_and_every_report_says_so(
    fixture_copy: Path, tmp_path: Path, case: str
) -> None:
    """The false pass of the issue, with --allow-loose-tolerances: it passes, and no report hides why."""
    random_weights(fixture_copy)
    edit_manifest(fixture_copy, loosen(1e9))
    out = {k: tmp_path / f"r.{k}" for k in ("json", "xml", "md")}
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q", "--allow-loose-tolerances",
                   "--json", str(out["json"]), "--junit", str(out["xml"]), "--markdown", str(out["md"]))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    last = proc.stdout.splitlines()[-3:]
    assert last[0].startswith("tolerances: fp32 atol 1e+09") and last[1].startswith("LOOSE TOLERANCES")
    assert last[2].startswith("PASS (LOOSE TOLERANCES)")
    data = json.loads(out["json"].read_text())
    assert data["loose"] is True and data["tolerances"]["fp32"]["atol"] == 1e9 and data["tolerances_loose"]
    props = {p.get("name"): p.get("value") for p in ET.parse(out["xml"]).getroot().iter("property")}
    assert props["loose"] == "true" and props["tolerance.fp32.atol"] == "1e+09"
    assert "LOOSE TOLERANCES" in out["md"].read_text()


def test_tolerances_in_force_are_in_every_report(toy_dir: Path, tmp_path: Path) -> None:
    out = {k: tmp_path / f"r.{k}" for k in ("json", "xml", "md")}
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "numpy", "-q",
                   "--json", str(out["json"]), "--junit", str(out["xml"]), "--markdown", str(out["md"]))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    want = manifest["tolerances"]
    line = ("tolerances: fp32 atol 1e-05, rtol 1e-05; fp64 atol 1e-12; reduced atol c x eps x M_tap: fp16 c 32, "
            "bf16 c 32; manifest_sha256 ")
    assert proc.stdout.splitlines()[-2].startswith(line)
    data = json.loads(out["json"].read_text())
    assert data["tolerances"] == want and data["loose"] is False
    assert data["manifest_sha256"] == manifest[SEAL_KEY]
    assert data["taps_compared"] == {"numpy": {"compared": 43, "of": 43}}
    props = {p.get("name"): p.get("value") for p in ET.parse(out["xml"]).getroot().iter("property")}
    assert props["tolerance.fp64.atol"] == "1e-12" and props["loose"] == "false"
    assert line in out["md"].read_text()


def test_an_override_within_its_magnitude_ceiling_runs(fixture_copy: Path, tmp_path: Path) -> None:
    """atol 5e-3 on logits (|logits| up to ~16: ceiling 1e-3 x 16) is allowed, recorded and in force."""
    edit_manifest(fixture_copy, set_override("fp32", "logits", 5e-3))
    report = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q", "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "(+1 per-tap override)" in proc.stdout.splitlines()[-2]
    data = json.loads(report.read_text())
    assert data["tolerances"]["fp32"]["overrides"] == {"logits": {"atol": 5e-3, "rtol": 0.0}}
    assert {r["atol"] for r in data["results"] if r["tap"] == "logits" and r["golden"] == "fp32"} == {5e-3}


def test_parity_seal_reseals_a_reviewed_edit_and_refuses_a_bad_one(fixture_copy: Path) -> None:
    edit_manifest(fixture_copy, lambda m: m["tolerances"]["fp32"].update(atol=2e-5), seal=False)
    assert_exit_2_one_line(run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q"),
                           "manifest_sha256 mismatch")
    proc = run_cli("seal", "--fixture", str(fixture_copy))
    assert proc.returncode == 0 and "sealed, manifest_sha256" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q")
    assert proc.returncode == 0 and "fp32 atol 2e-05" in proc.stdout, proc.stdout[-1000:] + proc.stderr
    edit_manifest(fixture_copy, loosen(1.0), seal=False)
    before = (fixture_copy / "manifest.json").read_bytes()
    assert_exit_2_one_line(run_cli("seal", "--fixture", str(fixture_copy)), "above the ceiling")
    assert (fixture_copy / "manifest.json").read_bytes() == before  # nothing sealed


# -- report paths: checked before any backend runs; write errors after the run are one line too ------------

Args = Callable[[Path], list[str]]
REPORT_BEFORE: list[tuple[str, Args, dict[str, str], tuple[str, ...]]] = [
    ("report-json-is-a-directory", lambda t: ["--json", str(t)], {}, ("it is a directory",)),
    ("report-json-parent-missing", lambda t: ["--json", str(t / "no" / "r.json")], {}, ("No such file",)),
    ("report-junit-under-a-file", lambda t: ["--junit", str(t / "file" / "r.xml")], {}, ("JUnit file",)),
    ("report-markdown-parent-missing", lambda t: ["--markdown", str(t / "no" / "r.md")], {}, ("Markdown",)),
    ("report-step-summary-is-a-directory", lambda t: ["--markdown", str(t / "r.md")], {"GITHUB_STEP_SUMMARY": "."},
     ("$GITHUB_STEP_SUMMARY", "it is a directory")),
    ("report-plot-unknown-type", lambda t: ["--plot", str(t / "r.jpg")], {}, ("unknown picture type '.jpg'",)),
    ("report-same-path-twice", lambda t: ["--json", str(t / "r"), "--markdown", str(t / "r")], {},
     ("given for both the JSON report and the Markdown summary",)),
]


@pytest.mark.parametrize(("case", "args", "env", "needles"), REPORT_BEFORE, ids=[c[0] for c in REPORT_BEFORE])
def test_unwritable_report_path_exits_2_before_any_backend_runs(
    tmp_path: Path, case: str, args: Args, env: dict[str, str], needles: tuple[str, ...]
) -> None:
    (tmp_path / "file").write_text("a regular file")
    proc = run_cli("run", "--backends", "numpy", *args(tmp_path), env=env)
    assert_exit_2_one_line(proc, *needles)
    assert proc.stdout == "" and "parity: running" not in proc.stderr  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # and nothing was left behind


REPORT_AFTER = [
    ("report-json-disk-full", ["--json", "/dev/full"], {}, "JSON report"),
    ("report-junit-disk-full", ["--junit", "/dev/full"], {}, "JUnit file"),
    ("report-markdown-disk-full", ["--markdown", "/dev/full"], {}, "Markdown summary"),
    ("report-step-summary-disk-full", ["--markdown", "{tmp}/r.md"], {"GITHUB_STEP_SUMMARY": "/dev/full"},
     "$GITHUB_STEP_SUMMARY"),
]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(("case", "args", "env", "label"), REPORT_AFTER, ids=[c[0] for c in REPORT_AFTER])
def test_a_report_that_fails_to_write_after_the_run_is_one_line_exit_2(
    tmp_path: Path, case: str, args: list[str], env: dict[str, str], label: str
) -> None:
    proc = run_cli("run", "--backends", "numpy", "--precision", "fp64", "-q",
                   *[a.replace("{tmp}", str(tmp_path)) for a in args], env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-1500:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parity: error: /dev/full: cannot write the " + label), lines
    assert "No space left on device" in lines[0] and "Traceback" not in proc.stderr


# -- arguments ----------------------------------------------------------------------------------------------

ARGS: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("arg-backends-repeated", ["run", "--backends", "numpy,numpy"], ("'numpy' more than once",)),
    ("arg-nothing-to-compare", ["run", "--backends", "onnxruntime", "--precision", "fp64"],
     ("nothing to compare: onnxruntime computes in fp32, fp16 only", "--precision fp64")),
    ("arg-export-steps-negative", ["export", "--steps", "-1", "--fixture", "{tmp}/new"], ("--steps", "-1")),
    ("arg-export-steps-zero", ["export", "--steps", "0", "--fixture", "{tmp}/new"], ("--steps", "untrained")),
]


@pytest.mark.parametrize(("case", "args", "needles"), ARGS, ids=[c[0] for c in ARGS])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, case: str, args: list[str],
                                            needles: tuple[str, ...]) -> None:
    proc = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert_exit_2_one_line(proc, *needles)
    assert not (tmp_path / "new").exists()


# -- subprocesses: a timeout holds even when Node leaves a grandchild in a session of its own -------------


@pytest.mark.skipif(sys.platform == "win32", reason="shell-script stand-in for Node, setsid")
@pytest.mark.parametrize("case", ["subprocess-node-grandchild-in-own-session"])
def test_node_timeout_holds_when_a_grandchild_escapes_the_process_group(tmp_path: Path, case: str) -> None:
    pid_file = tmp_path / "grandchild.pid"
    fake = tmp_path / "fake-node"
    # The grandchild outlives run_cli's timeout: a run held by it (its pipes, a wait) fails the test there.
    fake.write_text(f"#!/bin/sh\nsetsid sleep 3600 &\necho $! > {pid_file}\nsleep 3600\n", encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    try:
        proc = run_cli("run", "--backends", "typescript", "-q",
                       env={"PARITY_NODE": str(fake), "PARITY_NODE_TIMEOUT": "2"}, timeout=300)
    finally:
        if pid_file.exists():  # the grandchild escaped on purpose: end it by its id
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), 9)
    assert_exit_2_one_line(proc, "typescript", "timed out after 2 s")


def test_the_verdict_says_how_many_taps_each_backend_was_compared_on(tmp_path: Path) -> None:
    """A backend that produces 2 of 43 taps passes on 2 taps, and the verdict says so, not "every tap"."""
    pytest.importorskip("onnxruntime")
    report = tmp_path / "r.json"
    proc = run_cli("run", "--backends", "numpy,onnxruntime-optimized", "--precision", "fp32", "-q",
                   "--json", str(report))
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    verdict = proc.stdout.splitlines()[-1]
    assert "every tap it was compared on (taps compared: numpy 43/43, onnxruntime-optimized 2/43)" in verdict
    assert json.loads(report.read_text())["taps_compared"]["onnxruntime-optimized"] == {"compared": 2, "of": 43}
