"""The first divergence down to the aten op for a PyTorch forward (parity_harness/_backends/torch_ops.py): recorded
by a TorchDispatchMode, the model unchanged.

- a patched copy of model.py with LayerNorm's eps 1e-3 is placed at the `add` of 0.001 inside
  blocks.0.ln1.hook_scale, against the reference's own forward;
- a copy without the causal mask agrees op for op with the reference up to the scores: it lacks an op;
- an op whose output is off its float64 recomputation is named as the kernel (its output altered after the run);
- the pytorch backend, the reference itself, finds no kernel off on the toy.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from parity_harness._fixture.fixture import load_fixture
from tests.helpers import REPO

torch = pytest.importorskip("torch", reason="the torch extra is not installed (PARITY_REQUIRE_ALL_BACKENDS=1 fails)")
pytestmark = pytest.mark.full  # two recorded forwards per test, ~30 s for the module on a busy machine: CI's full set

from parity_harness._backends.torch_ops import locate, locate_in_forward, record  # noqa: E402
from parity_reference import model  # noqa: E402
from parity_reference.run import torch_params  # noqa: E402

TOY = load_fixture(REPO / "fixtures" / "toy")
PARAMS = torch_params(TOY.weights(), "fp32")
TOKENS = list(TOY.cases[1].tokens)


def _patched(old: str, new: str) -> types.ModuleType:
    source = Path(model.__file__).read_text(encoding="utf-8")
    assert old in source, f"anchor {old!r} not in model.py"
    module = types.ModuleType("patched_model")
    exec(compile(source.replace(old, new), "patched_model.py", "exec"), module.__dict__)
    return module


def _forward(module: Any) -> Any:
    return lambda: module.run_with_taps(PARAMS, TOY.config, TOKENS)


def test_a_changed_eps_is_placed_at_the_add_of_its_constant() -> None:
    patched = _patched("torch.sqrt(var + eps)", "torch.sqrt(var + 1e-3)")
    where = locate_in_forward(_forward(patched), _forward(model), TOY.tap_names, "blocks.0.ln1.hook_scale")
    assert where is not None and "add.Tensor([7, 1], 0.001)" in where, where
    assert "the model departs from the reference there" in where


def test_a_missing_mask_agrees_op_for_op_and_lacks_one() -> None:
    source = Path(model.__file__).read_text(encoding="utf-8")
    line = next(ln for ln in source.splitlines() if "masked_fill" in ln)
    patched = _patched(line, line.split("=", 1)[0] + "= scores" if "=" in line else line)
    where = locate_in_forward(_forward(patched), _forward(model), TOY.tap_names, "blocks.0.attn.hook_attn_scores")
    assert where is not None and "the model lacks one it has" in where, where


def test_an_op_off_its_float64_recomputation_is_named_as_the_kernel() -> None:
    ops, taps = record(_forward(model))
    sqrt = next(op for op in ops if op.name.startswith("sqrt"))
    sqrt.outputs[0].mul_(1.001)  # as a sqrt kernel 0.1% off would have computed it
    where = locate(ops, taps, None, TOY.tap_names, "blocks.0.ln1.hook_scale")
    assert where is not None and where.startswith("aten op sqrt") and "the kernel" in where, where


def test_the_pytorch_backend_finds_no_kernel_off_on_the_toy() -> None:
    from parity_harness._backends.pytorch_backend import PyTorchBackend

    assert PyTorchBackend().locate_op(TOY.for_backend(), "fp32", TOY.cases[1].name, "blocks.1.mlp.hook_post") is None
