"""`parity attribute`: per-layer fp16/bf16 error, teacher-forced, and the fp32 set it recommends.

Every test can fail: a planted bug in one sub-layer must be named as that block's dominant sub-layer and
leave the blocks before it untouched (teacher forcing); a mixed-precision test backend that keeps the
recommended layer in fp32 must bring the logits error down to the prediction; a layer output off the
fp16 grid must be refused at the boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from parity_harness._backends.base import Backend, BackendOutput, Precision, layer_names
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.pytorch_backend import PyTorchBackend
from parity_harness._backends.registry import load_backend
from parity_harness._core.errors import BackendMisbehaved, ParityError
from parity_harness._core.precision import EPS
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.attribute import attribute, format_attribution
from tests.helpers import REPO, run_cli

STRESS = REPO / "fixtures" / "toy-stress"


def mixed_logits(fixture: Fixture, kept: list[str], tokens: list[int]) -> np.ndarray:
    """The reference model in fp16 except the layers `kept` (layer_names) in fp32: logits [T, V] in float64."""
    import torch

    from parity_reference import model
    from parity_reference.run import torch_params

    weights, c = fixture.weights(), fixture.config
    p16, p32 = torch_params(weights, "fp16"), torch_params(weights, "fp32")
    t = torch.tensor(tokens)
    with torch.no_grad():
        pos = (p16["wpe.weight"][: len(tokens)] if c.positions == "learned"
               else model.sinusoidal_positions(len(tokens), c.d_model, torch.float16))  # (T, d)
        x = p16["wte.weight"][t] + pos  # (T, d)
        for layer in layer_names(c.n_layer):
            p = p32 if layer in kept else p16
            x = x.to(p["wte.weight"].dtype)  # the stream enters each layer in that layer's precision
            if layer == "unembed":
                return np.asarray(model.unembed(x, p, c, None, "").double().numpy())  # (T, V)
            h = "h." + layer.split(".")[1] + "."
            if layer.endswith(".attn"):
                ln = model.layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], c.ln_eps, None, "")  # (T, d)
                x = x + model.attention(ln, p, h + "attn.", c, None, "")  # (T, d)
            else:
                ln = model.layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], c.ln_eps, None, "")  # (T, d)
                x = x + model.mlp(ln, p, h + "mlp.", c, None, "")  # (T, d)
    raise AssertionError("no unembed layer")


class KeepInFp32(Backend):
    """The test backend: pytorch in fp16 except `KEPT` in fp32. Its logits are not all fp16 values, so it
    declares fp32 (the container it returns); the test judges them in fp16 eps units."""

    name: ClassVar[str] = "keep-fp32"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    kept: ClassVar[list[str]] = []

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["logits"]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return {c.name: {"logits": mixed_logits(fixture, self.kept, list(c.tokens)).astype(np.float32)}
                for c in fixture.cases}


def logits_units(fixture: Fixture, kept: list[str]) -> float:
    """The test backend's logits error, in fp16 eps units against the float64 golden."""
    backend = GuardedBackend.wrap(type("Kept", (KeepInFp32,), {"kept": kept})())
    _, output = backend.outputs(fixture, "fp32")
    scale = EPS["fp16"] * fixture.tap_magnitudes()["logits"]
    return max(float(np.abs(output[c.name]["logits"].astype(np.float64)
                             - fixture.golden_case("fp64", c.name)["logits"]).max()) for c in fixture.cases) / scale


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attr") / "gpt2-mini"
    assert run_cli("export", "--preset", "gpt2-mini", "--fixture", str(root)).returncode == 0
    return root


# gpt2-mini's export (with its ONNX graphs) is tens of seconds: that case is in the full set (`nox -s full`).
@pytest.mark.parametrize("where", ["toy", pytest.param("mini", marks=pytest.mark.full)])
def test_keeping_the_dominant_layer_in_fp32_lowers_the_logits_error_as_predicted(
        where: str, toy_dir: Path, request: pytest.FixtureRequest) -> None:
    fixture = load_fixture(toy_dir if where == "toy" else request.getfixturevalue("mini"))
    result = attribute(fixture, load_backend("pytorch"), "fp16")
    before, after = logits_units(fixture, []), logits_units(fixture, [result.dominant])
    assert before == pytest.approx(result.free_logits, rel=1e-9)  # the test backend with nothing kept is pytorch fp16
    assert after < before  # keeping the dominant layer helps ...
    assert abs(after - result.dominant_kept) <= 0.25 * before  # ... by what the per-layer numbers predicted
    print(f"{where}: dominant {result.dominant}: logits {before:.3g} -> {after:.3g} units "
          f"(predicted {result.dominant_kept:.3g})")


def test_the_recommendation_meets_a_tight_target_on_the_toy(toy_dir: Path) -> None:
    fixture = load_fixture(toy_dir)
    result = attribute(fixture, load_backend("pytorch"), "fp16", target=2.0)
    assert result.verdict == Verdict.DISAGREE and result.kept  # the free run misses 2 units
    assert result.kept_predicted <= 2.0
    assert logits_units(fixture, result.kept) <= 2.0 * 1.25


class BuggyMlp(PyTorchBackend):
    """pytorch, except block 1's MLP output is 1% too large in fp16 (the free run and run_layer alike)."""

    def run_layer(self, fixture: Fixture, precision: Precision, layer: str, stream: np.ndarray) -> dict[str, Any]:
        out = super().run_layer(fixture, precision, layer, stream)
        if layer == "blocks.1.mlp":
            mlp = (out["blocks.1.hook_mlp_out"] * np.float32(1.01)).astype(np.float16).astype(np.float32)
            out["blocks.1.hook_mlp_out"] = mlp
            out["blocks.1.hook_resid_post"] = (stream + mlp).astype(np.float16).astype(np.float32)
        return out


def test_a_planted_sublayer_bug_is_introduced_where_it_is_and_inherited_after(toy_dir: Path) -> None:
    fixture = load_fixture(toy_dir)
    honest = attribute(fixture, load_backend("pytorch"), "fp16")
    buggy = attribute(fixture, GuardedBackend.wrap(BuggyMlp()), "fp16")
    assert buggy.rows[0].introduced == honest.rows[0].introduced  # teacher-forced: block 0 is untouched
    assert buggy.rows[1].mlp > 5 * honest.rows[1].mlp
    assert buggy.rows[1].dominant == "MLP"
    assert buggy.dominant == "blocks.1.mlp"
    assert any("blocks.1.mlp" in line for line in format_attribution(buggy))


class OffGrid(PyTorchBackend):
    def run_layer(self, fixture: Fixture, precision: Precision, layer: str, stream: np.ndarray) -> dict[str, Any]:
        out = super().run_layer(fixture, precision, layer, stream)
        out[f"{layer}.ln1.hook_scale" if layer.endswith("attn") else "logits"] = (
            np.full_like(next(iter(out.values()))[..., :1], 1.0001, dtype=np.float32))
        return out


def test_run_layer_results_are_checked_at_the_boundary(toy_dir: Path) -> None:
    fixture = load_fixture(toy_dir)
    with pytest.raises(BackendMisbehaved, match=r"expected exactly|not a fp16 value|expected float32"):
        attribute(fixture, GuardedBackend.wrap(OffGrid()), "fp16")


def test_the_stress_fixture_says_the_stream_is_not_representable() -> None:
    result = attribute(load_fixture(STRESS), load_backend("pytorch"), "fp16")
    assert result.verdict == Verdict.DISAGREE
    assert any("not representable in fp16" in n for n in result.notes)
    assert result.free_logits > 32


def test_cli_prints_the_table_and_refuses_bad_input(toy_dir: Path) -> None:
    ok = run_cli("attribute", "--backend", "pytorch", "--precision", "bf16", "--fixture", str(toy_dir))
    assert ok.returncode == 0, ok.stderr
    assert "dominant layer:" in ok.stdout and "recommendation:" in ok.stdout
    bad = run_cli("attribute", "--backend", "numpy", "--precision", "bf16", "--fixture", str(toy_dir))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    with pytest.raises(ParityError, match="--target"):
        attribute(load_fixture(toy_dir), load_backend("pytorch"), "fp16", target=-1.0)
