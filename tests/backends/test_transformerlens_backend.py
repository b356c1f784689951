"""The `transformerlens` backend: TransformerLens' HookedTransformer agrees with the golden on every tap.

- registered in pyproject.toml under its name, and run through the normal API by that name;
- passes fixtures/toy in fp32 and fp64, every tap compared (none "not supported"), in all three tiers;
- passes a generated gpt2-mini (learned positions, 8 blocks, per-tap tolerances) and a non-causal
  fixture with learned positions and another ln_eps (the config is read, not assumed);
- its float64 is float64: the loaded W_pos is the float64 sinusoid table, bit for bit; and the trap it
  avoids is real: TransformerLens' own `load_and_process_state_dict`, every processing flag off, rounds
  the float64 table through float32, which the fp64 tier catches at `hook_pos_embed`;
- passes `check-backend`'s contract (T = 1 and n_ctx, bad input is one line).

Where transformer_lens is not installed every test skips with the reason; PARITY_REQUIRE_ALL_BACKENDS=1
(CI) turns those skips into failures (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import parity_harness._backends.registry
from parity_harness import api
from parity_harness._backends.base import module_available
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_reference.config import TOY
from tests.helpers import REPO, build_random_fixture

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

NAME = "transformerlens"
TARGET = "parity_harness._backends.transformerlens_backend:TransformerLensBackend"


def _require() -> None:
    for module in ("torch", "transformer_lens"):
        if not module_available(module):
            pytest.skip(f"{module} is not installed: pip install 'parity-harness[transformerlens]'")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend findable by name, as pyproject.toml registers it (also where the installed metadata predates it)."""
    _require()
    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["parity.backends"]
    assert eps[NAME] == TARGET
    real = parity_harness._backends.registry.backend_entry_points()
    with_it = dict(sorted({**real, NAME: EntryPoint(NAME, TARGET, parity_harness._backends.registry.GROUP)}.items()))
    monkeypatch.setattr(parity_harness._backends.registry, "backend_entry_points", lambda: with_it)


def _assert_passes_every_tap(fixture: Fixture) -> None:
    report = api.run(NAME, fixture, "all", decoding=False)
    failed = [(r.precision, r.golden, r.case, r.tap, r.max_abs, r.atol) for r in report.results if r.passed is False]
    assert report.passed, failed[:5]
    assert {(r.backend, r.precision, r.status) for r in report.runs} == {(NAME, "fp32", "ran"), (NAME, "fp64", "ran")}
    tiers = {("fp32", "fp32"), ("fp64", "fp64"), ("fp64", "fp32")}
    assert {(r.precision, r.golden) for r in report.results} == tiers
    assert all(r.status == "ok" and r.passed for r in report.results)  # nothing "not supported"
    assert len(report.results) == len(tiers) * len(fixture.cases) * len(fixture.tap_names)


def test_passes_the_toy_in_fp32_and_fp64_on_every_tap(registered: None, toy_dir: Path) -> None:
    _assert_passes_every_tap(api.load(toy_dir))


def test_passes_a_generated_gpt2_mini(registered: None, gpt2_mini: Path) -> None:
    fixture = load_fixture(gpt2_mini)
    assert fixture.config.positions == "learned" and fixture.lens_rows() is not None
    _assert_passes_every_tap(fixture)


def test_passes_a_non_causal_fixture_with_learned_positions_and_its_own_eps(registered: None, tmp_path: Path) -> None:
    config = dataclasses.replace(TOY, causal=False, positions="learned", ln_eps=1e-3)
    fixture = load_fixture(build_random_fixture(tmp_path / "bidirectional", config, seed=4))
    _assert_passes_every_tap(fixture)


def test_float64_weights_stay_float64(toy_dir: Path) -> None:
    """Every parameter float64 and bit-for-bit the converted weights; W_pos the float64 sinusoid table."""
    _require()
    import torch

    from parity_harness._backends.transformerlens_backend import tl_model
    from parity_reference.model import sinusoidal_positions

    fixture = load_fixture(toy_dir)
    model = tl_model(dict(fixture.weights()), fixture.config, "fp64")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    table = sinusoidal_positions(fixture.config.n_ctx, fixture.config.d_model, torch.float64)
    w_pos = model.pos_embed.W_pos.detach()
    assert torch.equal(w_pos, table)
    assert not torch.equal(w_pos, table.float().double())  # a float32 rounding would show here
    # Tied embeddings, and the GPT-2 split of c_attn: W_Q of head 1 is columns d_head..2 d_head of c_attn.
    wte = torch.tensor(fixture.weights()["wte.weight"], dtype=torch.float64)
    assert torch.equal(model.unembed.W_U.detach(), wte.T) and torch.equal(model.embed.W_E.detach(), wte)
    c_attn = torch.tensor(fixture.weights()["h.0.attn.c_attn.weight"], dtype=torch.float64)
    dh = fixture.config.d_head
    assert torch.equal(model.blocks[0].attn.W_Q[1].detach(), c_attn[:, dh:2 * dh])


def test_a_parameter_copied_or_recast_while_loading_is_refused(toy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load check is real: a loader that copies instead of assigning (here: torch's own default, assign=False,
    into parameters made in float32) fails with the parameter's name."""
    _require()
    import torch

    from parity_harness._backends.transformerlens_backend import tl_model
    from parity_harness._core.errors import BackendFailed

    real = torch.nn.Module.load_state_dict

    def copying(self: torch.nn.Module, state: Any, strict: bool = True, assign: bool = False) -> Any:
        return real(self, state, strict=strict, assign=False)

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", copying)
    fixture = load_fixture(toy_dir)
    with pytest.raises(BackendFailed, match=r"^TransformerLens changed parameter '.+' while loading it"):
        tl_model(dict(fixture.weights()), fixture.config, "fp64")


def _processing_loader(weights: dict[str, np.ndarray], config: Any, precision: Any) -> Any:
    """TransformerLens' own loader, every processing flag off: what the backend deliberately does not use."""
    import torch

    from parity_harness._backends.quiet import silenced
    from parity_harness._backends.transformerlens_backend import tl_config, tl_state_dict

    dtype = torch.float32 if precision == "fp32" else torch.float64
    state = tl_state_dict(weights, config, dtype)
    with silenced():
        from transformer_lens import HookedTransformer

        model = HookedTransformer(tl_config(config, dtype))
        model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                          fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


def test_transformerlens_weight_processing_rounds_float64_through_float32_and_the_fp64_tier_catches_it(
    toy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding (docs/backends.md): with load_and_process_state_dict, float64 W_pos is float32 in disguise."""
    _require()
    import torch

    import parity_harness._backends.transformerlens_backend as tlb
    from parity_reference.model import sinusoidal_positions

    fixture = load_fixture(toy_dir)
    processed = _processing_loader(dict(fixture.weights()), fixture.config, "fp64")
    table = sinusoidal_positions(fixture.config.n_ctx, fixture.config.d_model, torch.float64)
    w_pos = processed.pos_embed.W_pos.detach()
    assert w_pos.dtype == torch.float64 and torch.equal(w_pos, table.float().double())

    class Processed(tlb.TransformerLensBackend):
        name: ClassVar[str] = "transformerlens-processed"

    monkeypatch.setattr(tlb, "tl_model", _processing_loader)
    report = api.run(Processed(), fixture, "fp64", decoding=False)
    assert not report.passed
    first = next(d for d in report.divergences if d.golden == "fp64")
    assert first.tap == "hook_pos_embed"
    # The fp32 tier cannot see it: the same run judged against golden.fp32 passes.
    assert all(r.passed for r in report.results if r.golden == "fp32")


def test_passes_check_backend(toy_dir: Path) -> None:
    """The contract every backend is held to: taps, shapes, dtypes, T = 1 and n_ctx, bad input is one line."""
    _require()
    from parity_harness._backends.transformerlens_backend import TransformerLensBackend
    from parity_harness._tools.conformance import check_backend

    results = check_backend(TransformerLensBackend(), load_fixture(toy_dir))
    assert [r.name for r in results if not r.passed] == []
    assert any(r.name.startswith("rejects a token id out of range") for r in results)


def test_the_unembedding_reads_the_token_table_in_place() -> None:
    """W_U is W_E transposed as a view: TransformerLens' Unembed takes `W_U.T.contiguous()` on every call, which
    copied the whole (V, d) table each time while W_U was a contiguous (d, V) copy (~8 s of a GPT-2 fp64 run)."""
    import torch

    from parity_harness._backends.transformerlens_backend import tl_model
    from parity_harness._fixture.fixture import default_fixture_dir, load_fixture

    fixture = load_fixture(default_fixture_dir())
    model = tl_model(fixture.weights(), fixture.config, "fp64")
    w_u = model.unembed.W_U
    assert w_u.T.is_contiguous()  # so .contiguous() returns it, no copy
    assert w_u.data_ptr() == model.embed.W_E.data_ptr()  # one table, tied
    assert torch.equal(w_u.T.contiguous(), model.embed.W_E.detach())
