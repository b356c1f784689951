"""`parity attribute`: which layer loses the precision, and which layers to keep in fp32 (docs/attribution.md).

One backend, one reduced precision (fp16 or bf16). Three passes over every case:

1. the free run: the backend's whole forward pass in the precision (`GuardedBackend.forward`);
2. teacher-forced: every layer (`layer_names`: blocks.{i}.attn, blocks.{i}.mlp, unembed) run on its own by
   the backend (`GuardedBackend.layer`) from the float64 golden's stream at its input, rounded to the
   precision, so the error it introduces is apart from the error it inherits; a block's introduced
   error is its attention run from the golden resid_pre, then its MLP from that;
3. propagation: each layer's output error carried exactly (parity_reference/numpy_model.py in float64) to
   the logits: one logits-error vector per layer and case, from which `_compare/attribution.py`
   predicts the logits error of any set of layers kept in fp32 and recommends the smallest.

Every error is in eps units of the precision, `max |x - fp64 golden| / (eps * M_tap)`. The verdict:
AGREE when the free run's logits meet the target, DISAGREE when they do not (the recommendation says
what to keep in fp32). A NaN or infinity where the golden is finite, in the free run or in any layer run
on its own, is a disagreement whatever the logits say, as a NaN fails its cell in `parity run`: the output
names the layer, the tap and the case (`Attribution.non_finite`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import numpy as np

from parity_harness._backends.base import layer_names
from parity_harness._compare.attribution import alone, predict, recommend, round_to, units
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import EPS, Precision, is_reduced
from parity_harness._core.status import Verdict

if TYPE_CHECKING:
    from parity_harness._backends.boundary import GuardedBackend
    from parity_harness._fixture.fixture import Fixture


@dataclass
class BlockRow:
    """One block's numbers, in eps units of the precision."""

    block: int
    free: float  # free run, at hook_resid_post
    introduced: float  # teacher-forced from the golden resid_pre, at hook_resid_post
    attn: float  # ln1 + attention, teacher-forced, at hook_attn_out
    mlp: float  # ln2 + MLP, teacher-forced from the golden resid_mid, at hook_mlp_out
    ln1: float  # at ln1.hook_normalized, teacher-forced
    ln2: float  # at ln2.hook_normalized, teacher-forced
    attn_logits: float  # the attention sub-layer's error carried exactly to the logits
    mlp_logits: float

    @property
    def inherited(self) -> float:
        return self.free - self.introduced

    @property
    def dominant(self) -> str:
        """The sub-layer whose error reaches the logits most; "LayerNorm (lnK)" when, inside it, the LayerNorm's
        output is further off (in its own units) than the sub-layer's output."""
        if self.attn_logits >= self.mlp_logits:
            return "LayerNorm (ln1)" if self.ln1 > self.attn else "attention"
        return "LayerNorm (ln2)" if self.ln2 > self.mlp else "MLP"


@dataclass
class Attribution:
    """What `parity attribute` found for one backend and precision."""

    backend: str
    precision: Precision
    fixture: str
    target: float
    rows: list[BlockRow] = field(default_factory=list)
    unembed: float = 0.0  # ln_final + logits, teacher-forced, at the logits
    free_logits: float = 0.0  # the free run's logits error
    predicted_free: float = 0.0  # the sum of every layer's propagated error (first order)
    contributions: dict[str, float] = field(default_factory=dict)  # layer -> its own logits error, alone
    dominant: str = ""  # the layer with the largest contribution
    dominant_kept: float = 0.0  # predicted logits error with only it kept in fp32
    kept: list[str] = field(default_factory=list)  # the recommendation
    kept_predicted: float = 0.0
    notes: list[str] = field(default_factory=list)
    non_finite: list[str] = field(default_factory=list)  # "layer: tap in case": a NaN or inf where the golden is not

    @property
    def verdict(self) -> Verdict:
        if self.non_finite:
            return Verdict.DISAGREE
        return Verdict.AGREE if self.free_logits <= self.target else Verdict.DISAGREE


def _non_finite(out: dict[str, np.ndarray], golden: dict[str, np.ndarray]) -> list[str]:
    """The taps of `out` holding a NaN or an infinity in a cell where the golden is finite."""
    bad = []
    for tap, a in out.items():
        g = golden.get(tap)
        if g is None or np.shape(g) != np.shape(a):
            continue  # the boundary checked the names and shapes; a tap with no golden is not judged here
        with np.errstate(all="ignore"):
            if (~np.isfinite(np.asarray(a, dtype=np.float64)) & np.isfinite(g)).any():
                bad.append(tap)
    return bad


def _exact_rest(params: dict[str, np.ndarray], fixture: Fixture, layer: str, x: np.ndarray) -> np.ndarray:
    """The logits [T, V] of the float64 model run from `x`, the output of `layer`, through every later layer."""
    from parity_reference import numpy_model as nm

    config, names = fixture.config, layer_names(fixture.config.n_layer)
    scratch: dict[str, np.ndarray] = {}
    for later in names[names.index(layer) + 1:]:
        if later == "unembed":
            return nm.unembed(x, params, config, scratch, "s")  # (T, V)
        p = "h." + later.split(".")[1] + "."
        if later.endswith(".attn"):
            ln = nm.layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, scratch, "s")
            x = x + nm.attention(ln, params, p + "attn.", config, scratch, "s")  # (T, d)
        else:
            ln = nm.layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, scratch, "s")
            x = x + nm.mlp(ln, params, p + "mlp.", config, scratch, "s")  # (T, d)
    return x  # layer == "unembed": x is already the logits


def _stream_note(fixture: Fixture, precision: Precision, golden: dict[str, np.ndarray]) -> str:
    """A note when the residual stream itself cannot be held in the precision: its rounding is larger than a
    tenth of the spread LayerNorm divides by (the stress fixture's 1000 + O(0.1) in fp16)."""
    for i in range(fixture.config.n_layer):
        g = golden[f"blocks.{i}.hook_resid_pre"].astype(np.float64)  # (T, d)
        spread = float(g.std(axis=-1).min())
        lost = float(np.abs(round_to(g, precision) - g).max())
        if lost > 0.1 * spread:
            return (f"the residual stream is not representable in {precision}: at blocks.{i}.hook_resid_pre, "
                    f"|x| up to {float(np.abs(g).max()):.4g} rounds by up to {lost:.3g}, while LayerNorm divides by a "
                    f"spread of {spread:.3g}: every layer after it computes on rounding noise; expect large numbers, "
                    f"and keep the residual stream itself in fp32 (keeping layers cannot fix it)")
    return ""


def attribute(fixture: Fixture, backend: GuardedBackend, precision: Precision,
              target: float | None = None) -> Attribution:
    """Run the three passes (module docstring) and compute the table and the recommendation."""
    if not is_reduced(precision):
        raise ParityError(f"parity attribute: --precision must be fp16 or bf16, got {precision}")
    if precision not in backend.precisions:
        raise ParityError(f"backend {backend.name!r} computes in {', '.join(backend.precisions)} only, not {precision}")
    if not backend.runs_layers(fixture):
        raise ParityError(f"backend {backend.name!r} does not run one layer from a given input (run_layer): "
                          "parity attribute needs it (docs/attribution.md)")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise ParityError(f"--target must be a positive number of eps units, got {target}")
    fixture.check_before_running()
    eps, magnitude, n_layer = EPS[precision], fixture.tap_magnitudes(), fixture.config.n_layer
    result = Attribution(backend.name, precision, str(fixture.root),
                         target if target is not None else fixture.spec.reduced_c[precision])

    def u(tap: str, a: np.ndarray, g: np.ndarray) -> float:
        return units(a, g, eps, magnitude[tap])

    free: dict[str, float] = {}
    for case, taps in backend.forward(fixture, precision, backend.taps(fixture)):  # 1. the free run
        golden = fixture.golden_case("fp64", case.name)
        result.non_finite += [f"the free run: {tap} in case {case.name}" for tap in _non_finite(taps, golden)]
        for tap in [f"blocks.{i}.hook_resid_post" for i in range(n_layer)] + ["logits"]:
            if tap in taps:
                free[tap] = max(free.get(tap, 0.0), u(tap, taps[tap], golden[tap]))
    result.free_logits = free.get("logits", math.nan)

    params64 = {k: v.astype(np.float64) for k, v in fixture.weights().items()}
    names = layer_names(n_layer)
    deltas: dict[str, list[np.ndarray]] = {layer: [] for layer in names}
    worst: dict[str, float] = {}

    def keep(key: str, value: float) -> None:
        worst[key] = max(worst.get(key, 0.0), value)

    for case in fixture.cases:  # 2. teacher-forced, 3. propagated
        g = fixture.golden_case("fp64", case.name)
        if not result.notes and (note := _stream_note(fixture, precision, g)):
            result.notes.append(note)
        for i in range(n_layer):
            b = f"blocks.{i}"
            attn = backend.layer(fixture, precision, f"{b}.attn", round_to(g[f"{b}.hook_resid_pre"], precision))
            mlp = backend.layer(fixture, precision, f"{b}.mlp", round_to(g[f"{b}.hook_resid_mid"], precision))
            chained = backend.layer(fixture, precision, f"{b}.mlp", attn[f"{b}.hook_resid_mid"])
            found = [f"{b}.attn: {tap} in case {case.name}" for tap in _non_finite(attn, g)]
            found += [f"{b}.mlp: {tap} in case {case.name}" for tap in _non_finite(mlp, g)]
            if not found:  # the MLP run from the attention's output: non-finite only if its own doing
                found += [f"{b}.mlp (from its attention's output): {tap} in case {case.name}"
                          for tap in _non_finite(chained, g)]
            result.non_finite += found
            for key, tap, out in (("attn", "hook_attn_out", attn), ("mlp", "hook_mlp_out", mlp),
                                  ("ln1", "ln1.hook_normalized", attn), ("ln2", "ln2.hook_normalized", mlp),
                                  ("introduced", "hook_resid_post", chained)):
                keep(f"{i}.{key}", u(f"{b}.{tap}", out[f"{b}.{tap}"], g[f"{b}.{tap}"]))
            for layer, out_tap, out in ((f"{b}.attn", "hook_resid_mid", attn), (f"{b}.mlp", "hook_resid_post", mlp)):
                x = out[f"{b}.{out_tap}"].astype(np.float64)  # (T, d)
                with np.errstate(all="ignore"):
                    deltas[layer].append(_exact_rest(params64, fixture, layer, x) - g["logits"])  # (T, V)
        last = g[f"blocks.{n_layer - 1}.hook_resid_post"] if n_layer else g["hook_embed"] + g["hook_pos_embed"]
        unembed = backend.layer(fixture, precision, "unembed", round_to(last, precision))
        result.non_finite += [f"unembed: {tap} in case {case.name}" for tap in _non_finite(unembed, g)]
        logits = unembed["logits"]  # (T, V)
        keep("unembed", u("logits", logits, g["logits"]))
        deltas["unembed"].append(logits.astype(np.float64) - g["logits"])  # (T, V)

    for i in range(n_layer):
        result.rows.append(BlockRow(i, free.get(f"blocks.{i}.hook_resid_post", math.nan), worst[f"{i}.introduced"],
                                    worst[f"{i}.attn"], worst[f"{i}.mlp"], worst[f"{i}.ln1"], worst[f"{i}.ln2"],
                                    0.0, 0.0))
    scale = eps * magnitude["logits"]
    result.unembed = worst["unembed"]
    result.contributions = {layer: alone(deltas, layer, scale) for layer in names}
    for row in result.rows:
        row.attn_logits = result.contributions[f"blocks.{row.block}.attn"]
        row.mlp_logits = result.contributions[f"blocks.{row.block}.mlp"]
    result.predicted_free = predict(deltas, [], scale)
    result.dominant = max(names, key=lambda layer: result.contributions[layer])
    result.dominant_kept = predict(deltas, [result.dominant], scale)
    result.kept, result.kept_predicted = recommend(deltas, result.target, scale)
    return result


def _num(x: float) -> str:
    return "inf" if x == math.inf else ("-" if math.isnan(x) else f"{x:.3g}")


def format_attribution(a: Attribution) -> list[str]:
    """The table and the closing lines, as `parity attribute` prints them."""
    lines = [f"parity attribute: {a.backend} in {a.precision} on {a.fixture}",
             f"errors in {a.precision} eps units, max |x - fp64 golden| / (eps * M_tap), eps = {EPS[a.precision]:.3g}; "
             "introduced: the block teacher-forced from the golden resid_pre; inherited: free run minus introduced"]
    rows = [("block", "free", "introduced", "inherited", "attn (ln1+attn)", "mlp (ln2+mlp)", "ln1", "ln2",
             "-> logits: attn", "mlp", "dominant")]
    for r in a.rows:
        rows.append((str(r.block), _num(r.free), _num(r.introduced), _num(r.inherited), _num(r.attn), _num(r.mlp),
                     _num(r.ln1), _num(r.ln2), _num(r.attn_logits), _num(r.mlp_logits), r.dominant))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(f"unembed (ln_final + logits), teacher-forced: {_num(a.unembed)} units at the logits")
    lines.append(f"logits: the free run is off by {_num(a.free_logits)} units (target {a.target:g}); the sum of the "
                 f"layers' propagated errors predicts {_num(a.predicted_free)}")
    lines.append(f"dominant layer: {a.dominant} ({_num(a.contributions.get(a.dominant, math.nan))} units of the "
                 f"logits alone); kept in fp32, the logits are predicted at {_num(a.dominant_kept)} units")
    if a.kept:
        lines.append(f"recommendation: keep {', '.join(a.kept)} in fp32: logits predicted at "
                     f"{_num(a.kept_predicted)} units (target {a.target:g})")
    else:
        lines.append(f"recommendation: nothing to keep in fp32: the layers' errors predict {_num(a.kept_predicted)} "
                     f"units (target {a.target:g})")
    lines += [f"note: {n}" for n in a.notes]
    if a.non_finite:
        shown = sorted(set(a.non_finite), key=a.non_finite.index)
        more = f" (and {len(shown) - 5} more)" if len(shown) > 5 else ""
        lines.append(f"DISAGREE: not finite (NaN or inf where the fp64 golden is finite): {'; '.join(shown[:5])}{more}")
    return lines


def run_attribute(fixture: Fixture, backend: GuardedBackend, precision: Precision, target: float | None,
                  out: TextIO) -> Verdict:
    """`parity attribute`: print the table; AGREE when the free run's logits meet the target, else DISAGREE."""
    result = attribute(fixture, backend, precision, target)
    for line in format_attribution(result):
        print(line, file=out)
    return result.verdict
