"""Pictures: the error ladder of a parity run (`parity run --plot`) and the logit lens (`parity lens --plot`).

matplotlib is optional (`pip install 'parity-harness[plot]'`): it is imported only here, only when a
picture is asked for, with the Agg backend (no display). The file type follows the extension:
.png or .svg. Every label holding a string from outside (a backend, a word, a fixture's name) goes
through `parity_harness._core.sanitize` (`_save` sweeps every text of the figure; tick and legend labels are made
safe where they are set) and mathtext is off for every text of the figure (`_plain_text`): no control
character, no '$' parsed, no label left out of a legend. Parity's own numbers need no mathtext: the
ladder's log axis reads 10⁻¹² in Unicode superscripts (`power_of_ten`), not matplotlib's `$10^{-12}$`,
which mathtext off would draw as its source.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec

import numpy as np

from parity_harness._compare.judge import NOT_SUPPORTED
from parity_harness._compare.report import Report
from parity_harness._core.errors import ParityError
from parity_harness._core.sanitize import plot_label, safe_text
from parity_harness._fixture.fixture import Fixture
from parity_harness._fixture.tolerances import tap_magnitude

INSTALL_HINT = "pip install 'parity-harness[plot]'"
DPI = 100
LADDER_SIZE = (14.0, 7.0)  # inches: 1400 x 700 pixels at DPI
FORMATS = (".png", ".svg")
P = ParamSpec("P")
TIER_STYLE = {("fp32", "fp32"): ("-", "o"), ("fp64", "fp64"): ("--", "s"), ("fp64", "fp32"): (":", "^")}


class PlotUnavailable(ParityError):
    """matplotlib is not installed (exit 2, with the install hint)."""


def require_matplotlib() -> Any:
    """matplotlib.pyplot on the Agg backend; PlotUnavailable (exit 2) if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(f"plotting needs matplotlib, which is not available; install with: {INSTALL_HINT}")\
            from None
    return plt


def check_plot_path(path: Path) -> None:
    """ParityError unless `path` names a picture type parity draws (.png or .svg)."""
    _check_path(path)


def _check_path(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise ParityError(f"{path}: unknown picture type {path.suffix!r} (use .png or .svg)")


def _save(fig: Any, path: Path) -> None:
    """Write the picture, to a temporary file renamed into place (parity_harness/_core/safe_write.py); first every text
    in it
    (titles, legends, cells) made safe (parity_harness/_core/sanitize.py)."""
    from matplotlib.text import Text

    from parity_harness._core.output_paths import PICTURE_TITLE
    from parity_harness._core.safe_write import write_atomic_with

    for text in fig.findobj(Text):
        text.set_text(safe_text(text.get_text()))
    kind = path.suffix.lower().lstrip(".")
    # The title marks the file as parity's (_core/output_paths.py): a later run may write over it, no other file.
    write_atomic_with(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=kind, metadata={"Title": PICTURE_TITLE}),
                      "picture")


def ladder_floor(values: list[float]) -> float:
    """Where exact zeros are drawn: a decade below the smallest non-zero error, at most 1e-17."""
    nonzero = [v for v in values if v > 0 and math.isfinite(v)]
    return min(1e-17, 10 ** math.floor(math.log10(min(nonzero)) - 1)) if nonzero else 1e-17


SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def power_of_ten(value: float, _pos: object = None) -> str:
    """A log axis's tick label without mathtext: 1e-12 as '10⁻¹²' (Unicode superscripts), else '%g'."""
    if value > 0 and math.isfinite(value):
        exponent = round(math.log10(value))
        if math.isclose(value, 10.0**exponent, rel_tol=1e-9):
            return "10" + str(exponent).translate(SUPERSCRIPT)
    return f"{value:g}"


def _plain_text(draw: Callable[P, None]) -> Callable[P, None]:
    """`draw` with mathtext off: a '$' in a backend name or a word is drawn, never parsed (nor a crash)."""
    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            import matplotlib
        except ImportError:  # `draw` says so (PlotUnavailable, with the install hint)
            return draw(*args, **kwargs)
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)
    return wrapper


@_plain_text
def plot_error_ladder(report: Report, fixture: Fixture, path: Path) -> None:
    """Each backend-tier's max error per tap (worst over cases) on a log scale, taps in dataflow order.

    Tolerance lines for both golden tiers; exact zeros drawn on a floor line; structural failures
    (infinite error) as crosses on the top edge; unsupported taps left out (a gap in the line).
    """
    _check_path(path)
    plt = require_matplotlib()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    taps = fixture.tap_names
    x_of = {t: i for i, t in enumerate(taps)}
    tiers = report.tree.tiers
    measured = [t.summary for tier in tiers for t in tier.taps
                if t.status != NOT_SUPPORTED and t.summary.max_abs is not None]
    floor = ladder_floor([s.max_abs for s in measured if s.max_abs is not None])
    finite = [s.max_abs for s in measured if s.max_abs is not None and math.isfinite(s.max_abs)]
    top = max([*finite, 1e-4]) * 100
    fig, ax = plt.subplots(figsize=LADDER_SIZE, dpi=DPI)
    # Blocks, shaded alternately, so the ladder through the blocks is visible.
    for i in range(fixture.model.config.n_layer):
        block = [x_of[t] for t in taps if t.startswith(f"blocks.{i}.")]
        ax.axvspan(min(block) - 0.5, max(block) + 0.5, color="0.93" if i % 2 == 0 else "0.86", zorder=0)
        ax.text((min(block) + max(block)) / 2, top / 3, f"block {i}", ha="center", va="top", fontsize=9,
                color="0.35")
    backends = list(dict.fromkeys(tier.backend for tier in tiers))
    colors = plt.get_cmap("tab10" if len(backends) <= 10 else "tab20")  # more than 10: no two backends alike
    for node in tiers:
        backend, precision, golden = node.backend, node.precision, node.golden
        if node.n_compared == 0:
            continue
        y = np.full(len(taps), np.nan)
        crosses = []
        for s in (t.summary for t in node.taps):
            if s.status == NOT_SUPPORTED or s.max_abs is None:
                continue
            if math.isinf(s.max_abs):
                crosses.append(x_of[s.tap])
            else:
                y[x_of[s.tap]] = max(s.max_abs, floor)
        linestyle, marker = TIER_STYLE.get((precision, golden), ("-", "."))
        color = colors(backends.index(backend) % colors.N)
        ax.plot(np.arange(len(taps)), y, linestyle=linestyle, marker=marker, markersize=4, linewidth=1.2,
                color=color, label=plot_label(f"{backend} {precision} vs {golden}"), zorder=3)
        if crosses:
            ax.plot(crosses, [top / 2] * len(crosses), linestyle="none", marker="x", markersize=9, color=color,
                    zorder=4)
    for golden in dict.fromkeys(node.golden for node in tiers):
        tier = fixture.tolerances[golden]  # type: ignore[index]
        color = "crimson" if golden == "fp32" else "darkorange"
        if all(tier.for_tap(t).rtol == 0 for t in taps):
            ax.axhline(tier.default.atol, color=color, linewidth=1.5, linestyle="-.", zorder=2,
                       label=f"{golden} tolerance (atol {tier.default.atol:g})")
            continue
        # With an rtol the allowance depends on the golden value: draw it at each tap's largest |golden|.
        gold = fixture.golden(golden)  # type: ignore[arg-type]
        allow = []
        for t in taps:
            tol = tier.for_tap(t)
            allow.append(tol.atol + tol.rtol * tap_magnitude(g[t] for g in gold.values()))
        ax.plot(np.arange(len(taps)), allow, color=color, linewidth=1.5, linestyle="-.", drawstyle="steps-mid",
                zorder=2, label=f"{golden} tolerance ({tier.default.atol:g} + {tier.default.rtol:g} |golden|)")
    ax.axhline(floor, color="0.4", linewidth=0.8, linestyle=":", zorder=2, label=f"exact (0), drawn at {floor:g}")
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, top)
    # matplotlib's log labels are mathtext ('$\\mathdefault{10^{-2}}$'), drawn as their source with mathtext off
    ax.yaxis.set_major_formatter(FuncFormatter(power_of_ten))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(-0.5, len(taps) - 0.5)
    ax.set_xticks(np.arange(len(taps)))
    ax.set_xticklabels([plot_label(t) for t in taps], rotation=90, fontsize=7)
    ax.set_ylabel("max |actual - golden| over cases (log scale)")
    ax.set_xlabel("tap, in dataflow order")
    ax.set_title(f"Error ladder: {fixture.root.name}, every backend and tier, taps in dataflow order")
    ax.grid(axis="y", which="major", color="0.8", linewidth=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)
    fig.subplots_adjust(left=0.07, right=0.79, top=0.94, bottom=0.3)
    _save(fig, path)
    plt.close(fig)


def lens_figsize(n_positions: int, n_streams: int) -> tuple[float, float]:
    """The lens picture's size in inches for a case of `n_positions` tokens and `n_streams` streams."""
    return (max(6.0, 1.1 * n_positions + 2.5), 0.75 * n_streams + 2.4)


@_plain_text
def plot_lens(
    path: Path, title: str, words: list[str], top_words: list[list[str]], top_probs: np.ndarray,
    marks: dict[tuple[int, int], list[str]],
) -> None:
    """The logit-lens grid: rows are streams (logit_lens.0 first), columns positions; each cell shows
    the stream's top word, shaded by its probability; a cell where some backend's top word differs
    is outlined in red and starred."""
    _check_path(path)
    plt = require_matplotlib()
    n_streams, n_pos = top_probs.shape
    fig, ax = plt.subplots(figsize=lens_figsize(n_pos, n_streams), dpi=DPI)
    image = ax.imshow(top_probs, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for k in range(n_streams):
        for t in range(n_pos):
            p = float(top_probs[k, t])
            star = "*" if (k, t) in marks else ""
            ax.text(t, k, f"{plot_label(top_words[k][t])}{star}\n{p:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if p > 0.6 else "black")
            if (k, t) in marks:
                ax.add_patch(plt.Rectangle((t - 0.47, k - 0.47), 0.94, 0.94, fill=False, edgecolor="red",
                                           linewidth=2.0))
    ax.set_xticks(np.arange(n_pos))
    ax.set_xticklabels([plot_label(f"{t}: {w}") for t, w in enumerate(words)], fontsize=8)
    ax.set_yticks(np.arange(n_streams))
    ax.set_yticklabels([f"logit_lens.{k}" for k in range(n_streams)], fontsize=8)
    ax.set_xlabel("input position (the cell is the guess for the next word)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="top probability")
    fig.subplots_adjust(left=0.14, right=0.95, top=0.86, bottom=0.22)
    _save(fig, path)
    plt.close(fig)
