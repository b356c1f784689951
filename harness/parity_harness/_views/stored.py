"""A stored weight format's runs as text and JSON: the verdict's number and the format's own cost, per tap.

One line per run in the terminal (what the file held, the worst tap against the goldens of those weights, and
the largest cost of the format itself); with `-v`, two numbers per tap. JSON: every tap's pair.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from parity_harness._compare.stored import StoredRun
from parity_harness._core.precision import EPS


def _eps(precision: str) -> str:
    return f"2^{round(math.log2(EPS[precision]))}"  # type: ignore[index]


def _storage(run: StoredRun) -> str:
    return ", ".join(f"{kind} x {n}" for kind, n in run.storage.items())


def stored_lines(runs: list[StoredRun], verbose: bool = False) -> list[str]:
    """Each stored-format run in a line (two numbers per tap with `verbose`)."""
    lines: list[str] = []
    for run in runs:
        worst, cost = run.worst_runtime, run.worst_format
        unit = f"units of eps x M_tap, eps {_eps(run.precision)}"
        judged = (f"worst {worst.runtime:.3g} of {run.c:g} units at {worst.tap}" if worst is not None
                  and worst.runtime is not None else "no tap compared")
        costs = f"up to {cost.format:.3g} units ({cost.tap})" if cost is not None else "nothing"
        lines.append(f"{run.backend} {run.precision}: weights as {run.precision} stores them ({_storage(run)}), "
                     f"judged against the float64 reference on those weights: {judged} ({unit}); the format's own "
                     f"cost against the fixture's float64 golden, informational: {costs}")
        if verbose:
            for tap in run.taps:
                runtime = "not supported" if tap.runtime is None else \
                    f"{tap.runtime:.3g} units ({'ok' if tap.passed else 'FAIL'})"
                lines.append(f"  {tap.tap:<34} runtime {runtime:<22} format's own cost {tap.format:.3g} units")
    return lines


def stored_json(runs: list[StoredRun]) -> list[dict[str, Any]]:
    """Every stored-format run with every tap's pair (the JSON report's "stored")."""
    return [asdict(run) | {"eps": EPS[run.precision]} for run in runs]  # type: ignore[index]
