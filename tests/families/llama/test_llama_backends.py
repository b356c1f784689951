"""The pytorch and numpy backends on the Llama family: fixtures/toy-llama in every tier they compute, decoding included.

A planted porting bug (grouped-query attention's key/value heads tiled, head h reading kv head h % n_kv_heads,
instead of repeated, h // n_rep) in the numpy backend's Llama must be caught, first at blocks.0.attn.hook_attn_scores.
A backend that does not implement the family is declined in one line, and a run naming it exits 2 (nothing compared).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_reference import llama_numpy

ROOT = Path(__file__).resolve().parents[3]
TOY_LLAMA = str(ROOT / "fixtures" / "toy-llama")
N_TAPS = 48  # every tap of the toy Llama


def _compared(report: api.Report, backend: str) -> dict[str, set[str]]:
    """{precision: taps compared} of one backend."""
    out: dict[str, set[str]] = {}
    for r in report.results:
        if r.backend == backend:
            out.setdefault(r.precision, set()).add(r.tap)
    return out


def test_pytorch_and_numpy_agree_on_toy_llama_in_every_tier_with_decoding() -> None:
    pytest.importorskip("torch")
    report = api.run(["pytorch", "numpy"], TOY_LLAMA, ["fp32", "fp64", "fp16", "bf16"])
    assert report.passed, api.failure_message(report)
    assert report.n_failed == 0 and report.n_passed > 0
    assert {p: len(t) for p, t in _compared(report, "pytorch").items()} == {p: N_TAPS for p in
                                                                             ("fp32", "fp64", "fp16", "bf16")}
    assert {p: len(t) for p, t in _compared(report, "numpy").items()} == {p: N_TAPS for p in ("fp32", "fp64", "fp16")}
    decoding = report.decoding
    assert decoding is not None and decoding.available
    assert not decoding.not_supported
    backends = {(c.backend, c.precision) for c in decoding.checks}
    assert backends == {(b, p) for b in ("pytorch", "numpy") for p in ("fp32", "fp64")}
    assert decoding.checks and all(c.passed for c in decoding.checks)


def _tiled(kv: np.ndarray, n_rep: int) -> np.ndarray:
    """The bug: kv heads tiled ([0, 1, 0, 1]) where Llama repeats each ([0, 0, 1, 1])."""
    return np.tile(kv, (n_rep, 1, 1))


def test_a_gqa_tiling_bug_in_numpy_fails_at_the_first_attention_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_numpy, "expand_kv", _tiled)
    report = api.run([NumpyBackend()], TOY_LLAMA, ["fp32", "fp64"])
    assert not report.passed
    first = {d.precision: d.tap for d in report.divergences}
    assert first == {"fp32": "blocks.0.attn.hook_attn_scores", "fp64": "blocks.0.attn.hook_attn_scores"}
    passed_before = {r.tap for r in report.results if r.passed}
    assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_v"} <= passed_before
    assert report.decoding is not None and any(not c.passed for c in report.decoding.checks)


def test_every_backend_without_the_llama_family_is_declined_in_one_line() -> None:
    from parity_harness._backends.registry import load_backends

    others = sorted(b.name for b in load_backends() if "llama" not in b.families)
    assert others  # the browser, TypeScript and WebGPU backends, at least
    report = api.run(["numpy", *others], TOY_LLAMA, ["fp32", "fp64"])
    assert report.verdict.value == "nothing_compared" and not report.passed  # named, and compared nothing: exit 2
    declined = {r.backend: r.message for r in report.runs if r.backend in others and r.message
                and "does not implement the llama family" in r.message}
    assert sorted(declined) == others, [(r.backend, r.precision, r.message) for r in report.runs]
    assert all("\n" not in m for m in declined.values())
    assert not any(r.backend in others for r in report.results)  # none of their code produced a number
