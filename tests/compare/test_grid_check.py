"""The judge's coarser-grid check: a result whose every value sits on bf16's (or fp16's) grid was computed there.

Each side is shown: the planted coarse result fails with "precision: ... computed in bf16", the honest
result passes, the 16-candidate floor holds at 15 and fires at 16, and cells where the golden itself is
on the coarse grid (zeros, ones, an embedding read from a bf16 checkpoint) are never candidates.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_harness._compare.judge import MIN_GRID_CANDIDATES, coarser_grid_message, judge_tensor
from parity_harness._core.precision import off_grid, on_grid
from tests.helpers import round_bf16 as _bf16
from tests.helpers import round_fp16 as _fp16


def _golden(n: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32)  # (n,)


def _judge(actual: np.ndarray, golden: np.ndarray, precision: str, step: int | None = None) -> tuple[bool, str]:
    r = judge_tensor("b", precision, "fp32", "case", "tap", actual, golden, 1.0, 0.0, step)
    return bool(r.passed), r.message


def test_on_grid_knows_bf16_and_fp16() -> None:
    x = np.array([1.0, 1.0 + 2.0**-7, 1.0 + 2.0**-8, 1.0 + 2.0**-10, 70000.0, np.inf], dtype=np.float32)
    assert on_grid(x, "bf16").tolist() == [True, True, False, False, False, False]
    assert on_grid(x, "fp16").tolist() == [True, True, True, True, False, False]  # 70000 is past 65504


@pytest.mark.parametrize("grid", ["bf16", "fp16"])
def test_off_grid_is_finite_and_not_on_grid(grid: str) -> None:
    """`off_grid`, the judge's one-pass form, against its definition on random float32 bit patterns (NaNs with
    any payload, infinities, subnormals) and the edges: fp16's largest value, the values rounding to it, inf."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, 1.0, 65504.0, 65505.0, 65519.0, 65520.0, -65504.0, 2.0**-24, 2.0**-25, 2.0**-149,
                      np.inf, -np.inf, np.nan], dtype=np.float32)
    x = np.concatenate([bits.view(np.float32), edges, edges * np.float32(1 + 2**-10), _fp16(_golden(4096)),
                        _bf16(_golden(4096))])
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(off_grid(x, grid), np.isfinite(x) & ~on_grid(x, grid))  # type: ignore[arg-type]


def test_bf16_values_declared_fp16_are_named() -> None:
    g = _golden()
    ok, message = _judge(_fp16(_bf16(g)), g, "fp16")
    assert not ok
    assert "bf16's grid" in message and "where fp16 was declared: computed in bf16" in message
    assert "at most 8 significant bits" in message


def test_fp16_and_bf16_values_declared_fp32_are_named() -> None:
    g = _golden()
    ok, message = _judge(_fp16(g), g, "fp32")
    assert not ok and "fp16's grid" in message and "where fp32 was declared: computed in fp16" in message
    ok, message = _judge(_bf16(g), g, "fp32")
    assert not ok and "bf16's grid" in message and "computed in bf16" in message


def test_the_same_for_a_decoding_row() -> None:
    g = _golden()
    r = judge_tensor("b", "fp32", "fp32", "prompt", "blocks.0.attn.cache_k", _fp16(g), g, 1.0, 0.0, step=0)
    assert not r.passed and r.step == 0 and "computed in fp16" in r.message
    assert r.max_abs is not None and r.max_abs < 1e-2  # the numbers are still reported: within atol 1.0


def test_honest_results_pass() -> None:
    g = _golden()
    assert _judge(_fp16(g), g, "fp16") == (True, "")
    assert _judge(g.copy(), g, "fp32") == (True, "")
    assert _judge(_bf16(g), g, "bf16") == (True, "")  # bf16 has no coarser grid checked


def test_one_candidate_off_the_grid_clears_the_result() -> None:
    g = _golden()
    coarse = _fp16(_bf16(g))
    declared = _fp16(g)
    off = np.flatnonzero(~on_grid(declared, "bf16"))[0]
    coarse[off] = declared[off]
    assert _judge(coarse, g, "fp16")[0]


def test_the_16_candidate_floor() -> None:
    ones = np.ones(64, dtype=np.float32)  # on every grid: never a candidate
    g = _golden(256)
    g = g[~on_grid(_fp16(g), "bf16")]  # draws whose fp16 value is off bf16's grid (7 in 8)
    for n, fires in ((MIN_GRID_CANDIDATES - 1, False), (MIN_GRID_CANDIDATES, True)):
        golden = ones.copy()
        golden[:n] = g[:n]
        assert int((~on_grid(_fp16(golden), "bf16")).sum()) == n
        found = coarser_grid_message(_fp16(_bf16(golden)), golden, "fp16")
        assert (found is not None) == fires, n
        assert found is None or found[1] == n


def test_a_golden_on_the_coarse_grid_is_not_a_candidate() -> None:
    """An embedding read from a bf16 checkpoint: the golden is on bf16's grid too, and so is an honest copy."""
    g = _bf16(_golden())
    assert _judge(g.copy(), g, "fp32") == (True, "")
    assert coarser_grid_message(g.copy(), g, "fp32") is None
    pattern = np.tril(np.full((8, 8), 0.125, dtype=np.float32))  # zeros of the causal pattern, exact weights
    assert coarser_grid_message(pattern.copy(), pattern, "fp32") is None


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_overflow_come_first(bad: float) -> None:
    g = _golden()
    coarse = _fp16(_bf16(g))
    coarse[3] = bad
    ok, message = _judge(coarse, g, "fp16")
    assert not ok and message.startswith("overflow")
    ok, message = _judge(coarse, g, "fp32")
    assert not ok and not message.startswith("precision"), message
