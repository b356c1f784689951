"""The logit lens of one case (`parity lens`): each residual stream's top guess at each position.

Stream k is read as the model reads its last one, softmax(LN_f(x_k) @ W_E^T): the taps
`logit_lens.0` (block 0's input) .. `logit_lens.L` (the last block's output, the model's own
prediction). The grid comes from the float64 golden; every requested backend is run and any cell
where its top guess differs from the golden's is marked. Exit 0 when every backend agrees on
every top guess, 1 when one differs, 2 for bad input (an unknown case, say).

By default it checks the reference backends only (`REFERENCE`: pytorch, which made the goldens, and numpy) in
fp32 and fp64, 4 runs, a second or two: the lens is for reading what the model thinks. `--all-backends`
checks every available backend that produces the taps, in every precision it computes in (22 runs on the
toy, about 20 s), as `--backends` does for the ones it names.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from parity_harness._backends.base import Precision
from parity_harness._backends.boundary import AnyBackend, GuardedBackend, guarded
from parity_harness._core.errors import BackendFailed, ParityError
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture
from parity_harness._run.runner import Progress

# What `parity lens` checks without --backends or --all-backends: the reference implementations, in the golden tiers.
REFERENCE: tuple[str, ...] = ("pytorch", "numpy")
REFERENCE_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp64")


def reference_only(chosen: Sequence[GuardedBackend], skipped: Sequence[str]) -> tuple[list[GuardedBackend], list[str]]:
    """The default selection narrowed to the reference backends, and the skip lines that concern them."""
    names = {f"backend {name!r} " for name in REFERENCE}
    return ([b for b in chosen if b.name in REFERENCE],
            [line for line in skipped if any(line.startswith(n) for n in names)])


@dataclass(frozen=True)
class LensSelection:
    """What `parity lens` checks: the backends, the skip lines that concern them, the precisions (None: every one
    each computes in), and whether it is a default selection."""

    backends: list[GuardedBackend]
    skipped: list[str]
    precisions: tuple[Precision, ...] | None
    default: bool


def select_lens_backends(names: list[str] | None, all_backends: bool) -> LensSelection:
    """The lens's request, checked: `names` (None: not given) or every available backend, or by default the
    reference backends in fp32 and fp64. Both `names` and `all_backends` is one line (ParityError)."""
    from parity_harness._run.request import select_backends

    if names is not None and all_backends:
        raise ParityError("--backends and --all-backends: give one (--backends names the backends to check)")
    backends, skipped, _ = select_backends(names)
    if names is None and not all_backends:  # the default: the reference backends, fp32 and fp64
        narrowed, kept = reference_only(backends, skipped)
        return LensSelection(narrowed, kept, REFERENCE_PRECISIONS, True)
    return LensSelection(list(backends), list(skipped), None, names is None)


@dataclass
class LensGrid:
    """The golden lens of one case, and where backends' top guesses differ from it."""

    case: str
    words: list[str]  # the input words, one per position
    top_ids: np.ndarray  # [streams, T] the golden top token
    top_probs: np.ndarray  # [streams, T] its probability
    vocab: list[str]
    marks: dict[tuple[int, int], list[str]] = field(default_factory=dict)  # (stream, position) -> "numpy fp32: 'cat'"
    checked: list[str] = field(default_factory=list)  # "numpy fp32", ... the backend runs compared
    first: int = 0  # the position of words[0]: the golden may keep only the last positions ("rows")

    @property
    def top_words(self) -> list[list[str]]:
        return [[self.vocab[int(i)] for i in row] for row in self.top_ids]


def lens_taps(fixture: Fixture) -> list[str]:
    return [f"logit_lens.{k}" for k in range(fixture.config.n_layer + 1)]


def golden_grid(fixture: Fixture, case: str) -> LensGrid:
    """The lens grid of `case` from the float64 golden; ParityError (exit 2) for an unknown case."""
    names = [c.name for c in fixture.cases]
    if case not in names:
        raise ParityError(f"unknown case {case!r}; the fixture's cases are: {', '.join(names)}")
    golden = fixture.golden_case("fp64", case)
    probs = np.stack([golden[t] for t in lens_taps(fixture)])  # (streams, T or rows, V)
    tokens = fixture.case(case).tokens
    first = len(tokens) - probs.shape[1]  # > 0 when the fixture keeps the last positions only
    return LensGrid(case, [fixture.vocab[t] for t in tokens[first:]], probs.argmax(-1), probs.max(-1), fixture.vocab,
                    first=first)


def mark_backend(grid: LensGrid, label: str, output: dict[str, np.ndarray], taps: list[str]) -> None:
    """Mark every cell where `output` ({tap: [T, V] probabilities}) has another top guess than the golden."""
    for tap in taps:
        if output[tap].shape[-1:] != (len(grid.vocab),) or output[tap].shape[:-1] != grid.top_ids[0].shape:
            raise BackendFailed(f"{label}: {tap} has shape {list(output[tap].shape)}, expected "
                                f"{[*grid.top_ids[0].shape, len(grid.vocab)]}")
    grid.checked.append(label)
    for k, tap in enumerate(taps):
        top = output[tap].argmax(-1)
        for t in np.flatnonzero(top != grid.top_ids[k]):
            grid.marks.setdefault((k, int(t)), []).append(f"{label}: {grid.vocab[int(top[t])]!r}")


def format_grid(grid: LensGrid) -> list[str]:
    """The grid as text: a row per stream, a column per position, each cell `word prob` (* marks a difference)."""
    words = grid.top_words
    cells = [[f"{words[k][t]} {grid.top_probs[k, t]:.2f}{'*' if (k, t) in grid.marks else ''}"
              for t in range(len(grid.words))] for k in range(len(words))]
    heads = [f"{grid.first + t}:{w}" for t, w in enumerate(grid.words)]
    widths = [max(len(heads[t]), *(len(row[t]) for row in cells)) for t in range(len(heads))]
    label_width = len(f"logit_lens.{len(words) - 1}")
    lines = [(f"{'':<{label_width}}  " + "  ".join(f"{h:<{w}}" for h, w in zip(heads, widths, strict=True))).rstrip()]
    for k, row in enumerate(cells):
        lines.append((f"{f'logit_lens.{k}':<{label_width}}  "
                      + "  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True))).rstrip())
    return lines


def run_lens(
    fixture: Fixture, case: str, backends: Sequence[AnyBackend], plot: Path | None,
    default_selection: bool = True, out: TextIO = sys.stdout, progress: Progress | None = None,
    precisions: Sequence[Precision] | None = None,
) -> Verdict:
    """Print (and optionally draw) the lens of `case`, checking each backend's top guesses against the golden.

    `precisions`: the ones each backend is run in, of those it computes in (None: all of them)."""
    grid = golden_grid(fixture, case)
    if plot is not None:
        from parity_harness._views.plots import require_matplotlib

        require_matplotlib()  # before running any backend
    taps = lens_taps(fixture)
    say = progress or (lambda _msg: None)
    for backend in [guarded(b) for b in backends]:
        declined = backend.declined(fixture)  # as `parity run` does: a backend that declines is not run
        supported = [] if declined else backend.taps(fixture)
        if not set(taps) <= set(supported):
            if not default_selection:
                why = f"declines this fixture ({declined})" if declined else "does not produce the logit_lens taps"
                print(f"parity lens: {backend.name} {why}: not checked", file=out)
            continue
        for precision in [p for p in backend.precisions if precisions is None or p in precisions]:
            say(f"parity: running {backend.name} ({precision}) ...")
            _, output = backend.outputs(fixture, precision, supported)
            if any(t not in output[case] for t in taps):
                raise BackendFailed(f"backend {backend.name!r} ({precision}) returned no logit_lens taps for {case!r}")
            mine = {t: fixture.select_rows(t, fixture.case(case), output[case][t]) for t in taps}
            mark_backend(grid, f"{backend.name} {precision}", mine, taps)
    if not grid.checked:  # never a verdict on nothing: exit 2, not "AGREE"
        raise ParityError("parity lens: nothing compared: no selected backend produces the logit_lens taps "
                          f"({', '.join(b.name for b in backends) or 'no backend selected'})")
    text = fixture.case(case).text or " ".join(grid.words)
    print(f"logit lens of {case} ({text!r}): top guess and its probability, from the float64 golden", file=out)
    for line in format_grid(grid):
        print(line, file=out)
    print(file=out)
    for (k, t), who in sorted(grid.marks.items()):
        print(f"* logit_lens.{k} position {grid.first + t} ({grid.words[t]!r}): golden {grid.top_words[k][t]!r}, "
              + ", ".join(who), file=out)
    checked = ", ".join(grid.checked) or "none"
    if plot is not None:
        from parity_harness._views.plots import plot_lens

        title = (f"Logit lens, {case}: {text!r} (golden fp64; red * = a backend's top guess differs)\n"
                 f"checked: {checked}")
        plot_lens(plot, title, grid.words, grid.top_words, grid.top_probs, grid.marks)
        print(f"parity lens: wrote {plot}", file=out)
    if grid.marks:
        print(f"DIFFER: {len(grid.marks)} cell(s) where a backend's top guess differs from the golden "
              f"(checked: {checked})", file=out)
        return Verdict.DISAGREE
    print(f"AGREE: every backend's top guess matches the golden in every cell (checked: {checked})", file=out)
    return Verdict.AGREE
