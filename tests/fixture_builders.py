"""The random-weight fixture the tests build (torch needed), through parity_harness._authoring.fixture_writer.

`build_random_fixture` writes `parity_reference.model.GPT(config)` after `torch.manual_seed(seed)` (GPT-2's
init), its golden taps from `run_with_taps` in float32 and in float64 (the stored float32 weights
upcast), and optionally both ONNX graphs (~10 s a graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from parity_harness._authoring.fixture_writer import write_fixture_files
from parity_harness._fixture.fixture import Case
from parity_harness._fixture.tolerances import FP32_ATOL, FP64_ATOL
from parity_reference.config import TOY, GPTConfig
from parity_reference.run import reference_taps

# T = 1, 5 and 16 (= n_ctx).
CASES = (
    Case("single", (0,), "single"),
    Case("short", (0, 1, 4, 7, 1), "grammar"),
    Case("longest", (0, 1, 3, 4, 7, 2, 6, 0, 2, 10, 11, 8, 1, 5, 9, 0), "longest"),
)

# What these fixtures have always declared: the fp32 tier without the rtol `parity export` writes.
TOLERANCES: dict[str, Any] = {
    "fp32": {"atol": FP32_ATOL, "rtol": 0.0, "overrides": {}},
    "fp64": {"atol": FP64_ATOL, "rtol": 0.0, "overrides": {}},
}


def build_random_fixture(
    root: Path,
    config: GPTConfig = TOY,
    cases: Sequence[Case] = CASES,
    seed: int = 0,
    onnx: bool = False,
) -> Path:
    """Write a complete fixture of random weights into `root` and return `root`."""
    torch = pytest.importorskip("torch")
    from parity_reference.model import GPT

    torch.manual_seed(seed)
    weights = {k: v.detach().to(torch.float32).numpy() for k, v in GPT(config).params().items()}
    write_fixture_files(
        root,
        config=config,
        vocab=[f"w{i}" for i in range(config.vocab_size)],
        cases=cases,
        weights=weights,
        golden=lambda precision: reference_taps(weights, config, cases, precision),
        onnx=onnx,
        provenance={"torch": torch.__version__, "seed": seed, "steps": 0, "command": "tests/fixture_builders.py"},
        tolerances=TOLERANCES,
    )
    return root
