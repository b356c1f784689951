"""fixtures/toy-llama and the Llama presets: what `parity export --preset toy-llama|llama-mini|llama-small` writes.

The committed toy-llama fixture is the brief's toy Llama (seeded weights, the toy's vocabulary, cases and decoding
prompts, the GPT-2 toy's default tolerances, its ONNX graphs), its seal is pinned (a changed byte of the manifest
is a new fixture id), and `parity export --preset toy-llama --check` regenerates it bit for bit on this machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from parity_harness._fixture.fixture import load_fixture

ROOT = Path(__file__).resolve().parents[3]
TOY_LLAMA = ROOT / "fixtures" / "toy-llama"
TOY = ROOT / "fixtures" / "toy"
# The committed fixture's id: its manifest's seal. Regenerating it must not change it (a new id is a new fixture).
# A new id since issue 39: the gradient goldens (the manifest's `training` section) were added.
TOY_LLAMA_SEAL = "6501d9a0b972cf284ae115f9ed1d88289a9bcc7a3aafed22e135ce4e0ffa03bc"


def test_toy_llama_fixture_loads_as_the_briefs_toy_llama() -> None:
    fixture = load_fixture(TOY_LLAMA)
    toy = load_fixture(TOY)
    assert fixture.family == "llama"
    assert fixture.manifest["config"] == {
        "vocab_size": 12, "n_ctx": 16, "d_model": 16, "n_layer": 2, "n_head": 4, "n_kv_heads": 2, "d_mlp": 32,
        "rms_eps": 1e-05, "rope_base": 10000.0, "rope_pairing": "half", "bias": False, "tied": False, "causal": True}
    assert fixture.vocab == toy.vocab
    assert [(c.name, c.tokens) for c in fixture.cases] == [(c.name, c.tokens) for c in toy.cases]
    assert fixture.manifest["tolerances"] == toy.manifest["tolerances"]  # the toy's defaults, not loosened
    assert [t["name"] for t in fixture.manifest["taps"]] == fixture.model.tap_names()
    assert "blocks.0.attn.hook_rot_k" in fixture.tap_names
    assert set(fixture.files["onnx"]) >= {"all_taps", "logits"}  # its graphs, run against the fp32 goldens
    decoding, toy_decoding = fixture.decoding(), toy.decoding()
    assert decoding is not None and toy_decoding is not None
    assert decoding.steps == toy_decoding.steps
    assert [p.tokens for p in decoding.prompts] == [p.tokens for p in toy_decoding.prompts]
    weights = fixture.weights()
    assert max(max(w.shape) for w in weights.values()) <= 32
    assert "lm_head.weight" in weights  # untied


def test_toy_llama_fixture_id_is_stable() -> None:
    fixture = load_fixture(TOY_LLAMA)
    assert fixture.seal == TOY_LLAMA_SEAL
    provenance = fixture.manifest["provenance"]
    assert (provenance["preset"], provenance["seed"]) == ("toy-llama", 0)


def test_export_check_regenerates_the_committed_toy_llama() -> None:
    pytest.importorskip("torch")
    from parity_harness._authoring.llama_family import check_toy_llama
    from parity_harness._core.status import Verdict

    lines: list[str] = []
    assert check_toy_llama(TOY_LLAMA, progress=lines.append, out=lines.append) == Verdict.AGREE, lines
    assert any("weights regenerated from seed 0: bit-identical" in line for line in lines)


@pytest.mark.full  # about 10 s: the goldens and three ONNX graphs written and run again
def test_export_toy_llama_writes_the_same_fixture(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from parity_harness._authoring.llama_family import export_toy_llama

    export_toy_llama(tmp_path / "tl", progress=lambda _m: None)
    names = sorted(p.name for p in TOY_LLAMA.iterdir())
    assert sorted(p.name for p in (tmp_path / "tl").iterdir()) == names
    for name in names:
        if name != "manifest.json":
            assert (tmp_path / "tl" / name).read_bytes() == (TOY_LLAMA / name).read_bytes(), name
    ours = json.loads((tmp_path / "tl" / "manifest.json").read_text())
    assert ours["sha256"] == json.loads((TOY_LLAMA / "manifest.json").read_text())["sha256"]


def test_gpt2_manifests_name_no_family(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from parity_harness._authoring.presets import export_preset

    export_preset(tmp_path / "mini", "gpt2-mini", progress=lambda _m: None, with_onnx=False)
    manifest = json.loads((tmp_path / "mini" / "manifest.json").read_text())
    assert "family" not in manifest
    assert load_fixture(tmp_path / "mini").family == "gpt2"


@pytest.mark.full  # ~20 s, the fast set's slowest test (the goldens and both ONNX graphs of an 8-layer model);
# the fast set still exports llama-mini, without ONNX (tests/project/test_bench_floor.py)
def test_llama_mini_preset_writes_a_llama_fixture(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from parity_harness._authoring.presets import LENS_ROWS, export_preset

    export_preset(tmp_path / "lm", "llama-mini", progress=lambda _m: None)
    fixture = load_fixture(tmp_path / "lm")
    assert fixture.family == "llama"
    assert fixture.manifest["config"]["n_layer"] == 8 and fixture.manifest["config"]["n_kv_heads"] == 2
    rows = {t["name"]: t.get("rows") for t in fixture.manifest["taps"]}
    assert rows["probs"] == LENS_ROWS and rows["logit_lens.0"] == LENS_ROWS and rows["logits"] is None
    assert fixture.onnx_path("all_taps") is not None and fixture.onnx_path("logits") is not None  # both graphs
    overrides = fixture.manifest["tolerances"]["fp32"]["overrides"]
    assert set(overrides) == set(fixture.tap_names)  # scaled tolerances: one per tap
    for precision in ("fp32", "fp64"):
        fixture.validate_golden(precision)


def test_llama_small_preset_is_about_100m_parameters() -> None:
    from parity_harness._authoring.presets import PRESETS
    from parity_reference.llama_config import LlamaConfig, param_shapes

    preset = PRESETS["llama-small"]
    config = preset.config
    assert preset.family == "llama" and isinstance(config, LlamaConfig)
    assert (config.d_model, config.n_layer, config.n_head, config.n_kv_heads, config.d_mlp, config.vocab_size) == (
        768, 12, 12, 4, 2048, 32000)
    n = sum(math.prod(s) for s in param_shapes(config).values())
    assert 90e6 <= n <= 130e6, n


def test_the_toys_check_refuses_a_llama_fixture_in_one_line() -> None:
    from parity_harness._authoring.export import check_fixture
    from parity_harness._core.errors import FixtureError

    with pytest.raises(FixtureError, match=r"a llama fixture, not the toy: pass --preset toy-llama$"):
        check_fixture(TOY_LLAMA, progress=lambda _m: None, retrain=False, out=lambda _m: None)


def test_toy_llama_goldens_are_within_their_tier_of_an_mpmath_truth() -> None:
    """The float64 golden is llama_model in float64: within 1e-14 of a 40-digit truth (measured 8.9e-16 over the
    12 cases), far inside the fp64 tolerance 1e-12; the float32 golden within 1e-6 (measured 3.5e-7; atol 1e-5)."""
    pytest.importorskip("mpmath")
    import numpy as np

    from parity_harness._authoring.llama_family import truth_taps as llama_truth_taps
    from parity_harness._fixture.files import read_safetensors

    fixture = load_fixture(TOY_LLAMA)
    weights, config = fixture.weights(), fixture.model.config
    goldens = {p: read_safetensors(fixture.golden_path(p)) for p in ("fp32", "fp64")}
    worst = {"fp32": 0.0, "fp64": 0.0}
    for case in fixture.cases:
        if case.name not in ("longest_context", "all_words", "single_token"):
            continue
        truth = llama_truth_taps(weights, config, case.tokens)  # type: ignore[arg-type]
        assert set(truth) == set(fixture.tap_names)
        for tap, want in truth.items():
            masked = np.isinf(want)
            for precision, golden in goldens.items():
                got = golden[f"{case.name}/{tap}"].astype(np.float64)
                assert np.array_equal(np.isinf(got), masked), (case.name, tap)
                diff = np.abs(np.where(masked, 0.0, got - np.where(masked, 0.0, want)))
                worst[precision] = max(worst[precision], float(diff.max(initial=0.0)))
    assert worst["fp64"] <= 1e-14, worst
    assert worst["fp32"] <= 1e-6, worst


@pytest.mark.full  # three subprocesses, each importing torch: ~8 s
def test_the_cli_writes_and_checks_a_toy_llama_fixture(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.helpers import run_cli

    target = str(tmp_path / "tl")
    wrote = run_cli("export", "--preset", "toy-llama", "--fixture", target)
    assert wrote.returncode == 0, wrote.stderr
    checked = run_cli("export", "--preset", "toy-llama", "--check", "--fixture", target)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK, the committed toy-llama fixture is reproducible" in checked.stdout + checked.stderr
    toy = run_cli("export", "--preset", "toy-llama", "--check", "--fixture", str(TOY))
    assert toy.returncode == 2 and toy.stderr.count("\n") == 1 and "not a toy-llama fixture" in toy.stderr
