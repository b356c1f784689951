"""The GPT-2 benchmark's compute floor counts the FLOPs the reference actually does.

`benchmarks.bench.forward_flops` is analytic (the blocks' products, attention, the unembedding, the
logit lens on the rows kept); here it is checked against torch's own FlopCounterMode over
parity_reference's forward pass on every case of the toy and of a generated fixture with "rows".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench import forward_flops
from parity_harness._fixture.fixture import load_fixture


def counted_flops(root: Path) -> int:
    """Matrix-product FLOPs of the reference forward over every case, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    from parity_reference.model import run_with_taps
    from parity_reference.run import torch_params

    fixture = load_fixture(root)
    params = torch_params(fixture.weights(), "fp64")
    with FlopCounterMode(display=False) as counter:
        for case in fixture.cases:
            run_with_taps(params, fixture.config, list(case.tokens), fixture.lens_rows())
    return int(counter.get_total_flops())


def test_forward_flops_is_what_the_reference_computes_on_the_toy(toy_dir: Path) -> None:
    pytest.importorskip("torch")
    assert load_fixture(toy_dir).lens_rows() is None  # every position through the logit lens
    assert forward_flops(load_fixture(toy_dir)) == counted_flops(toy_dir)


@pytest.mark.full  # the shared gpt2-mini export
def test_forward_flops_counts_only_the_rows_kept(gpt2_mini: Path) -> None:
    assert load_fixture(gpt2_mini).lens_rows() is not None  # probs and the logit lens on the last rows only
    assert forward_flops(load_fixture(gpt2_mini)) == counted_flops(gpt2_mini)


@pytest.mark.parametrize("launch_code", [0, 1])
def test_a_failed_chromium_start_is_not_timed_never_zero(monkeypatch: pytest.MonkeyPatch, launch_code: int) -> None:
    """A launch that failed has no time to give: the floor must not count it as a 0 s start."""
    import benchmarks.bench as bench
    from parity_harness._backends.browser import driver

    def once(argv: list[str]) -> tuple[float, int]:
        return (2.5, launch_code) if "launch" in argv else (0.5, 0)  # a Node start 0.5 s, a launch 2.5 s

    monkeypatch.setattr(driver, "missing", lambda: None)  # a browser is installed
    monkeypatch.setattr(bench, "_once", once)
    node, chromium = bench.process_starts(3)
    assert node == 0.5
    assert chromium == (2.0 if launch_code == 0 else None)
