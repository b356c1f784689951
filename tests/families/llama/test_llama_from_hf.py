"""`parity export --from-hf DIR` on a Llama-architecture checkpoint: a llama fixture, or one line saying why not.

The checkpoint is a tiny LlamaForCausalLM (d_model 16, 2 blocks, 4 heads sharing 2 key/value heads) made here and
saved with `save_pretrained` into tmp_path: nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._core.errors import FixtureError
from parity_reference.llama_config import LlamaConfig
from tests.helpers import run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parity_harness._authoring.hf_import import export_from_hf  # noqa: E402  (torch and transformers first)
from parity_harness._authoring.llama_family import (  # noqa: E402
    read_hf_llama_config,
    read_hf_llama_weights,
)

TINY = {"vocab_size": 12, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}


def checkpoint(tmp_path: Path, **overrides: Any) -> tuple[Path, Any]:
    """A seeded tiny LlamaForCausalLM saved into tmp_path/ckpt: (the directory, the model)."""
    torch.manual_seed(38)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # every weight random (RMSNorm gains too), not the init's ones
    root = tmp_path / "ckpt"
    model.save_pretrained(root)
    return root, model


def edit_config(root: Path, **changes: Any) -> Path:
    path = root / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("tied", [False, True])
def test_a_llama_checkpoint_reads_as_parity_llama_config_and_exact_weights(tmp_path: Path, tied: bool) -> None:
    root, model = checkpoint(tmp_path, tie_word_embeddings=tied, attention_bias=tied)
    config, is_tied = read_hf_llama_config(root / "config.json")
    assert is_tied is tied
    assert config == LlamaConfig(vocab_size=12, n_ctx=16, d_model=16, n_layer=2, n_head=4, n_kv_heads=2, d_mlp=32,
                                 rms_eps=1e-6, rope_base=500000.0, rope_pairing="half", bias=tied, tied=tied)
    weights, source = read_hf_llama_weights(root / "model.safetensors", config)
    assert source == "F32"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight")
    assert sorted(weights) == sorted(state)
    for name, value in weights.items():
        assert value.dtype == np.float32 and np.array_equal(value, state[name]), name


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "RoPE scaling"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}, "RoPE scaling \"llama3\""),
    ({"hidden_act": "gelu"}, "hidden_act \"gelu\" is not one parity computes"),
    ({"mlp_bias": True}, "mlp_bias is true"),
    ({"head_dim": 8}, "head_dim 8 is not hidden_size / num_attention_heads"),
    ({"num_key_value_heads": 3}, "unusable Llama config (n_head=4 is not a multiple of n_kv_heads=3)"),
    ({"architectures": ["MistralForCausalLM"]}, "is not Llama's"),
])
def test_what_parity_cannot_represent_is_refused_in_one_line(tmp_path: Path, change: dict[str, Any],
                                                              message: str) -> None:
    root, _ = checkpoint(tmp_path)
    edit_config(root, **change)
    with pytest.raises(FixtureError) as info:
        export_from_hf(root, tmp_path / "fixture", progress=lambda _m: None, with_onnx=False)
    text = str(info.value)
    assert message in text and "\n" not in text, text
    assert not (tmp_path / "fixture").exists()


def test_an_untied_checkpoint_without_lm_head_is_refused(tmp_path: Path) -> None:
    root, model = checkpoint(tmp_path)
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(root / "model.safetensors"))
    config, _ = read_hf_llama_config(root / "config.json")
    with pytest.raises(FixtureError, match=r"missing tensor 'lm_head\.weight'.*tie_word_embeddings false"):
        read_hf_llama_weights(root / "model.safetensors", config)


def test_the_cli_refuses_rope_scaling_with_exit_2_and_one_line(tmp_path: Path) -> None:
    root, _ = checkpoint(tmp_path)
    edit_config(root, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    proc = run_cli("export", "--from-hf", str(root), "--fixture", str(tmp_path / "fixture"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "RoPE scaling" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_export_writes_a_llama_fixture_whose_goldens_are_what_transformers_computes(tmp_path: Path) -> None:
    from parity_harness._fixture.fixture import load_fixture

    root, model = checkpoint(tmp_path)
    target = tmp_path / "fixture"
    export_from_hf(root, target, progress=lambda _m: None, with_onnx=False)
    fixture = load_fixture(target)
    assert fixture.family == "llama"
    assert fixture.model.config == read_hf_llama_config(root / "config.json")[0]
    golden = fixture.golden("fp32")
    for case in fixture.cases:
        with torch.no_grad():
            logits = model(torch.tensor([list(case.tokens)])).logits[0].numpy()
        diff = float(np.max(np.abs(golden[case.name]["logits"] - logits)))
        assert diff <= 1e-5, f"{case.name}: the golden logits differ from transformers' by {diff:.3g}"
    assert fixture.onnx_path("all_taps") is None  # with_onnx=False: no graph claimed
    import parity_harness.api as parity

    report = parity.run(backends=["pytorch", "hf-transformers"], fixture=str(target), precisions=["fp32", "fp64"])
    assert report.passed, parity.render(report)
