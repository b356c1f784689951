"""`parity export --check`: bit for bit on the platform that made a fixture, the measured rule elsewhere.

Exactness is a same-platform claim: the tests that need it check a fixture whose goldens were made
on this machine (`local_toy`); the committed toy and the AVX-512 vector are judged by whichever rule
applies here, and a simulated foreign platform runs the cross-platform path on every machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from parity_harness._authoring.export import make_cases
from parity_harness._fixture.platforms import IDENTITY_KEYS, describe, same_platform
from tests.helpers import AVX512_VECTOR, GGML_GELU, GIVEN_GRAPH, builtin_backends, edit_manifest, rehash, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

FOREIGN = {"system": "Linux", "machine": "aarch64", "torch": "2.13.0", "cpu_capability": "DEFAULT",
           "blas": "openblas", "cpu": "a simulated foreign CPU"}


def _move_goldens(root: Path, ulps: int, every: int = 3) -> int:
    """Move every `every`-th finite cell of every golden tensor by `ulps` ulps (both tiers); the count moved."""
    moved = 0
    for precision in ("fp32", "fp64"):
        path = root / f"golden.{precision}.safetensors"
        tensors = {k: v.copy() for k, v in load_file(str(path)).items()}
        for t in tensors.values():
            flat = t.reshape(-1)
            for i in range(0, flat.size, every):
                if np.isfinite(flat[i]):
                    for _ in range(ulps):
                        flat[i] = np.nextafter(flat[i], np.inf)
                    moved += 1
        save_file(tensors, str(path))
    return moved


def _foreign_copy(src: Path, dst: Path) -> Path:
    """A copy of `src` that says it was made on FOREIGN."""
    shutil.copytree(src, dst)
    edit_manifest(dst, lambda m: m["provenance"].update(platform=FOREIGN))
    return dst


@pytest.mark.slow
def test_export_check_passes_on_the_committed_fixture(toy_dir: Path) -> None:
    """The full check, retraining 4,000 steps included, under whichever rules apply on this machine.

    `nox -s slow` runs it; the retraining rules themselves are tested below on a 50-step model.
    """
    proc = run_cli("export", "--check", "--fixture", str(toy_dir))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule for the golden files: " in out
    assert "rule for retraining: " in out or "retrained weights vs committed: bit-identical" in out
    for precision in ("fp32", "fp64"):
        line = next(ln for ln in out.splitlines() if f"golden {precision} recomputed" in ln)
        assert line.endswith(("bit-identical", "within the cross-platform rule")), line
    assert "manifest identical apart from hashes" in out
    assert "OK, the committed fixture is reproducible" in out


def test_export_check_without_retraining_passes_on_the_committed_fixture(toy_dir: Path) -> None:
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(toy_dir))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule for the golden files: " in out and "retraining skipped (--no-retrain)" in out
    for precision in ("fp32", "fp64"):
        line = next(ln for ln in out.splitlines() if f"golden {precision} recomputed" in ln)
        assert line.endswith(("bit-identical", "within the cross-platform rule")), line
    assert "OK, the committed fixture is reproducible (golden files, manifest and ONNX graphs" in out


def test_a_fixture_made_here_must_be_bit_identical(local_toy: Path) -> None:
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(local_toy))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule for the golden files: bit-identical (this is the platform that made them)" in out
    assert "golden fp32 recomputed from the committed weights: bit-identical" in out
    assert "golden fp64 recomputed from the committed weights: bit-identical" in out
    assert "retraining skipped (--no-retrain)" in out


def test_one_ulp_is_stale_on_the_platform_that_made_the_fixture(local_toy: Path, tmp_path: Path) -> None:
    root = tmp_path / "toy"
    shutil.copytree(local_toy, root)
    path = root / "golden.fp64.safetensors"
    tensors = {k: v.copy() for k, v in load_file(str(path)).items()}
    key = next(k for k in sorted(tensors) if k.endswith("/logits"))
    tensors[key][0, 0] = np.nextafter(tensors[key][0, 0], np.inf)  # one ulp
    save_file(tensors, str(path))
    rehash(root)
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(root))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "golden fp64: 1 tensors differ" in proc.stdout and key in proc.stdout
    assert "regenerate it with `nox -s fixtures`" in proc.stdout


def test_a_simulated_foreign_platform_is_judged_by_the_cross_platform_rule(local_toy: Path, tmp_path: Path) -> None:
    """Goldens a few ulps away, made on 'another platform': the cross-platform path, on any CPU."""
    root = _foreign_copy(local_toy, tmp_path / "foreign")
    moved = _move_goldens(root, ulps=4)
    rehash(root)
    assert moved > 1000
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(root))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule for the golden files: cross-platform (made on another platform): fp32 goldens within the " \
           "fixture's fp32 tier; fp64 goldens within 64 float64 epsilons" in out
    assert "goldens made on: system Linux, machine aarch64" in out
    for precision in ("fp32", "fp64"):
        line = next(ln for ln in out.splitlines() if f"golden {precision} recomputed" in ln)
        assert "tensors differ, worst |diff|" in line and line.endswith("within the cross-platform rule"), line


def test_a_real_change_breaks_the_cross_platform_rule(local_toy: Path, tmp_path: Path) -> None:
    """Far below the fp32 tier, far above float64 round-off: stale on a foreign platform too."""
    root = _foreign_copy(local_toy, tmp_path / "foreign")
    path = root / "golden.fp64.safetensors"
    tensors = {k: v.copy() for k, v in load_file(str(path)).items()}
    key = "grammar_1/blocks.1.hook_resid_post"
    tensors[key][2, 3] += 1e-10
    save_file(tensors, str(path))
    rehash(root)
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(root))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"golden fp64: 1 tensors break the cross-platform rule, e.g. {key}" in proc.stdout
    assert "golden fp32 recomputed from the committed weights" in proc.stderr


def test_the_avx512_vector_passes_export_check_and_names_its_rule() -> None:
    """A real vector from another machine; on it, only a platform that records every identity key is 'the same'."""
    manifest = json.loads((AVX512_VECTOR / "manifest.json").read_text())
    assert manifest["provenance"]["platform"]["cpu_capability"] == "AVX512"
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(AVX512_VECTOR))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule for the golden files: cross-platform (made on another platform)" in out
    assert "OK, the committed fixture is reproducible" in out


def test_every_builtin_backend_passes_the_avx512_vector() -> None:
    # llama.cpp's GELU table fails a GPT-2 fixture by design, and onnx-file needs a graph (--onnx): their own tests
    agreeing = builtin_backends() - GGML_GELU - GIVEN_GRAPH
    names = ",".join(sorted(agreeing))
    proc = run_cli("run", "--fixture", str(AVX512_VECTOR), "--backends", names, "-q")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].startswith("PASS")
    assert all(f"{name} " in proc.stdout for name in agreeing)


def test_cases_cover_what_the_issue_asks_for() -> None:
    cases = make_cases(12, 16)
    kinds = {c["kind"] for c in cases}
    assert len(cases) >= 10
    assert {"grammar", "random", "single", "longest", "repeated", "all_words"} <= kinds
    lengths = {len(c["tokens"]) for c in cases}
    assert 1 in lengths and 16 in lengths
    assert any(sorted(c["tokens"]) == list(range(12)) for c in cases)
    assert all(0 <= t < 12 for c in cases for t in c["tokens"])


def test_platform_identity_needs_every_key() -> None:
    here = dict(FOREIGN)
    assert same_platform(dict(FOREIGN), here)
    for key in IDENTITY_KEYS:
        assert not same_platform({k: v for k, v in FOREIGN.items() if k != key}, here), key
        assert not same_platform({**FOREIGN, key: "other"}, here), key
    assert not same_platform(None, here) and not same_platform("x86_64", here)
    assert "no system" in describe({"machine": "x86_64"})


def test_retraining_rule_bit_for_bit_on_the_training_platform_and_by_loss_elsewhere() -> None:
    """A 50-step model (fast): bit-identical passes; a changed weight fails here and passes by loss elsewhere."""
    from parity_harness._authoring.export import _check_retraining, train_weights
    from parity_harness._fixture.platforms import current_platform

    here = current_platform()
    lines: list[str] = []
    weights = train_weights(0, 50, lines.append)
    assert _check_retraining(weights, 0, 50, here, here, lines.append) == []
    assert "retrained weights vs committed: bit-identical" in lines[-1]
    changed = {k: v.copy() for k, v in weights.items()}
    changed["h.0.mlp.c_fc.weight"][0, 0] += np.float32(1e-4)
    problems = _check_retraining(changed, 0, 50, here, here, lines.append)
    assert len(problems) == 1 and "on the platform that trained them" in problems[0]
    assert _check_retraining(changed, 0, 50, FOREIGN, here, lines.append) == []
    assert any("rule for retraining: held-out loss within 1%" in ln for ln in lines)
