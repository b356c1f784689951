"""The `parity` command as users run it: exit codes, one-line errors, the report and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers import assert_one_line_error, edit_manifest, perturb_weight, rehash, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def test_pytorch_backend_agrees_and_writes_the_documented_json(toy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "pytorch", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout.splitlines()[-1]
    report = json.loads(out.read_text())
    assert report["schema"] == "parity-report" and report["schema_version"] == 1
    assert report["passed"] is True and report["exit_code"] == 0 and report["first_divergence"] == {}
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    n_cases, n_taps = len(manifest["cases"]), len(manifest["taps"])
    # fp32 vs fp32, fp64 vs fp64 and fp64 vs fp32: three tiers, every case and tap.
    assert len(report["results"]) == 3 * n_cases * n_taps
    keys = {"backend", "precision", "golden", "case", "tap", "status", "passed", "max_abs", "max_rel",
            "min_atol", "atol", "rtol", "index", "actual", "expected", "message"}
    for row in report["results"]:
        assert keys <= set(row) and row["backend"] == "pytorch" and row["status"] == "ok"
    tiers = {(r["precision"], r["golden"], r["atol"]) for r in report["results"]}
    fp64_atol = manifest["tolerances"]["fp64"]["atol"]
    assert tiers == {("fp32", "fp32", 1e-5), ("fp64", "fp64", fp64_atol), ("fp64", "fp32", 1e-5)}
    assert len(report["taps"]) == 3 * n_taps
    assert {r["status"] for r in report["runs"]} == {"ran"}
    # One line per backend x precision x tap in the terminal table.
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("pytorch ") and " vs " in ln]
    assert len(table) == 3 and all(f" {n_taps}/{n_taps} " in ln and " ok " in ln for ln in table)  # a line per tier
    verbose = run_cli("run", "-v", "--fixture", str(toy_dir), "--backends", "pytorch")
    assert len([ln for ln in verbose.stdout.splitlines() if ln.startswith("pytorch ") and " vs " in ln]) == 3 * n_taps


@pytest.mark.parametrize(
    ("weight", "first_tap"),
    [("h.1.mlp.c_fc.weight", "blocks.1.mlp.hook_pre"), ("h.0.attn.c_attn.weight", "blocks.0.attn.hook_q")],
)
def test_a_perturbed_weight_exits_1_and_names_the_first_diverging_tap(
    fixture_copy: Path, tmp_path: Path, weight: str, first_tap: str
) -> None:
    perturb_weight(fixture_copy, weight, (0, 0), 1e-3)
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch", "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence at {first_tap}," in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("FAIL")
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["exit_code"] == 1
    divs = report["first_divergence"]["pytorch"]
    assert {d["tap"] for d in divs} == {first_tap} and len(divs) == 3
    assert all(d["upstream_max_abs"] <= 1e-5 for d in divs if d["golden"] == d["precision"])


def test_truncated_weights_exit_2_naming_the_file(fixture_copy: Path) -> None:
    path = fixture_copy / "weights.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    rehash(fixture_copy)
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch"),
                          "weights.safetensors", "not a readable safetensors file")


def test_truncated_golden_exit_2_naming_the_file(fixture_copy: Path) -> None:
    path = fixture_copy / "golden.fp64.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    rehash(fixture_copy)
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch"),
                          "golden.fp64.safetensors")


def test_wrong_hash_exits_2(fixture_copy: Path) -> None:
    path = fixture_copy / "golden.fp32.safetensors"
    path.write_bytes(path.read_bytes() + b" ")
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch"),
                          "golden.fp32.safetensors", "sha256 mismatch")


def test_manifest_that_is_not_json_exits_2(fixture_copy: Path) -> None:
    (fixture_copy / "manifest.json").write_text("{not json")
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy)), "manifest.json", "not valid JSON")


def test_golden_missing_a_tap_exits_2(fixture_copy: Path) -> None:
    path = fixture_copy / "golden.fp32.safetensors"
    tensors = load_file(str(path))
    key = next(k for k in tensors if k.endswith("/blocks.1.hook_mlp_out"))
    del tensors[key]
    save_file(tensors, str(path))
    rehash(fixture_copy)
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch"),
                          "golden.fp32.safetensors", "missing golden tensor", key)


def test_unknown_backend_exits_2(toy_dir: Path) -> None:
    assert_one_line_error(run_cli("run", "--fixture", str(toy_dir), "--backends", "pytorch,nope"),
                          "unknown backend 'nope'", "pytorch")


def test_unknown_format_version_exits_2(fixture_copy: Path) -> None:
    edit_manifest(fixture_copy, lambda m: m.update(format_version=99))
    assert_one_line_error(run_cli("run", "--fixture", str(fixture_copy)), "unknown fixture format version 99")


def test_missing_fixture_directory_exits_2(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("run", "--fixture", str(tmp_path / "nowhere")), "nowhere", "not found")


def test_usage_errors_exit_2(toy_dir: Path) -> None:
    proc = run_cli("run", "--precision", "fp8")
    assert proc.returncode == 2 and "unknown precision 'fp8'" in proc.stderr and "Traceback" not in proc.stderr
    assert run_cli().returncode == 2


def test_backends_lists_every_builtin_backend() -> None:
    proc = run_cli("backends")
    assert proc.returncode == 0
    names = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"pytorch", "numpy", "onnxruntime", "onnxruntime-optimized", "onnx-reference", "typescript"} <= names
    assert "fp32,fp64" in next(ln for ln in proc.stdout.splitlines() if ln.startswith("pytorch "))


def test_precision_filter_reports_fp32_only_backends_as_not_supported(toy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "pytorch", "--precision", "fp32",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert {(r["precision"], r["golden"]) for r in report["results"]} == {("fp32", "fp32")}


def test_a_backend_that_cannot_run_is_skipped_and_said_or_an_error_with_no_skip(
    toy_dir: Path, tmp_path: Path
) -> None:
    env = {"PARITY_NODE": str(tmp_path / "no-such-node")}
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(toy_dir), "--precision", "fp64", "--json", str(out), "-q", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "parity: skipped: backend 'typescript' needs" in proc.stdout
    # Every backend that runs Node is skipped: typescript and the browser backends (docs/browser.md).
    # onnxruntime-webgpu too, but the default selection leaves it out (it runs only when named, as do llama-cpp,
    # whose ggml GELU fails a GPT-2 fixture by design, and onnx-file, which needs a graph).
    node_backends = {"typescript", "typescript-browser", "onnxruntime-web", "onnxruntime-web-optimized"}
    named_only = "parity: run only when named (--backends): llama-cpp, onnx-file, onnxruntime-webgpu"
    assert named_only in proc.stdout.splitlines()
    n = len(node_backends)
    assert f"; {n} registered backend(s) skipped (missing dependencies); fixture " in proc.stdout.splitlines()[-1]
    report = json.loads(out.read_text())
    assert len(report["skipped"]) == n and any("'typescript' needs node" in line for line in report["skipped"])
    assert not node_backends & {r["backend"] for r in report["results"]}
    strict = run_cli("run", "--fixture", str(toy_dir), "--no-skip", "-q", env=env)
    assert_one_line_error(strict, "--no-skip", "needs node", "pip install 'parity-harness[node]'")
