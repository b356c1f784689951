"""The `hf-transformers` backend in fp16 and bf16: transformers' GPT2LMHeadModel built in the dtype.

- the model is built in the dtype (`from_config(config, dtype=...)`): every parameter is float16 /
  bfloat16 and the config records it;
- it passes fixtures/toy in fp16 and bf16, against both golden tiers, every tap it exposes compared,
  its values float32 arrays on the precision's grid, computed in it (not float32 rounded at the end);
- its bf16 numbers, put on fp16's grid and declared as fp16, fail both tiers (the fp16 rule tells the
  precisions apart), while the same numbers declared as bf16 pass (the replay is not what fails);
- it passes a generated gpt2-mini in fp16 and bf16.

Every test is marked `full` (`nox -s full`): importing transformers in a test worker costs ~20 s of the fast
set, whose full run already runs hf-transformers in fp32 and fp64.

Where transformers is not installed every test skips with the reason; PARITY_REQUIRE_ALL_BACKENDS=1
(CI) turns those skips into failures (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision, module_available
from parity_harness._compare.report import Report
from parity_harness._core.precision import unrepresentable
from parity_harness._fixture.fixture import Fixture, load_fixture

NAME = "hf-transformers"
pytestmark = pytest.mark.full  # transformers imported in-process: seconds the fast set does not have


def _require() -> None:
    for module in ("torch", "transformers"):
        if not module_available(module):
            pytest.skip(f"{module} is not installed: pip install 'parity-harness[hf]'")


@pytest.fixture(scope="module")
def hf_toy(toy_dir: Path) -> Report:
    """One run of hf-transformers on the toy in fp16 and bf16, its outputs kept."""
    _require()
    return api.run(NAME, toy_dir, ["fp16", "bf16"], decoding=False, keep_outputs=True)


def test_the_model_is_built_in_the_dtype(toy_dir: Path) -> None:
    _require()
    import torch

    from parity_harness._backends.hf_transformers_backend import hf_model

    fixture = load_fixture(toy_dir)
    for precision, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        model = hf_model(dict(fixture.weights()), fixture.config, precision)  # type: ignore[arg-type]
        assert model.config.dtype == dtype
        assert {p.dtype for p in model.parameters()} == {dtype}
        wte = fixture.weights()["wte.weight"]
        assert torch.equal(model.transformer.wte.weight, torch.tensor(wte).to(dtype))  # rounded once, to nearest


def test_hf_passes_the_toy_in_fp16_and_bf16(hf_toy: Report, toy_dir: Path) -> None:
    report = hf_toy
    assert report.passed, [d.message for d in report.divergences]
    ran = {(r.backend, r.precision, r.status.value) for r in report.runs}
    assert ran == {(NAME, "fp16", "ran"), (NAME, "bf16", "ran")}
    fixture = load_fixture(toy_dir)
    tiers = {(r.precision, r.golden) for r in report.results if r.status == "ok"}
    assert tiers == {(p, g) for p in ("fp16", "bf16") for g in ("fp32", "fp64")}
    golden32 = fixture.golden_case("fp32", "grammar_0")["logits"]
    for precision in ("fp16", "bf16"):
        out = report.outputs[(NAME, precision)]
        assert len(out) == len(fixture.cases)
        assert all(len(taps) == 31 for taps in out.values())  # 43 taps less the 12 transformers never exposes
        for taps in out.values():
            for tap, array in taps.items():
                assert array.dtype == np.float32, tap
                assert unrepresentable(array, precision) is None, tap  # on the grid (the boundary checks it too)
        logits = out["grammar_0"]["logits"]
        rounded = np.asarray(golden32, dtype=np.float32)
        rounded = (rounded.astype(np.float16).astype(np.float32) if precision == "fp16"
                   else (rounded.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))
        assert not np.array_equal(logits, rounded)  # computed in the dtype, not float32's logits rounded


class _Replay(Backend):
    """A test backend: replays kept outputs (hf-transformers' bf16 numbers), declared as `precisions`."""

    name: ClassVar[str] = "hf-replay-test"
    outputs: ClassVar[BackendOutput] = {}

    def supported_taps(self, fixture: Fixture) -> list[str]:
        kept = next(iter(type(self).outputs.values()))
        return [t for t in fixture.tap_names if t in kept]  # the 31 hf-transformers exposes

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return type(self).outputs


def test_hf_bf16_numbers_judged_as_fp16_fail(hf_toy: Report, toy_dir: Path) -> None:
    """bf16's values of the toy's magnitudes are on fp16's grid too: only the fp16 rule can tell, and must."""
    bf16 = hf_toy.outputs[(NAME, "bf16")]
    on_fp16 = {c: {t: a.astype(np.float16).astype(np.float32) for t, a in taps.items()} for c, taps in bf16.items()}
    moved = max(float(np.abs(on_fp16[c][t] - a).max()) for c, taps in bf16.items() for t, a in taps.items())
    assert moved <= 2.0**-25  # only values below fp16's normal range (tiny probabilities) moved, by half a subnormal
    as_fp16 = type("AsFp16", (_Replay,), {"precisions": ("fp16",), "outputs": on_fp16})()
    report = api.run(as_fp16, toy_dir, "fp16", decoding=False)
    assert not report.passed and {d.golden for d in report.divergences} == {"fp32", "fp64"}
    as_bf16 = type("AsBf16", (_Replay,), {"precisions": ("bf16",), "outputs": bf16})()
    assert api.run(as_bf16, toy_dir, "bf16", decoding=False).passed  # the same numbers, honestly declared


def test_hf_passes_a_generated_gpt2_mini_in_fp16_and_bf16(gpt2_mini: Path) -> None:
    _require()
    report = api.run(NAME, gpt2_mini, ["fp16", "bf16"], decoding=False)
    assert report.passed, [d.message for d in report.divergences][:5]
    assert {(r.precision, r.status.value) for r in report.runs} == {("fp16", "ran"), ("bf16", "ran")}
    compared = {(r.precision, r.golden) for r in report.results if r.status == "ok"}
    assert compared == {(p, g) for p in ("fp16", "bf16") for g in ("fp32", "fp64")}
