"""The CI gate: a full `parity run` over every built-in backend on each committed fixture, and `parity run --grad`.

It fails if any built-in backend is skipped (missing dependency), not supported where it should
be, or disagrees on any tap of any case in any tier it computes in, on fixtures/toy or on
fixtures/toy-stress (the numerically hard one, parity_harness/_authoring/stress.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    BUILTIN_PRECISIONS,
    DECODING_BACKENDS,
    GGML_GELU,
    GIVEN_GRAPH,
    NAMED_ONLY,
    REPO,
    builtin_backends,
    full_run_backends,
)

# Taps transformers' GPT-2 computes inside a fused call, never exposed
# (parity_harness/_backends/hf_transformers_backend.py).
HF_UNEXPOSED = ("ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized",
                "attn.hook_attn_scores", "ln_final.hook_scale", "ln_final.hook_normalized")


def test_every_builtin_backend_is_registered_and_listed_here() -> None:
    assert builtin_backends() == set(BUILTIN_PRECISIONS) | GGML_GELU | GIVEN_GRAPH


def test_the_default_selection_leaves_out_exactly_the_backends_run_only_when_named() -> None:
    from parity_harness._run.request import select_backends

    selection = select_backends(None)
    assert set(selection.named_only) == NAMED_ONLY
    assert not NAMED_ONLY & {b.name for b in selection.chosen}
    assert {b.name for b in select_backends(sorted(NAMED_ONLY)).chosen} == NAMED_ONLY  # named: they run


# full_run (tests/conftest.py): one run of every built-in backend per committed fixture, shared.


def test_full_parity_run_every_builtin_backend_agrees(full_run: tuple[Path, subprocess.CompletedProcess[str], Any]
                                                     ) -> None:
    toy_dir, proc, report = full_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert report["passed"] is True
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    expected = full_run_backends(toy_dir.name)
    assert ran == {(b, p) for b, ps in expected.items() for p in ps}
    # Every backend compared every tap it supports in every case, in each of its tiers.
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    n_cases = len(manifest["cases"])
    for backend, precisions in expected.items():
        rows = [r for r in report["results"] if r["backend"] == backend and r["status"] == "ok"]
        tiers = {(r["precision"], r["golden"]) for r in rows}
        expected_tiers = {("fp32", "fp32")} if "fp32" in precisions else set()
        if "fp64" in precisions:
            expected_tiers |= {("fp64", "fp64"), ("fp64", "fp32")}
        assert tiers == expected_tiers, backend
        taps = {r["tap"] for r in rows}
        assert len(rows) == len(tiers) * len(taps) * n_cases
        if backend in ("onnxruntime-optimized", "onnxruntime-web-optimized"):
            assert taps == {"logits", "probs"}
        elif backend == "hf-transformers":
            assert taps == {t["name"] for t in manifest["taps"] if not t["name"].endswith(HF_UNEXPOSED)}
        else:
            assert taps == {t["name"] for t in manifest["taps"]}, backend
    fp64 = [r for r in report["results"] if r["golden"] == "fp64" and r["status"] != "not_supported"]
    tol = manifest["tolerances"]["fp64"]
    assert fp64 and all(r["max_abs"] <= tol["overrides"].get(r["tap"], tol)["atol"] for r in fp64)


def test_full_parity_run_prints_nothing_from_third_party_libraries(
    full_run: tuple[Path, subprocess.CompletedProcess[str], Any]
) -> None:
    """Warnings meant for model authors (transformers' `bos_token_id must be None ...`, compile chatter)
    never reach the user's terminal: with -q, stderr holds parity's own lines only."""
    _toy_dir, proc, _report = full_run
    foreign = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("parity: ")]
    assert not foreign, foreign[:5]


def test_full_parity_run_decodes_incrementally_like_the_full_forward(
    full_run: tuple[Path, subprocess.CompletedProcess[str], Any]
) -> None:
    """Every backend that decodes: each step's cache and logits within tolerance, the same greedy tokens."""
    toy_dir, proc, report = full_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    decoding = report.get("decoding")
    manifest = json.loads((toy_dir / "manifest.json").read_text()).get("decoding")
    if manifest is None:  # the stress fixture has no decoding goldens: said once, nothing compared
        assert decoding is None or decoding["available"] is False
        assert "decoding" in proc.stdout
        return
    assert decoding["available"] is True and decoding["passed"] is True
    assert {(r["backend"], r["precision"]) for r in decoding["runs"]} == {
        (b, p) for b, ps in BUILTIN_PRECISIONS.items() if b in DECODING_BACKENDS for p in ps
    }
    assert sorted(decoding["not_supported"]) == sorted(set(full_run_backends(toy_dir.name)) - DECODING_BACKENDS)
    n_tiers = sum(1 if p == "fp32" else 2 for b, ps in BUILTIN_PRECISIONS.items() if b in DECODING_BACKENDS
                  for p in ps)
    per_tier = len(manifest["prompts"]) * (manifest["steps"] + 1) * len(manifest["taps"])
    assert decoding["counts"] == {"passed": n_tiers * per_tier, "failed": 0, "near_ties": 0}
    assert all(g["status"] == "ok" and g["actual"] == g["expected"] for g in decoding["greedy"])
    assert "decoding not supported by: " in proc.stdout


# The backends with a backward (docs/gradients.md), and the precisions their backward computes in.
GRAD_BACKENDS = {"pytorch": ("fp32", "fp64"), "numpy": ("fp32", "fp64"), "jax": ("fp32", "fp64"),
                 "torch-compile": ("fp32", "fp64"), "hf-transformers": ("fp32", "fp64"), "typescript": ("fp64",)}


@pytest.mark.full  # torch-compile's loss graphs compile for ~75 s per precision on an empty cache
@pytest.mark.parametrize("name", ["toy", "toy-stress", "toy-llama"])
def test_every_backward_agrees_on_every_gradient_and_training_step(name: str, tmp_path: Path) -> None:
    """The CI gate's second half, `parity run --grad`: every built-in backend with a backward, on each committed
    fixture, passes every gradient and training step it computes, in every tier of its precisions."""
    from tests.helpers import run_cli

    fixture = REPO / "fixtures" / name
    manifest = json.loads((fixture / "manifest.json").read_text())
    family = manifest.get("family", "gpt2")
    backends = {b: p for b, p in GRAD_BACKENDS.items() if not (b == "typescript" and family != "gpt2")}
    out = tmp_path / "report.json"
    proc = run_cli("run", "--grad", "--fixture", str(fixture), "--backends", ",".join(sorted(backends)),
                   "--json", str(out), "-q", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    grad = json.loads(out.read_text())["grad"]
    assert grad["passed"] is True and grad["counts"]["failed"] == 0 and not grad["not_supported"]
    n_cases, n_steps = len(manifest["training"]["cases"]), manifest["training"]["steps"]
    for backend, precisions in backends.items():
        tiers = {(p, g) for p in precisions for g in (("fp32",) if p == "fp32" else ("fp64", "fp32"))}
        for kind, n in (("results", n_cases), ("train_results", n_steps)):
            rows = [r for r in grad[kind] if r["backend"] == backend and r["status"] == "ok"]
            assert {(r["precision"], r["golden"]) for r in rows} == tiers, (backend, kind)
            per_tier = {t: sum(1 for r in rows if (r["precision"], r["golden"]) == t) for t in tiers}
            assert min(per_tier.values()) >= n, (backend, kind, per_tier)
