"""`parity export --preset NAME`: a GPT-2-shaped fixture from deterministic random weights, not committed.

`gpt2-small` is GPT-2 small's shape (V 50,257, context 1,024, d 768, 12 blocks of 12 heads, learned positions,
tied embeddings, 124,439,808 parameters); `gpt2-mini` the same code path at toy size, for CI;
`gpt2-mini-gelu-new` gpt2-mini with GPT-2's own activation, the tanh `gelu_new` (config `activation`). Weights
follow GPT-2's initialization (normal, std 0.02; the residual output projections `attn.c_proj` and
`mlp.c_proj` std 0.02 / sqrt(2 n_layer); biases 0, LayerNorm gain 1, bias 0), drawn from numpy's PCG64 with
the seed, so a seed names one fixture on every platform.

What makes it scale (docs/tolerances.md, docs/fixture-format.md):
- `probs` and every `logit_lens.k` are [T, V]; the golden keeps only their last `LENS_ROWS`
  positions (the manifest's per-tap `rows`), and every built-in backend computes only those;
- tolerances are per tap, `atol = c * eps * M_tap` (M_tap = max |golden| of the tap over the cases,
  in that tier's golden), written into the manifest's overrides, `c` measured on gpt2-small (a preset measured
  on its own has its own: `Preset.c`).

`fp16-probe` is where the selftest's reduced-precision mutants are caught (docs/selftest.md): a large,
flat vocabulary (V 4,096: probabilities ~ 1/4,096, the sum of a softmax ~ 4,096, past where a running
fp16 sum stagnates) and two outlier dims of the residual stream, +-`PROBE_OUTLIER` at every position,
put in the learned position table (`Preset.outlier`, `preset_weights`: the tied logits read wte, not wpe), so that each
LayerNorm's centered squares are 40,000 (under fp16's 65,504) and their running fp16 sum is not.
Honest fp16 and bf16 pass it (docs/tolerances.md). Not committed: the selftest makes it in a
temporary directory (`make_probe_fixture`, seeded: the same on every machine, without ONNX graphs).

Another family's presets are its authoring module's (`PRESETS`, and `COMMITTED_PRESETS` for its committed toy:
`_authoring/llama_family.py` for the Llama family), gathered into `PRESETS` and `committed_presets()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from parity_harness._authoring import fp16_stress
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import TIERS, Precision
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Case
from parity_harness._fixture.model_spec import DEFAULT_FAMILY, model_spec
from parity_reference.config import GPT2_SMALL, GPTConfig, param_shapes
from parity_reference.families import family_names, family_of, load_family

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

EPS: dict[Precision, float] = {"fp32": float(np.finfo(np.float32).eps), "fp64": float(np.finfo(np.float64).eps)}
# c in atol = c * eps * M_tap, per tier: measured on gpt2-small (every built-in backend against the
# goldens, in eps * M_tap units; the table and the headroom are in docs/tolerances.md).
SCALED_C: dict[Precision, float] = {"fp32": 64.0, "fp64": 512.0}
LENS_ROWS = 4  # the last positions kept of probs and of every logit_lens.k ([T, V] taps)
INIT_STD = 0.02  # GPT-2's initialization

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Preset:
    name: str
    config: ModelConfig
    lengths: tuple[int, ...]  # one case per length: 1 token, a short one, a long one
    long_length: int  # the extra case of --long (the full context)
    what: str
    outlier: float = 0.0  # +this on wpe's dim 0 and -this on dim 1, at every position (fp16-probe: PROBE_OUTLIER)
    c: Mapping[Precision, float] | None = None  # the per-tap rule's c measured on this preset (None: gpt2-small's)
    build: Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]] | None = None  # (GPT-2 init, seed) -> own
    note: str = ""  # the provenance's "weights" line when `build` makes them

    @property
    def family(self) -> str:
        return family_of(self.config).name


@dataclass(frozen=True)
class CommittedPreset:
    """A preset whose fixture is committed (a family's toy): written and checked by its family's own code."""

    directory: str  # where it is committed: beside the toy (fixtures/NAME)
    export: Callable[..., None]  # (root, seed=, progress=)
    check: Callable[..., Verdict]  # (root, progress=)
    what: str


PROBE_OUTLIER = 200.0  # fp16-probe: wpe dim 0 gets +200, dim 1 -200 at every position
GPT2_MINI = GPTConfig(vocab_size=96, n_ctx=32, d_model=16, n_layer=8, n_head=2, d_mlp=64, positions="learned")

class _AllPresets(Mapping[str, Preset]):
    """GPT-2's presets, then each other family's (its authoring module's `PRESETS`), gathered when first read (a
    family's module imports this one)."""

    def __init__(self, own: dict[str, Preset]) -> None:
        self._own = own
        self._all: dict[str, Preset] | None = None

    def _table(self) -> dict[str, Preset]:
        if self._all is None:
            table = dict(self._own)
            for name in family_names():
                if name != DEFAULT_FAMILY:
                    table.update(getattr(load_family(name).module("authoring"), "PRESETS", {}))
            self._all = table
        return self._all

    def __getitem__(self, name: str) -> Preset:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


PRESETS: Mapping[str, Preset] = _AllPresets({
    "gpt2-small": Preset("gpt2-small", GPT2_SMALL, (1, 16, 128), 1024,
                         "GPT-2 small's shape: V 50,257, context 1,024, d 768, 12 blocks of 12 heads"),
    "gpt2-mini": Preset("gpt2-mini", GPT2_MINI, (1, 5, 24), 32, "the same code path at toy size (8 blocks), for CI"),
    "gpt2-mini-gelu-new": Preset("gpt2-mini-gelu-new", replace(GPT2_MINI, activation="gelu_new"), (1, 5, 24), 32,
                                 "gpt2-mini with GPT-2's own activation, the tanh gelu_new (as a real GPT-2 "
                                 "checkpoint imports)"),
    "fp16-probe": Preset("fp16-probe",
                         GPTConfig(vocab_size=4096, n_ctx=16, d_model=16, n_layer=2, n_head=2, d_mlp=64,
                                   positions="learned"),
                         (1, 5, 16), 16, "a flat vocabulary of 4,096 and +-200 outlier dims: where fp16 "
                                         "accumulation bugs show (the selftest's reduced mutants)",
                         outlier=PROBE_OUTLIER),
    fp16_stress.PRESET: Preset(fp16_stress.PRESET, fp16_stress.CONFIG, fp16_stress.LENGTHS, 16, fp16_stress.WHAT,
                               build=fp16_stress.stress_weights, note=fp16_stress.WEIGHTS_NOTE),
})


def init_weights(config: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialization, deterministic for a seed: float32 under Hugging Face names."""
    rng = np.random.Generator(np.random.PCG64(seed))
    residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
    weights: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(config).items():
        if name.endswith(("ln_1.weight", "ln_2.weight")) or name == "ln_f.weight":
            weights[name] = np.ones(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            weights[name] = np.zeros(shape, dtype=np.float32)
        else:
            std = residual_std if name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")) else INIT_STD
            weights[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return weights


def preset_weights(preset: Preset, seed: int) -> dict[str, np.ndarray]:
    """A preset's weights: GPT-2's initialization, then +-`preset.outlier` on wpe's dims 0 and 1 (every row);
    another family's preset: its authoring module's `init_weights`."""
    if preset.family != DEFAULT_FAMILY:
        weights: dict[str, np.ndarray] = family_of(preset.config).module("authoring").init_weights(preset.config, seed)
        return weights
    weights = init_weights(cast(GPTConfig, preset.config), seed)
    if preset.build is not None:  # fp16-stress: GPT-2's initialization changed by its authoring module
        return preset.build(weights, seed)
    if preset.outlier:
        weights["wpe.weight"][:, 0] += np.float32(preset.outlier)  # (n_ctx,)
        weights["wpe.weight"][:, 1] -= np.float32(preset.outlier)  # (n_ctx,)
    return weights


def make_probe_fixture(root: Path, seed: int = 0) -> None:
    """`parity export --preset fp16-probe --seed N`, quietly and without the ONNX graphs (the selftest's probe)."""
    export_preset(root, "fp16-probe", seed=seed, progress=lambda _message: None, with_onnx=False)


def make_cases(config: ModelConfig, lengths: Sequence[int], seed: int) -> list[Case]:
    """One case of random token ids per length (clipped to the context), named by its length."""
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    cases: list[Case] = []
    for n in dict.fromkeys(min(n, config.n_ctx) for n in lengths):
        tokens = tuple(int(t) for t in rng.integers(0, config.vocab_size, size=n))
        kind = "single" if n == 1 else "longest" if n == config.n_ctx else "random"
        cases.append(Case(f"random_{n}" if n > 1 else "single_token", tokens, kind))
    return cases


def lens_tap_rows(config: ModelConfig, rows: int = LENS_ROWS, family: str = "gpt2") -> dict[str, int]:
    """The taps whose golden keeps only the last `rows` positions: probs and every logit_lens.k."""
    return {t: rows for t in model_spec(family, config).tap_names() if t == "probs" or t.startswith("logit_lens.")}


def scaled_c(preset: str | None = None) -> Mapping[Precision, float]:
    """c of the per-tap rule for a preset: its own (`Preset.c`) if measured, else gpt2-small's (`SCALED_C`)."""
    found = PRESETS.get(preset or "")
    return found.c if found is not None and found.c is not None else SCALED_C


def scaled_tolerances(goldens: Mapping[Precision, Mapping[str, Mapping[str, np.ndarray]]],
                      taps: Sequence[str], c: Mapping[Precision, float] = SCALED_C) -> dict[str, Any]:
    """Both tiers' tolerances: the toy's defaults, and a per-tap override atol = c * eps * M_tap (rtol 0)."""
    from parity_harness._authoring.fixture_writer import default_tolerances
    from parity_harness._fixture.tolerances import tap_magnitude

    tolerances = default_tolerances()
    for precision in TIERS:
        overrides: dict[str, dict[str, float]] = {}
        for tap in taps:
            magnitude = tap_magnitude(case_taps[tap] for case_taps in goldens[precision].values())
            atol = c[precision] * EPS[precision] * max(magnitude, float(np.finfo(np.float32).tiny))
            overrides[tap] = {"atol": float(f"{atol:.3e}"), "rtol": 0.0}
        tolerances[precision]["overrides"] = overrides
    return tolerances


def write_scaled_fixture(root: Path, config: ModelConfig, weights: dict[str, np.ndarray],
                         cases: list[Case], vocab: Sequence[str], provenance: Mapping[str, Any], progress: Progress,
                         with_onnx: bool = True, family: str = "gpt2",
                         c: Mapping[Precision, float] = SCALED_C) -> None:
    """Goldens of both tiers (probs and the lens on the last LENS_ROWS positions), scaled tolerances,
    the ONNX graphs, hashed and sealed by the one fixture writer: built beside `root`, checked, and
    swapped in (parity_harness/_core/safe_write.py). `root` must be new or empty (or a fixture of the same kind
    holding only its own files): checked before the work. `c`: the per-tap rule's (`scaled_c`)."""
    import torch

    from parity_harness._authoring.decoding_writer import family_forward
    from parity_harness._authoring.fixture_writer import fixture_kind, owned_entries, write_fixture_files
    from parity_harness._core.safe_write import replace_directory, staging_directory
    from parity_harness._fixture.fixture import load_fixture
    from parity_reference.run import reference_taps

    kind = fixture_kind({"provenance": provenance}) or "scaled"
    owned_entries(root, kind)
    rows = lens_tap_rows(config, family=family)
    run_with_taps, _ = family_forward(family)
    goldens: dict[Precision, Any] = {}
    for precision in TIERS:
        lengths = ", ".join(str(len(c.tokens)) for c in cases)
        progress(f"golden {precision} taps for {len(cases)} cases (lengths {lengths})")
        goldens[precision] = reference_taps(weights, config, cases, precision, run_with_taps,  # type: ignore[arg-type]
                                            lens_rows=LENS_ROWS)
    with staging_directory(root) as staging:
        write_fixture_files(
            staging, config=config, vocab=vocab, cases=cases, weights=weights, golden=goldens, onnx=with_onnx,
            provenance={"torch": torch.__version__.split("+")[0], **provenance,
                        "tolerances": f"per tap: atol = c * eps * M_tap, c = {c['fp32']:g} (fp32), "
                                      f"{c['fp64']:g} (fp64); docs/tolerances.md"},
            tolerances=scaled_tolerances(goldens, model_spec(family, config).tap_names(), c), tap_rows=rows,
            lens_rows=LENS_ROWS, progress=progress, family=family,
        )
        load_fixture(staging)  # validate what was written before putting it in place
        replace_directory(staging, root, owned_entries(root, kind))


def export_preset(root: Path, name: str, seed: int = 0, long: bool = False, progress: Progress = print,
                  with_onnx: bool = True) -> None:
    """`parity export --preset NAME --fixture DIR [--seed N] [--long]`; ParityError (exit 2) naming the known presets
    for any other name, whichever surface asked."""
    from parity_harness._fixture.platforms import current_platform

    if name not in PRESETS:
        raise ParityError(f"unknown preset {name!r} (known: {', '.join(preset_names())})")
    preset = PRESETS[name]
    say: Progress = lambda message: progress(f"parity export: {message}")  # noqa: E731
    say(f"preset {name} ({preset.what}), seed {seed}")
    weights = preset_weights(preset, seed)
    lengths = (*preset.lengths, preset.long_length) if long else preset.lengths
    cases = make_cases(preset.config, lengths, seed)
    vocab = [f"<{i}>" for i in range(preset.config.vocab_size)]
    write_scaled_fixture(root, preset.config, weights, cases, vocab, {
        "preset": name, "seed": seed, "command": f"parity export --preset {name} --seed {seed}"
                                                 + (" --long" if long else ""),
        "weights": (family_of(preset.config).module("authoring").WEIGHTS_NOTE if preset.family != DEFAULT_FAMILY else
                    preset.note if preset.note else
                    "parity_harness._authoring.presets.init_weights: N(0, 0.02), residual projections "
                    "0.02/sqrt(2 n_layer), PCG64(seed)" + (f"; wpe dims 0, 1 +-{preset.outlier:g} (preset_weights)"
                                                           if preset.outlier else "")),
        "platform": current_platform(),
    }, say, with_onnx, preset.family, scaled_c(name))


def committed_presets() -> dict[str, CommittedPreset]:
    """Every family's committed toy besides GPT-2's (`toy`, `toy-stress`: export.py, stress.py), by preset name:
    each family's authoring module's `COMMITTED_PRESETS`."""
    found: dict[str, CommittedPreset] = {}
    for name in family_names():
        found.update(getattr(load_family(name).module("authoring"), "COMMITTED_PRESETS", {}))
    return found


def preset_names() -> list[str]:
    """Every name `parity export --preset` takes: the toy, the stress fixture, each family's committed toy, then
    the generated presets (`PRESETS`)."""
    return ["toy", "toy-stress", *committed_presets(), *PRESETS]


__all__ = ["PRESETS", "SCALED_C", "CommittedPreset", "Preset", "committed_presets", "export_preset", "init_weights",
           "make_probe_fixture", "preset_names", "preset_weights", "scaled_c", "scaled_tolerances",
           "write_scaled_fixture"]
