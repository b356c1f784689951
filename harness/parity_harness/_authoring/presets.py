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
  in that tier's golden), written into the manifest's overrides, `c` measured on gpt2-small.

`fp16-probe` is where the selftest's reduced-precision mutants are caught (docs/selftest.md): a large,
flat vocabulary (V 4,096: probabilities ~ 1/4,096, the sum of a softmax ~ 4,096, past where a running
fp16 sum stagnates) and two outlier dims of the residual stream, +-`PROBE_OUTLIER` at every position,
put in the learned position table (`Preset.outlier`, `preset_weights`: the tied logits read wte, not wpe), so that each
LayerNorm's centered squares are 40,000 (under fp16's 65,504) and their running fp16 sum is not.
Honest fp16 and bf16 pass it (docs/tolerances.md). Not committed: the selftest makes it in a
temporary directory (`make_probe_fixture`, seeded: the same on every machine, without ONNX graphs).

The Llama family (manifest "family": "llama", parity_reference/llama_model.py computes the goldens):
`toy-llama` is committed as fixtures/toy-llama (`export_toy_llama`, checked by `check_toy_llama`): d 16, 2
blocks of 4 query heads sharing 2 key/value heads, d_mlp 32, untied, half pairing, weights
`llama_model.init_params(config, seed)`, the toy's vocabulary, cases and decoding prompts, the toy's default
tolerances, its ONNX graphs (`export_onnx_for`). `llama-mini` (toy size, 8 blocks) and `llama-small` (d 768,
12 blocks of 12 heads sharing 4 key/value heads, d_mlp 2,048, V 32,000 random tokens) are made like
gpt2-mini/gpt2-small:
random cases, probs and the lens on the last LENS_ROWS positions, scaled tolerances (c as measured on
gpt2-small), not committed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import TIERS, Precision
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Case
from parity_harness._fixture.model_spec import model_spec
from parity_reference.config import GPT2_SMALL, GPTConfig, param_shapes
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig

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
    config: GPTConfig | LlamaConfig
    lengths: tuple[int, ...]  # one case per length: 1 token, a short one, a long one
    long_length: int  # the extra case of --long (the full context)
    what: str
    outlier: float = 0.0  # +this on wpe's dim 0 and -this on dim 1, at every position (fp16-probe: PROBE_OUTLIER)

    @property
    def family(self) -> str:
        return "llama" if isinstance(self.config, LlamaConfig) else "gpt2"


PROBE_OUTLIER = 200.0  # fp16-probe: wpe dim 0 gets +200, dim 1 -200 at every position
GPT2_MINI = GPTConfig(vocab_size=96, n_ctx=32, d_model=16, n_layer=8, n_head=2, d_mlp=64, positions="learned")

PRESETS: dict[str, Preset] = {
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
    "llama-mini": Preset("llama-mini",
                         LlamaConfig(vocab_size=96, n_ctx=32, d_model=16, n_layer=8, n_head=4, n_kv_heads=2, d_mlp=64),
                         (1, 5, 24), 32, "the Llama family at toy size (8 blocks, grouped-query attention), for CI"),
    "llama-small": Preset("llama-small",
                          LlamaConfig(vocab_size=32000, n_ctx=1024, d_model=768, n_layer=12, n_head=12, n_kv_heads=4,
                                      d_mlp=2048),
                          (1, 16, 128), 1024, "a Llama of about 100 M parameters: V 32,000, d 768, 12 blocks of 12 "
                                              "query heads sharing 4 key/value heads, d_mlp 2,048"),
}
TOY_LLAMA_PRESET = "toy-llama"  # the committed fixtures/toy-llama (export_toy_llama), not in PRESETS


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


def llama_weights(config: LlamaConfig, seed: int) -> dict[str, np.ndarray]:
    """`llama_model.init_params(config, seed)` as float32 arrays under Hugging Face names (torch's generator)."""
    from parity_reference import llama_model

    return {k: v.numpy().copy() for k, v in llama_model.init_params(config, seed).items()}


def preset_weights(preset: Preset, seed: int) -> dict[str, np.ndarray]:
    """A preset's weights: GPT-2's initialization, then +-`preset.outlier` on wpe's dims 0 and 1 (every row);
    a Llama preset's `llama_weights`."""
    if isinstance(preset.config, LlamaConfig):
        return llama_weights(preset.config, seed)
    weights = init_weights(preset.config, seed)
    if preset.outlier:
        weights["wpe.weight"][:, 0] += np.float32(preset.outlier)  # (n_ctx,)
        weights["wpe.weight"][:, 1] -= np.float32(preset.outlier)  # (n_ctx,)
    return weights


def make_probe_fixture(root: Path, seed: int = 0) -> None:
    """`parity export --preset fp16-probe --seed N`, quietly and without the ONNX graphs (the selftest's probe)."""
    export_preset(root, "fp16-probe", seed=seed, progress=lambda _message: None, with_onnx=False)


def make_cases(config: GPTConfig | LlamaConfig, lengths: Sequence[int], seed: int) -> list[Case]:
    """One case of random token ids per length (clipped to the context), named by its length."""
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    cases: list[Case] = []
    for n in dict.fromkeys(min(n, config.n_ctx) for n in lengths):
        tokens = tuple(int(t) for t in rng.integers(0, config.vocab_size, size=n))
        kind = "single" if n == 1 else "longest" if n == config.n_ctx else "random"
        cases.append(Case(f"random_{n}" if n > 1 else "single_token", tokens, kind))
    return cases


def lens_tap_rows(config: GPTConfig | LlamaConfig, rows: int = LENS_ROWS, family: str = "gpt2") -> dict[str, int]:
    """The taps whose golden keeps only the last `rows` positions: probs and every logit_lens.k."""
    return {t: rows for t in model_spec(family, config).tap_names() if t == "probs" or t.startswith("logit_lens.")}


def scaled_tolerances(goldens: Mapping[Precision, Mapping[str, Mapping[str, np.ndarray]]],
                      taps: Sequence[str]) -> dict[str, Any]:
    """Both tiers' tolerances: the toy's defaults, and a per-tap override atol = c * eps * M_tap (rtol 0)."""
    from parity_harness._authoring.fixture_writer import default_tolerances
    from parity_harness._fixture.tolerances import tap_magnitude

    tolerances = default_tolerances()
    for precision in TIERS:
        overrides: dict[str, dict[str, float]] = {}
        for tap in taps:
            magnitude = tap_magnitude(case_taps[tap] for case_taps in goldens[precision].values())
            atol = SCALED_C[precision] * EPS[precision] * max(magnitude, float(np.finfo(np.float32).tiny))
            overrides[tap] = {"atol": float(f"{atol:.3e}"), "rtol": 0.0}
        tolerances[precision]["overrides"] = overrides
    return tolerances


def write_scaled_fixture(root: Path, config: GPTConfig | LlamaConfig, weights: dict[str, np.ndarray],
                         cases: list[Case], vocab: Sequence[str], provenance: Mapping[str, Any], progress: Progress,
                         with_onnx: bool = True, family: str = "gpt2") -> None:
    """Goldens of both tiers (probs and the lens on the last LENS_ROWS positions), scaled tolerances,
    the ONNX graphs, hashed and sealed by the one fixture writer: built beside `root`, checked, and
    swapped in (parity_harness/_core/safe_write.py). `root` must be new or empty (or a fixture of the same kind
    holding only its own files): checked before the work."""
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
                        "tolerances": f"per tap: atol = c * eps * M_tap, c = {SCALED_C['fp32']:g} (fp32), "
                                      f"{SCALED_C['fp64']:g} (fp64); docs/tolerances.md"},
            tolerances=scaled_tolerances(goldens, model_spec(family, config).tap_names()), tap_rows=rows,
            lens_rows=LENS_ROWS, progress=progress, family=family,
        )
        load_fixture(staging)  # validate what was written before putting it in place
        replace_directory(staging, root, owned_entries(root, kind))


def export_preset(root: Path, name: str, seed: int = 0, long: bool = False, progress: Progress = print,
                  with_onnx: bool = True) -> None:
    """`parity export --preset NAME --fixture DIR [--seed N] [--long]`."""
    from parity_harness._fixture.platforms import current_platform

    preset = PRESETS[name]
    say: Progress = lambda message: progress(f"parity export: {message}")  # noqa: E731
    say(f"preset {name} ({preset.what}), seed {seed}")
    if preset.family == "llama":
        with_onnx = False  # no Llama ONNX export yet
    weights = preset_weights(preset, seed)
    lengths = (*preset.lengths, preset.long_length) if long else preset.lengths
    cases = make_cases(preset.config, lengths, seed)
    vocab = [f"<{i}>" for i in range(preset.config.vocab_size)]
    write_scaled_fixture(root, preset.config, weights, cases, vocab, {
        "preset": name, "seed": seed, "command": f"parity export --preset {name} --seed {seed}"
                                                 + (" --long" if long else ""),
        "weights": (LLAMA_WEIGHTS if preset.family == "llama" else
                    "parity_harness._authoring.presets.init_weights: N(0, 0.02), residual projections "
                    "0.02/sqrt(2 n_layer), PCG64(seed)" + (f"; wpe dims 0, 1 +-{preset.outlier:g} (preset_weights)"
                                                           if preset.outlier else "")),
        "platform": current_platform(),
    }, say, with_onnx, preset.family)


LLAMA_WEIGHTS = ("parity_reference.llama_model.init_params(config, seed): N(0, 0.02), RMSNorm gains N(1, 0.02), "
                 "torch.Generator(seed) in float64, rounded to float32")


def write_toy_llama(root: Path, weights: Mapping[str, np.ndarray], seed: int, progress: Progress) -> None:
    """The toy-llama fixture for `weights` into `root` (a new or empty directory): the toy's vocabulary, cases and
    decoding prompts, goldens of both tiers from parity_reference/llama_model.py, the toy's default tolerances."""
    import torch

    from parity_harness._authoring.decoding_writer import extend_manifest, family_forward, write_decoding_files
    from parity_harness._authoring.export import make_cases as toy_cases
    from parity_harness._authoring.fixture_writer import default_tolerances, write_fixture_files
    from parity_harness._fixture.platforms import current_platform
    from parity_reference.grammar import VOCAB
    from parity_reference.run import reference_taps

    config = TOY_LLAMA
    run_with_taps, _ = family_forward("llama")
    cases = [Case(c["name"], tuple(c["tokens"]), c["kind"], c["text"])
             for c in toy_cases(config.vocab_size, config.n_ctx)]
    write_fixture_files(
        root, config=config, vocab=VOCAB, cases=cases, weights=weights, family="llama",
        golden=lambda precision: reference_taps(weights, config, cases, precision,  # type: ignore[arg-type]
                                                run_with_taps),
        provenance={"torch": torch.__version__.split("+")[0], "preset": TOY_LLAMA_PRESET, "seed": seed,
                    "command": f"parity export --preset {TOY_LLAMA_PRESET} --seed {seed}", "weights": LLAMA_WEIGHTS,
                    "platform": current_platform()},
        tolerances=default_tolerances(), progress=progress,
    )
    section, files = write_decoding_files(root, weights, config, VOCAB, onnx=False, progress=progress, family="llama")
    extend_manifest(root, section, files)


def export_toy_llama(root: Path, seed: int = 0, progress: Progress = print) -> None:
    """`parity export --preset toy-llama [--fixture DIR]`: written beside `root`, checked, then swapped in."""
    from parity_harness._authoring.fixture_writer import owned_entries
    from parity_harness._core.safe_write import replace_directory, staging_directory
    from parity_harness._fixture.fixture import load_fixture

    say: Progress = lambda message: progress(f"parity export: {message}")  # noqa: E731
    owned_entries(root, TOY_LLAMA_PRESET)
    say(f"preset {TOY_LLAMA_PRESET} (the toy Llama: d 16, 2 blocks of 4 query heads sharing 2 key/value heads), "
        f"seed {seed}")
    with staging_directory(root) as staging:
        write_toy_llama(staging, llama_weights(TOY_LLAMA, seed), seed, say)
        load_fixture(staging).decoding()  # validate what was written before putting it in place
        from parity_harness._authoring.onnx_export import export_onnx_for

        for line in export_onnx_for(staging):  # the graphs, run against the fp32 goldens; the manifest re-sealed
            say(line)
        replace_directory(staging, root, owned_entries(root, TOY_LLAMA_PRESET))
    say(f"wrote {root}")


def check_toy_llama(root: Path, progress: Progress = print, out: Progress = print) -> Verdict:
    """`parity export --preset toy-llama --check`: the weights regenerated from the seed, the goldens recomputed
    (bit-identical on the platform that made them, else the cross-platform rule) and the manifest apart from
    hashes must match the committed fixture."""
    import tempfile

    from parity_harness._authoring.export import _manifest_without_hashes, check_goldens
    from parity_harness._fixture.fixture import MANIFEST, load_fixture
    from parity_harness._fixture.platforms import current_platform, describe, same_platform

    def say(message: str) -> None:
        progress(f"parity export --check: {message}")

    fixture = load_fixture(root)
    provenance = fixture.manifest.get("provenance") or {}
    if fixture.family != "llama" or provenance.get("preset") != TOY_LLAMA_PRESET:
        raise FixtureError(f"{root}: not a {TOY_LLAMA_PRESET} fixture (made by `parity export --preset "
                           f"{TOY_LLAMA_PRESET}`)")
    seed = provenance.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise FixtureError(f"{fixture.manifest_path}: provenance.seed must be a non-negative integer, got {seed!r}")
    same = same_platform(provenance.get("platform"), current_platform())
    rule = "bit-identical" if same else "cross-platform"
    say(f"goldens made on: {describe(provenance.get('platform'))}; rule: {rule}")
    problems: list[str] = []
    committed = fixture.weights()
    regenerated = llama_weights(TOY_LLAMA, seed)
    differ = [k for k in committed if not np.array_equal(committed[k], regenerated.get(k, np.empty(0)))]
    if differ or set(regenerated) != set(committed):
        problems.append(f"weights regenerated from seed {seed} differ (e.g. {(differ or ['names'])[0]!r})")
    else:
        say(f"weights regenerated from seed {seed}: bit-identical")
    with tempfile.TemporaryDirectory() as tmp:
        regen = Path(tmp)
        write_toy_llama(regen, committed, seed, lambda _m: None)
        problems += check_goldens(fixture, regen, same, say)
        theirs = _manifest_without_hashes(fixture.manifest_path)
        theirs["files"].pop("onnx", None)  # graphs added later (onnx_export.export_onnx_for): checked below
        if isinstance(theirs["files"].get("decoding"), dict):
            theirs["files"]["decoding"].pop("onnx", None)
        if _manifest_without_hashes(regen / MANIFEST) != theirs:
            problems.append("manifest differs apart from hashes, platforms and ONNX graphs")
        else:
            say("manifest identical apart from hashes")
    if fixture.onnx_path("all_taps") is not None:
        from parity_harness._authoring.onnx_export import check_onnx_against_golden

        for line in check_onnx_against_golden(fixture):
            say(line)
    for p in problems:
        out(f"parity export --check: FAIL: {p}")
    if problems:
        out(f"parity export --check: the committed fixture is stale; regenerate it with "
            f"`parity export --preset {TOY_LLAMA_PRESET}`")
        return Verdict.DISAGREE
    out("parity export --check: OK, the committed toy-llama fixture is reproducible")
    return Verdict.AGREE


__all__ = ["PRESETS", "SCALED_C", "TOY_LLAMA_PRESET", "check_toy_llama", "export_preset", "export_toy_llama",
           "init_weights", "llama_weights", "make_probe_fixture", "preset_weights", "scaled_tolerances",
           "write_scaled_fixture", "write_toy_llama"]
