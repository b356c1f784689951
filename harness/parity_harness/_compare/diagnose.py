"""Diagnosis: name the likely cause of a first divergence from the numbers themselves.

`diagnose` looks at one failing tensor (the candidate's, the golden's, and where the caller has them the
float64 truth, the float32 golden and the golden of the tap before it) and returns the names of the
patterns that explain its failing cells, most specific first (docs/diagnosis.md):

- ROUNDED_F32: in the fp64 tier, every failing cell is exactly the expected value rounded to float32
  (float64 weights or a float64 tap went through float32 somewhere);
- NOT_CORRECTLY_ROUNDED: against the float64 truth, a failing cell is more than 0.5 eps32 units off
  (eps32 x |truth|) where the float32 golden is within 0.5, and every failing cell is within
  ROUNDING_SIZED units (a rounding-sized error, such as sin/cos computed in float32, not a wrong value);
- SHIFTED: along the position axis, the failing cells hold the expected values of the next or the
  previous position (an off-by-one position);
- SIGN_FLIPPED: every failing cell is the expected value negated;
- MISSING_MASK: the expected tensor holds -inf (a masked score) where the candidate is finite;
- PREVIOUS_TAP: the candidate equals, within tolerance, the golden of the tap before it in dataflow
  order (a hook placed one step early, or a tap returned twice).

With a `TapContext`, the known porting bugs are predicted from the golden's upstream taps by the fixture's
family's `causes` module, which its table names (`gpt2_causes.py`, `llama_causes.py`; docs/diagnosis.md,
"Known porting bugs").

"Failing" and "equals" use the tier's own rule: |a - b| <= atol + rtol * |b|. It costs a few passes
over one tensor, so the runner calls it once per case and tier, at that case's first failing tap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._compare.patterns import StepContext, TapContext
from parity_harness._compare.patterns import close as _close
from parity_harness._compare.patterns import explains as _explains
from parity_reference.families import family_of

if TYPE_CHECKING:
    from parity_harness._compare.report import Report

ROUNDED_F32 = "got equals expected rounded to float32"
NOT_CORRECTLY_ROUNDED = ("not correctly rounded: over 0.5 eps units where the golden is within 0.5 (a float32 step, "
                         "e.g. positions computed in float32)")
SHIFTED = "the same value at a shifted position"
SIGN_FLIPPED = "sign flipped"
MISSING_MASK = "causal mask missing or shifted: -inf expected, finite got"
PREVIOUS_TAP = "values of the previous tap"

EPS32 = float(np.finfo(np.float32).eps)
ROUNDING_SIZED = 4.0  # eps32 units: the most a failing cell may be off for NOT_CORRECTLY_ROUNDED


def _rounded_f32(a: np.ndarray, b: np.ndarray, bad: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        rounded = b.astype(np.float32).astype(np.float64)
    return bool(np.all(a[bad] == rounded[bad]))


def _not_correctly_rounded(a: np.ndarray, bad: np.ndarray, truth: np.ndarray, golden32: np.ndarray) -> bool:
    if truth.shape != a.shape or golden32.shape != a.shape:
        return False
    t = truth.astype(np.float64)
    cells = bad & np.isfinite(t) & (t != 0.0)
    if not cells.any():
        return False
    scale = EPS32 * np.abs(np.where(cells, t, 1.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        units = np.abs(a - t) / scale
        golden_units = np.abs(golden32.astype(np.float64) - t) / scale
    if not np.all(units[cells] <= ROUNDING_SIZED):  # NaN fails too: not a rounding-sized error
        return False
    return bool(np.any((units > 0.5) & (golden_units <= 0.5) & cells))


def _take(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def _shifted(a: np.ndarray, b: np.ndarray, bad: np.ndarray, axis: int, atol: float, rtol: float) -> bool:
    """actual[t] == expected[t + s] (s = +1 or -1) at most of the failing cells, and at all those it can."""
    n = a.shape[axis]
    if n < 2:
        return False
    for s in (1, -1):
        lo, hi = (0, n - 1) if s == 1 else (1, n)  # the positions t of `actual` that have a t + s
        a_part, bad_part = _take(a, axis, lo, hi), _take(bad, axis, lo, hi)
        b_part = _take(b, axis, lo + s, hi + s)
        if not bad_part.any() or 2 * int(bad_part.sum()) < int(bad.sum()):
            continue
        if bool(np.all(_close(a_part, b_part, atol, rtol)[bad_part])):
            return True
    return False


def diagnose(
    actual: object, expected: np.ndarray, tier: str, *, atol: float = 0.0, rtol: float = 0.0,
    truth: np.ndarray | None = None, golden32: np.ndarray | None = None, previous: np.ndarray | None = None,
    position_axis: int | None = None, context: TapContext | None = None,
) -> list[str]:
    """The names of the patterns (module docstring) that explain where `actual` breaks `expected`; [] if none.

    `tier` is the golden's precision ("fp32" or "fp64"); `atol`/`rtol` the tier's tolerance for the tap;
    `truth` the float64 golden and `golden32` the float32 golden (for NOT_CORRECTLY_ROUNDED); `previous`
    the golden of the tap before it (PREVIOUS_TAP); `position_axis` the tap's query-position axis (SHIFTED);
    `context` the tap's name, the model's config, the case's goldens and candidate taps, and the weights: with it,
    the known porting bugs are predicted from the golden's upstream taps and matched (`_contextual`).
    """
    if not isinstance(actual, np.ndarray) or actual.dtype.kind not in "fiu":
        return []
    a = actual.astype(np.float64)
    causes: list[str] = []
    if a.shape == expected.shape:
        b = expected.astype(np.float64)
        if np.any(np.isneginf(b) & np.isfinite(a)):
            causes.append(MISSING_MASK)
        bad = ~_close(a, b, atol, rtol) & np.isfinite(b)
        if bad.any():
            if tier == "fp64" and _rounded_f32(a, b, bad):
                causes.append(ROUNDED_F32)
            elif truth is not None and golden32 is not None and _not_correctly_rounded(a, bad, truth, golden32):
                causes.append(NOT_CORRECTLY_ROUNDED)
            if position_axis is not None and 0 <= position_axis < a.ndim and _shifted(a, b, bad, position_axis,
                                                                                      atol, rtol):
                causes.append(SHIFTED)
            if bool(np.all(_close(a[bad], -b[bad], atol, rtol))):
                causes.append(SIGN_FLIPPED)
            if context is not None:
                causes += _contextual(a, b, bad, actual.dtype, atol, rtol, context)
        # the judge fails a result on a coarser grid even within tolerance (judge.coarser_grid_message): named here too
        causes += _grid_causes(a, b, bad, context.precision if context is not None else "")
    if previous is not None and previous.shape == a.shape:
        p = previous.astype(np.float64)
        same_as_expected = p.shape == expected.shape and bool(np.all(_close(expected.astype(np.float64), p,
                                                                             atol, rtol)))
        if not same_as_expected and bool(np.all(_close(a, p, atol, rtol))):
            causes.append(PREVIOUS_TAP)
    return causes


# -- the known porting bugs, predicted from the golden's upstream taps (docs/diagnosis.md, "Known bugs") --------

OVERFLOW = "overflow"
GRID_BF16 = "on the bfloat16 grid"
GRID_FP16 = "on the float16 grid"


def _contextual(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
                ctx: TapContext) -> list[str]:
    """The family's known porting bugs at this tap (its table's `causes` module: `known_bugs`), first that fits."""
    for check in family_of(ctx.config).module("causes").known_bugs(a, b, bad, dtype, atol, rtol, ctx):
        try:
            found = check()
        except (ValueError, IndexError, FloatingPointError):  # a shape this pattern does not know: no cause
            found = []
        if found:
            return list(found)
    return []


def _grid_causes(a: np.ndarray, b: np.ndarray, bad: np.ndarray, precision: str) -> list[str]:
    """Overflow (inf where the golden is finite), and values on a coarser grid than the candidate's `precision`
    (float16's in an fp32 or fp64 run, bfloat16's in any other than bf16; "" when it is not known: no grid)."""
    causes: list[str] = []
    if np.any(np.isposinf(a) & np.isfinite(b) & bad):  # -inf is a masked score's value, not a sum past the range
        causes.append(f"{OVERFLOW}: inf where the golden is finite (a sum or product past the dtype's range)")
    # normal float16 numbers only: a smaller value has fewer bits on any grid
    cells = np.isfinite(a) & np.isfinite(b) & (np.abs(a) >= float(np.finfo(np.float16).tiny))
    if not cells.any() or not precision:
        return causes
    x, y = a[cells], b[cells]
    with np.errstate(over="ignore", invalid="ignore"):
        on16 = bool(np.all(x.astype(np.float16).astype(np.float64) == x))
        golden16 = bool(np.all(y.astype(np.float16).astype(np.float64) == y))
        onbf16 = bool(np.all((x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF)) == 0)
                      and np.all(x.astype(np.float32).astype(np.float64) == x))
        goldenbf16 = bool(np.all((y.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF)) == 0))
    if precision in ("fp32", "fp64") and on16 and not golden16:
        causes.append(f"{GRID_FP16}: every value has float16's 11 significant bits (stored or computed in float16)")
    elif precision != "bf16" and onbf16 and not goldenbf16:
        causes.append(f"{GRID_BF16}: every value has bfloat16's 8 significant bits (computed in bfloat16)")
    return causes


# -- decoding: a step's first failing tap, against the golden's previous step and one-step variants -----------------

CACHE_TRANSPOSED = "cache layout transposed"
STALE_CACHE = "stale cache"
DECODE_POSITION = "the new token at a wrong position"
OWN_KEY_UNSEEN = "cache appended after use"
POSITION_OFFSETS = (-2, -1, 1, 2)  # the wrong positions tried besides 0 (not offset by the cache length at all)
SINGLE_QUERY_MASK = "mask wrong at T = 1"


def diagnose_step(
    actual: object, expected: np.ndarray, tap: str, step: int, *, atol: float = 0.0, rtol: float = 0.0,
    context: StepContext | None = None,
) -> list[str]:
    """The likely cause of a decoding step's first failing tap (docs/diagnosis.md, "Decoding"); [] if none fits.

    A cache tap is [H, T, d_head]. Patterns: the layout transposed ([T, H, d_head] read as [H, T, d_head]); a
    stale cache (the step's cache is the previous step's); and, from `context`, the step recomputed from the golden's
    previous cache with the new token at another position, or its query attending to the cached keys only (the
    cache appended after use) or to key 0 only (a square mask's first row: a mask wrong at T = 1).
    """
    if not isinstance(actual, np.ndarray) or actual.dtype.kind not in "fiu":
        return []
    a, b = actual.astype(np.float64), np.asarray(expected, dtype=np.float64)
    previous = None if context is None or step == 0 else context.previous.get(tap)
    if (previous is not None and a.shape == np.shape(previous) and a.shape != b.shape
            and bool(np.all(_close(a, np.asarray(previous, dtype=np.float64), atol, rtol)))):
        return [f"{STALE_CACHE}: step {step}'s {tap.rsplit('.', 1)[-1]} is step {step - 1}'s (not updated)"]
    if a.shape != b.shape:
        return []
    bad = ~_close(a, b, atol, rtol) & np.isfinite(b)
    if not bad.any():
        return []
    causes: list[str] = []
    if a.ndim == 3 and _explains(a, b, b.transpose(1, 0, 2).reshape(b.shape), bad, atol, rtol):
        causes.append(f"{CACHE_TRANSPOSED}: the cache stored [T, H, d_head] and read as [H, T, d_head]")
    elif previous is not None and a.ndim == 3 and a.shape[1] >= 2 and _explains(
            a, b, np.concatenate([b[:, :-1], b[:, -2:-1]], axis=1), bad, atol, rtol):
        causes.append(f"{STALE_CACHE}: the new position's row repeats the previous one (the cache not updated)")
    if context is not None and step > 0 and not causes:
        causes += _step_variants(a, b, bad, tap, atol, rtol, context)
    if not causes and context is not None and context.precision in ("fp32", "fp64"):
        finite = np.isfinite(a)
        with np.errstate(over="ignore"):
            on16 = a[finite].astype(np.float16).astype(np.float64) == a[finite]
        if finite.any() and bool(np.all(on16)) and not bool(np.all(b.astype(np.float16).astype(np.float64) == b)):
            causes.append(f"{GRID_FP16}: every value has float16's 11 significant bits (the cache stored in float16)")
    return causes


def _step_variants(a: np.ndarray, b: np.ndarray, bad: np.ndarray, tap: str, atol: float, rtol: float,
                   ctx: StepContext) -> list[str]:
    """The step recomputed from the golden's previous cache with one thing changed, by the family's `causes` module's
    `step_replay` (none: no variant is tried)."""
    replay = getattr(family_of(ctx.config).module("causes"), "step_replay", None)
    if replay is None:
        return []
    try:
        for attend, name in (("cached", f"{OWN_KEY_UNSEEN}: the new token's query does not see its own key and "
                                        "value (the cache grown after attention)"),
                             ("first", f"{SINGLE_QUERY_MASK}: the single-token query sees key 0 only (the square "
                                       "mask's first row applied to a one-query step)")):
            if _explains(a, b, replay(ctx, ctx.position, attend).get(tap), bad, atol, rtol):
                return [name]
        tried = dict.fromkeys(p for p in (0, *(ctx.position + o for o in POSITION_OFFSETS))
                              if 0 <= p < ctx.config.n_ctx)
        for position in tried:
            if position != ctx.position and _explains(a, b, replay(ctx, position, "all").get(tap), bad, atol, rtol):
                offset = position - ctx.position
                return [f"{DECODE_POSITION}: encoded at position {position} instead of {ctx.position} "
                        f"(offset {offset:+d}{': not offset by the cache length' if position == 0 else ''})"]
    except (KeyError, ValueError, IndexError):  # a model this recomputation does not know: no cause
        return []
    return []


# -- stale goldens: only the backend that made them disagrees -----------------------------------------------------

GOLDEN_MAKER = "pytorch"  # `parity export` computes every golden with the PyTorch reference (reference_taps)


def golden_maker(provenance: Mapping[str, object]) -> str | None:
    """The backend that computes the goldens the way they were made, from a manifest's provenance; None if unknown.

    An explicit `golden_backend` wins; a fixture made by `parity export` (its `command`) or whose provenance says
    `golden: reference.model.run_with_taps` was made by the PyTorch reference, the `pytorch` backend.
    """
    explicit = provenance.get("golden_backend")
    if isinstance(explicit, str) and explicit:
        return explicit
    command, weights = provenance.get("command"), provenance.get("weights")
    if (isinstance(command, str) and command.startswith("parity export")) or \
            (isinstance(weights, str) and "golden: reference.model.run_with_taps" in weights):
        return GOLDEN_MAKER
    return None


def stale_golden_hint(report: Report, provenance: Mapping[str, object] | None = None) -> str | None:
    """A hint that the goldens may be stale, or None: the backend that made them (`golden_maker`) is the only one
    that disagrees (forward or decoding), and at least one other backend was compared and agrees with them (so with
    each other). `provenance` is the fixture's manifest's; None reads it from the report's fixture directory."""
    provenance = _read_provenance(report.fixture) if provenance is None else provenance
    maker = golden_maker(provenance) if provenance is not None else None
    if provenance is None or maker is None:
        return None
    checks = [(r.backend, r.passed) for r in report.results]
    if report.decoding is not None:
        checks += [(c.backend, c.passed) for c in report.decoding.checks]
    failing = {backend for backend, passed in checks if passed is False}
    others = {backend for backend, passed in checks if passed is not None} - {maker}
    if failing != {maker} or not others:
        return None
    command = provenance.get("command")
    again = f"`{command}`" if isinstance(command, str) and command.startswith("parity export") else "`parity export`"
    return (f"only {maker}, the backend that made the goldens, disagrees; {', '.join(sorted(others))} "
            f"agree{'s' if len(others) == 1 else ''} with them: the goldens may be stale (the reference changed since "
            f"they were made): `parity export --check` says whether they still reproduce; {again} regenerates them")


def _read_provenance(fixture: str) -> Mapping[str, object] | None:
    """The provenance of the manifest in directory `fixture`, None when there is none to read."""
    import json
    from pathlib import Path

    path = Path(fixture) / "manifest.json" if fixture else None
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None
    provenance = doc.get("provenance") if isinstance(doc, dict) else None
    return provenance if isinstance(provenance, dict) else None
