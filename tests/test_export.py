"""`parity export --check` on the committed fixture, and that it notices a stale one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from harness.export import make_cases
from tests.conftest import rehash, run_cli


def test_export_check_passes_on_the_committed_fixture(toy_dir: Path) -> None:
    proc = run_cli("export", "--check", "--fixture", str(toy_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "golden fp32 recomputed from the committed weights: bit-identical" in out
    assert "golden fp64 recomputed from the committed weights: bit-identical" in out
    assert "manifest identical apart from hashes" in out
    assert "OK, the committed fixture is reproducible" in out


def test_export_check_fails_on_a_stale_golden_file(fixture_copy: Path) -> None:
    path = fixture_copy / "golden.fp64.safetensors"
    tensors = {k: v.copy() for k, v in load_file(str(path)).items()}
    key = next(k for k in sorted(tensors) if k.endswith("/logits"))
    tensors[key][0, 0] = np.nextafter(tensors[key][0, 0], np.inf)  # one ulp
    save_file(tensors, str(path))
    rehash(fixture_copy)
    proc = run_cli("export", "--check", "--fixture", str(fixture_copy))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "golden fp64: 1 tensors differ" in proc.stdout and key in proc.stdout
    assert "regenerate it with `nox -s fixtures`" in proc.stdout


def test_cases_cover_what_the_issue_asks_for() -> None:
    cases = make_cases(12, 16)
    kinds = {c["kind"] for c in cases}
    assert len(cases) >= 10
    assert {"grammar", "random", "single", "longest", "repeated", "all_words"} <= kinds
    lengths = {len(c["tokens"]) for c in cases}
    assert 1 in lengths and 16 in lengths
    assert any(sorted(c["tokens"]) == list(range(12)) for c in cases)
    assert all(0 <= t < 12 for c in cases for t in c["tokens"])
