"""hf-transformers, transformerlens and torch-compile on the Llama family: each agrees with the Llama reference.

Each backend is called directly (its `run_cases`) on a llama fixture made in memory: the seeded tiny Llama of
tests/families/llama/test_llama_reference.py (d_model 16, 2 blocks, 4 query heads sharing 2 key/value heads,
untied), its weights rounded to float32 as a fixture stores them, and compared tap by tap with
parity_reference.llama_model run on those same weights in the tier's dtype: fp32 within 1e-5, fp64 within 1e-12.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from parity_reference.families import load_family
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig

torch = pytest.importorskip("torch")

from parity_reference import llama_model  # noqa: E402  (torch first: skipped without it)

CASES = {"ten": [1, 5, 3, 7, 2, 11, 0, 4, 9, 6], "one": [3], "full": [(7 * k) % 12 for k in range(16)]}
ATOL = {"fp32": 1e-5, "fp64": 1e-12}
DTYPE = {"fp32": torch.float32, "fp64": torch.float64}
HF_UNEXPOSED = ("hook_scale", "hook_normalized", "hook_attn_scores")  # fused inside transformers' modules


def llama_fixture(config: LlamaConfig = TOY_LLAMA, lens_rows: int | None = None) -> tuple[Any, dict[str, np.ndarray]]:
    """What a backend reads of a llama fixture (family, model.config, cases, tap_names, weights, lens_rows)."""
    p = llama_model.init_params(config, 38, torch.float64, std=0.3)
    weights = {k: v.to(torch.float32).numpy() for k, v in p.items()}  # a fixture's weights are float32
    cases = [SimpleNamespace(name=n, tokens=t) for n, t in CASES.items()]
    fixture = SimpleNamespace(
        family="llama", model=SimpleNamespace(config=config), cases=cases,
        tap_names=load_family("llama").tap_names(config), weights=lambda: dict(weights),
        release_weights=lambda: None, lens_rows=lambda: lens_rows)
    return fixture, weights


def worst_differences(outputs: dict[str, dict[str, np.ndarray]], fixture: Any, weights: dict[str, np.ndarray],
                      precision: str) -> dict[str, float]:
    """The largest |backend - reference| per tap over every case (masked cells must be masked in both)."""
    config = fixture.model.config
    params = {k: torch.tensor(v, dtype=DTYPE[precision]) for k, v in weights.items()}
    worst: dict[str, float] = {}
    for case in fixture.cases:
        ref = llama_model.run_with_taps(params, config, case.tokens, fixture.lens_rows())
        got = outputs[case.name]
        for tap, value in got.items():
            want = ref[tap].numpy()
            assert value.shape == want.shape, (case.name, tap, value.shape, want.shape)
            assert value.dtype == want.dtype, (case.name, tap, value.dtype)
            inf = np.isinf(want)
            assert np.array_equal(np.isinf(value), inf), (case.name, tap)
            diff = float(np.max(np.abs(np.where(inf, 0.0, value - np.where(inf, 0.0, want))), initial=0.0))
            worst[tap] = max(worst.get(tap, 0.0), diff)
    return worst


# -- hf-transformers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("config", [TOY_LLAMA, LlamaConfig(bias=True, tied=True, rope_base=500000.0, rms_eps=1e-6)],
                         ids=["toy", "bias-tied"])
def test_hf_transformers_llama_agrees_with_the_reference(precision: str, config: LlamaConfig) -> None:
    pytest.importorskip("transformers")
    from parity_harness._backends.hf_transformers_backend import HFTransformersBackend

    backend = HFTransformersBackend()
    assert "llama" in backend.families
    fixture, weights = llama_fixture(config, lens_rows=3)
    assert backend.declines(fixture) is None
    wanted = backend.supported_taps(fixture)
    assert sorted(wanted) == sorted(t for t in fixture.tap_names
                                    if not t.startswith("ln_final.") and not t.endswith(HF_UNEXPOSED))
    outputs = dict(backend.run_cases(fixture, precision))  # type: ignore[arg-type]
    assert all(sorted(taps) == sorted(wanted) for taps in outputs.values())
    worst = worst_differences(outputs, fixture, weights, precision)
    # Measured on the toy: fp32 2.6e-6 (blocks.1.hook_resid_pre), fp64 4.4e-15 (the three float32 steps in float64)
    assert max(worst.values()) <= ATOL[precision], {k: v for k, v in worst.items() if v > ATOL[precision]}
    assert worst["blocks.1.attn.hook_pattern"] <= ATOL[precision]  # the causal mask: the future is never seen


@pytest.mark.parametrize(("precision", "eps"), [("fp16", 2.0**-10), ("bf16", 2.0**-7)])
def test_hf_transformers_llama_in_reduced_precision_is_within_the_reduced_rule(precision: str, eps: float) -> None:
    """fp16 and bf16: transformers' stock Llama modules, within c = 32 units of eps * M_tap of the float64 reference
    (measured: fp16 4.6 at blocks.1.attn.hook_v, bf16 5.7 at logits)."""
    pytest.importorskip("transformers")
    from parity_harness._backends.hf_transformers_backend import HFTransformersBackend

    fixture, weights = llama_fixture(lens_rows=3)
    outputs = dict(HFTransformersBackend().run_cases(fixture, precision))  # type: ignore[arg-type]
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    units: dict[str, float] = {}
    for case in fixture.cases:
        ref = llama_model.run_with_taps(params, fixture.model.config, case.tokens, fixture.lens_rows())
        for tap, value in outputs[case.name].items():
            want = ref[tap].numpy()
            finite = np.where(np.isinf(want), 0.0, want)
            scale = eps * max(float(np.max(np.abs(finite))), np.finfo(np.float64).tiny)
            units[tap] = max(units.get(tap, 0.0), float(np.max(np.abs(np.where(np.isinf(want), 0.0, value - finite))))
                             / scale)
    assert max(units.values()) <= 32, {k: v for k, v in units.items() if v > 32}
    assert max(units.values()) > 0.1  # the reduced precision is really reduced: not float32 in disguise


def test_hf_transformers_declines_interleaved_llama_in_one_line() -> None:
    from parity_harness._backends.hf_transformers_backend import HFTransformersBackend

    fixture, _ = llama_fixture(LlamaConfig(rope_pairing="interleaved"))
    reason = HFTransformersBackend().declines(fixture)
    assert reason is not None and "rope_pairing='interleaved'" in reason and "\n" not in reason


# -- torch-compile -----------------------------------------------------------------------------------------------


@pytest.mark.full  # two precisions x two graphs (T = 1, T >= 2) compiled cold: about 40 s
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_torch_compile_llama_agrees_with_the_reference(precision: str, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Any) -> None:
    from parity_harness._backends.torch_compile_backend import TorchCompileBackend, find_cxx, key_parts

    if find_cxx() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a cold cache: the llama graphs compiled here
    backend = TorchCompileBackend()
    assert "llama" in backend.families
    fixture, weights = llama_fixture(lens_rows=3)
    outputs = dict(backend.run_cases(fixture, precision))  # type: ignore[arg-type]
    assert all(sorted(taps) == sorted(fixture.tap_names) for taps in outputs.values())  # every tap, no hooks
    worst = worst_differences(outputs, fixture, weights, precision)
    assert max(worst.values()) <= ATOL[precision], {k: v for k, v in worst.items() if v > ATOL[precision]}
    params = {k: torch.tensor(v) for k, v in weights.items()}
    gpt2_key, llama_key = (key_parts(TOY_LLAMA, 3, "fp32", params, family) for family in ("gpt2", "llama"))
    assert llama_key["model_source"] != gpt2_key["model_source"]  # a llama graph is keyed by llama_model's source


# -- transformerlens ---------------------------------------------------------------------------------------------


@pytest.mark.full  # importing transformer_lens takes about 7 s
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("config", [
    TOY_LLAMA, LlamaConfig(bias=True, tied=True, rope_pairing="interleaved", n_kv_heads=4, rope_base=500000.0),
], ids=["toy", "bias-tied-interleaved-mha"])
def test_transformerlens_llama_agrees_with_the_reference_on_every_tap(precision: str, config: LlamaConfig) -> None:
    pytest.importorskip("transformer_lens")
    from parity_harness._backends.transformerlens_backend import TransformerLensBackend

    backend = TransformerLensBackend()
    assert "llama" in backend.families
    fixture, weights = llama_fixture(config, lens_rows=3)
    outputs = dict(backend.run_cases(fixture, precision))  # type: ignore[arg-type]
    assert all(sorted(taps) == sorted(fixture.tap_names) for taps in outputs.values())  # every tap, from its hooks
    worst = worst_differences(outputs, fixture, weights, precision)
    assert max(worst.values()) <= ATOL[precision], {k: v for k, v in worst.items() if v > ATOL[precision]}


# -- fixtures/toy-llama through the harness: every tier each backend declares -----------------------------------

TOY_LLAMA_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "toy-llama"


@pytest.mark.parametrize(("backend", "precisions", "taps"), [
    pytest.param("hf-transformers", ["fp32", "fp64", "fp16", "bf16"], 36, id="hf-transformers"),
    pytest.param("transformerlens", ["fp32", "fp64"], 48, id="transformerlens", marks=pytest.mark.full),
    pytest.param("torch-compile", ["fp32", "fp64"], 48, id="torch-compile", marks=pytest.mark.full),
])
def test_toy_llama_passes_in_every_tier_the_backend_declares(backend: str, precisions: list[str], taps: int) -> None:
    import parity_harness.api as parity

    report = parity.run(backends=[backend], fixture=str(TOY_LLAMA_DIR), precisions=precisions, decoding=False)
    ran = {run.precision for run in report.runs if run.status.value == "ran"}
    assert ran == set(precisions), [(r.precision, r.status, r.message) for r in report.runs]
    assert report.passed, parity.render(report)
    assert all(len(report.supported[(backend, p)]) == taps for p in precisions)
