"""The GPT-2 benchmark's compute floor counts the FLOPs the reference actually does.

`benchmarks.bench.forward_flops` is analytic (the blocks' products, attention, the unembedding, the
logit lens on the rows kept); here it is checked against torch's own FlopCounterMode over
parity_reference's forward pass of the fixture's family on every case of the toy, of toy-llama (grouped-query
attention, SwiGLU) and of generated fixtures with "rows" (gpt2-mini, llama-mini).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench import forward_flops
from parity_harness._fixture.fixture import load_fixture
from tests.helpers import REPO


def counted_flops(root: Path) -> int:
    """Matrix-product FLOPs of the reference forward over every case, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    from parity_harness._authoring.decoding_writer import family_forward
    from parity_reference.run import torch_params

    fixture = load_fixture(root)
    run_with_taps, _ = family_forward(fixture.family)
    params = torch_params(fixture.weights(), "fp64")
    with FlopCounterMode(display=False) as counter:
        for case in fixture.cases:
            run_with_taps(params, fixture.model.config, list(case.tokens), fixture.lens_rows())
    return int(counter.get_total_flops())


def test_forward_flops_is_what_the_reference_computes_on_the_toy(toy_dir: Path) -> None:
    pytest.importorskip("torch")
    assert load_fixture(toy_dir).lens_rows() is None  # every position through the logit lens
    assert forward_flops(load_fixture(toy_dir)) == counted_flops(toy_dir)


def test_forward_flops_is_what_the_llama_reference_computes(tmp_path: Path) -> None:
    """Grouped-query k and v (n_kv_heads x d_head wide), SwiGLU's three products: on toy-llama (every position
    through the lens) and on llama-mini (the rows kept), as torch counts llama_model's forward."""
    pytest.importorskip("torch")
    from parity_harness._authoring.presets import export_preset

    toy_llama = REPO / "fixtures" / "toy-llama"
    assert load_fixture(toy_llama).family == "llama" and load_fixture(toy_llama).lens_rows() is None
    assert forward_flops(load_fixture(toy_llama)) == counted_flops(toy_llama)
    export_preset(tmp_path / "lm", "llama-mini", progress=lambda _m: None, with_onnx=False)
    assert load_fixture(tmp_path / "lm").lens_rows() is not None
    assert forward_flops(load_fixture(tmp_path / "lm")) == counted_flops(tmp_path / "lm")


def test_llama_floor_imports_name_the_llama_class() -> None:
    from benchmarks.bench import floor_imports

    assert floor_imports("hf-transformers", "llama") == ("torch", "transformers:LlamaForCausalLM")
    assert floor_imports("hf-transformers", "gpt2") == ("torch", "transformers:GPT2LMHeadModel")


def test_backend_times_reads_one_time_per_backend_and_precision() -> None:
    """The notes' backend times come from `parity run`'s per-tier lines: a result judged in two tiers once."""
    from benchmarks.bench import backend_times

    out = ("backend  tier          taps   verdict                        decoding  time\n"
           "numpy    fp32 vs fp32  48/48  ok    worst 1% of tolerance (x)  -         1.73 s\n"
           "numpy    fp64 vs fp64  48/48  ok    worst 1% of tolerance (x)  -         3.16 s\n"
           "numpy    fp64 vs fp32  48/48  ok    worst 1% of tolerance (x)  -         3.16 s\n"
           "pytorch  fp32 vs fp32  48/48  ok    worst 1% of tolerance (x)  -         2.00 s\n")
    assert backend_times(out, ["numpy"]) == {("numpy", "fp32"): "1.73", ("numpy", "fp64"): "3.16"}


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
