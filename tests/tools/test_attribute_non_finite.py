"""`parity attribute` with a layer that returns NaN: a disagreement naming the layer (exit 1), never exit 0.

As in `parity run`, where a NaN fails its cell, a NaN or an infinity in a layer run on its own (or in the free
run) where the fp64 golden is finite decides the verdict whatever the free run's logits say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

from parity_harness._backends.base import Precision
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.pytorch_backend import PyTorchBackend
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.attribute import attribute
from tests.helpers import TOY, cli_with_backends

pytest.importorskip("torch")


class NanMlp(PyTorchBackend):
    """pytorch, except block 1's MLP, run on its own, returns NaN in every cell of its output (the free run is
    honest, so the logits meet the target)."""

    name: ClassVar[str] = "nan-mlp"

    def run_layer(self, fixture: Fixture, precision: Precision, layer: str, stream: np.ndarray) -> dict[str, Any]:
        out = super().run_layer(fixture, precision, layer, stream)
        if layer == "blocks.1.mlp":
            out["blocks.1.hook_mlp_out"] = np.full_like(out["blocks.1.hook_mlp_out"], np.nan)
            out["blocks.1.hook_resid_post"] = np.full_like(out["blocks.1.hook_resid_post"], np.nan)
        return out


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    return cli_with_backends(monkeypatch, capsys, __name__, [NanMlp])


def test_a_nan_layer_is_a_disagreement_naming_the_layer() -> None:
    result = attribute(load_fixture(TOY), GuardedBackend.wrap(NanMlp()), "bf16")
    assert result.free_logits <= result.target  # the free run alone would pass
    assert result.verdict == Verdict.DISAGREE
    assert result.non_finite and all(w.startswith("blocks.1.mlp") for w in result.non_finite)


def test_the_cli_exits_1_and_names_the_layer(cli: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = cli("attribute", "--backend", "nan-mlp", "--precision", "bf16", "--fixture", str(TOY))
    assert code == 1, (out, err)
    last = out.strip().splitlines()[-1]
    assert last.startswith("DISAGREE: not finite") and "blocks.1.mlp: blocks.1.hook_mlp_out" in last


def test_an_honest_backend_still_agrees(cli: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = cli("attribute", "--backend", "pytorch", "--precision", "bf16", "--fixture", str(TOY))
    assert code == 0, (out, err)
    assert "not finite" not in out
