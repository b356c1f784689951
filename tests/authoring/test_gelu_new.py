"""Fixtures of GPT-2's own activation, `gelu_new`: the preset, the Hugging Face import, and every backend on them.

- `parity export --preset gpt2-mini-gelu-new` writes `"activation": "gelu_new"`, and every built-in backend of
  the GPT-2 family passes it;
- a backend computing the exact GELU on it (a port that missed the config's activation) fails first at
  `blocks.0.mlp.hook_post`, in both tiers, with the likely cause "exact GELU instead of gelu_new";
- a GPT-2 checkpoint saying `"activation_function": "gelu_new"` (or `gelu_pytorch_tanh`, the same formula in
  torch's kernel) imports without `--exact-gelu`, as it is: its goldens are what transformers computes from the
  checkpoint itself, and hf-transformers passes on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._compare.gpt2_causes import GELU_EXACT
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._run.runner import run_parity
from parity_reference import numpy_model
from tests.helpers import BUILTIN_PRECISIONS, gpt2_checkpoint, run_cli

# gpt2-mini's export with both ONNX graphs, then every built-in backend (torch-compile's compile included): minutes.
pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def gelu_new_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`parity export --preset gpt2-mini-gelu-new` with both ONNX graphs (read-only)."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    root = tmp_path_factory.mktemp("gelu-new") / "fixture"
    proc = run_cli("export", "--preset", "gpt2-mini-gelu-new", "--fixture", str(root))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root


def test_the_preset_is_gpt2_mini_with_gelu_new(gelu_new_dir: Path) -> None:
    from parity_harness._authoring.presets import PRESETS

    config = json.loads((gelu_new_dir / "manifest.json").read_text())["config"]
    assert config["activation"] == "gelu_new"
    assert {k: v for k, v in config.items() if k != "activation"} == PRESETS["gpt2-mini"].config.to_dict()
    # The goldens are gelu_new of the MLP's input, not the exact GELU of it.
    fixture = load_fixture(gelu_new_dir)
    case = fixture.cases[-1].name
    taps = fixture.golden_case("fp64", case, ["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"])
    pre, post = taps["blocks.0.mlp.hook_pre"], taps["blocks.0.mlp.hook_post"]
    assert np.abs(post - numpy_model.gelu_new(pre)).max() < 1e-15
    assert np.abs(post - numpy_model.gelu(pre)).max() > 1e-6


def test_every_builtin_backend_passes_the_gelu_new_preset(gelu_new_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    names = ",".join(sorted(BUILTIN_PRECISIONS))  # every built-in backend declares the GPT-2 family
    proc = run_cli("run", "--fixture", str(gelu_new_dir), "--backends", names, "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    assert ran == {(b, p) for b, ps in BUILTIN_PRECISIONS.items() for p in ps}
    assert report["passed"] is True and report["counts"]["failed"] == 0


class ExactGeluNumpy(Backend):
    """The NumPy reference run with the exact GELU whatever the fixture's config says: a port that missed it."""

    name: ClassVar[str] = "numpy-exact-gelu"
    description: ClassVar[str] = "numpy_model.py with activation forced to the exact GELU"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("numpy",)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        from dataclasses import replace

        config = replace(fixture.config, activation="gelu")
        dtype = np.float32 if precision == "fp32" else np.float64
        params = {name: w.astype(dtype) for name, w in fixture.weights().items()}
        return {case.name: numpy_model.forward(params, config, list(case.tokens), fixture.lens_rows())
                for case in fixture.cases}


def test_the_exact_gelu_on_a_gelu_new_fixture_fails_first_at_mlp_hook_post(gelu_new_dir: Path) -> None:
    report = api.run([ExactGeluNumpy()], str(gelu_new_dir), "all", decoding=False)
    assert not report.passed
    first = {(d.precision, d.golden): d.tap for d in report.divergences if d.backend == ExactGeluNumpy.name}
    assert first == {("fp32", "fp32"): "blocks.0.mlp.hook_post", ("fp64", "fp64"): "blocks.0.mlp.hook_post",
                     ("fp64", "fp32"): "blocks.0.mlp.hook_post"}, first
    # The likely cause names the mistake (parity_harness/_compare/gpt2_causes.py), in every tier.
    assert all(d.cause.startswith(f"{GELU_EXACT}: ") for d in report.divergences), [d.cause for d in report.divergences]


def _backend(name: str) -> GuardedBackend:
    from parity_harness._backends.registry import load_backend

    backend = load_backend(name)
    if backend.missing():
        pytest.skip(f"{name}: {backend.missing()}")
    return backend


@pytest.mark.parametrize("activation", ["gelu_new", "gelu_pytorch_tanh"])
def test_a_gelu_new_checkpoint_imports_as_it_is(activation: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from parity_harness._authoring.hf_import import export_from_hf

    ckpt = gpt2_checkpoint(tmp_path / "ckpt", activation, monkeypatch)
    root = tmp_path / "fixture"
    export_from_hf(ckpt, root, progress=lambda _m: None, with_onnx=False)  # no --exact-gelu
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["config"]["activation"] == "gelu_new"
    assert manifest["provenance"]["activation"] == f"gelu_new, GPT-2's tanh GELU (the checkpoint's own {activation!r})"
    assert "--exact-gelu" not in manifest["provenance"]["command"]
    fixture = load_fixture(root)
    # As it is: the float64 golden is what transformers computes from the checkpoint itself, its own activation.
    model = transformers.GPT2LMHeadModel.from_pretrained(str(ckpt), dtype=torch.float64).eval()
    for case in fixture.cases:
        with torch.no_grad():
            logits = model(torch.tensor([list(case.tokens)])).logits[0].numpy()  # (T, V)
        golden = fixture.golden_case("fp64", case.name, ["logits"])["logits"]
        assert np.abs(logits - golden).max() <= 1e-12 * max(1.0, float(np.abs(golden).max())), case.name
    report = run_parity(fixture, [_backend("numpy"), _backend("hf-transformers"), _backend("transformerlens")],
                        progress=None)
    assert report.passed, [r for r in report.results if r.passed is False][:3]
