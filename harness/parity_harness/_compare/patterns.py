"""What every family's known-bug patterns share: the contexts they predict from and the one matching rule.

A family's `causes` module (named by its table, `parity_reference/families/{family}.json`: `gpt2_causes.py`,
`llama_causes.py`) predicts a known porting bug's output from the golden's upstream taps and the weights; a
prediction names the bug when `explains` says it matches the candidate. `diagnose.py` runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

MATCH_SLACK = 8.0  # a prediction matches a cell within this many of the tier's tolerances (the golden's own rounding)
MATCH_SHARE = 0.1  # ... and, at a failing cell, within this share of the cell's distance from the golden


def close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """The tier's rule, cell by cell; an infinity is close only to the same infinity, NaN to nothing."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(a) & np.isfinite(b)
        near = np.abs(np.where(finite, a - b, 0.0)) <= atol + rtol * np.abs(np.where(finite, b, 0.0))
        return np.where(finite, near, (a == b) & ~np.isnan(a))


@dataclass(frozen=True)
class TapContext:
    """What a diagnosis may predict from: the tap, the model, this case's goldens (the tier's) and candidate taps.

    `config` is the fixture's model config (`fixture.model.config`), whose family's `causes` module holds the
    patterns of its known bugs.
    """

    tap: str
    config: ModelConfig
    goldens: Mapping[str, np.ndarray]  # this case's goldens in the tier being judged, by tap
    candidate: Mapping[str, np.ndarray] = field(default_factory=dict)  # the candidate's taps for this case
    weights: Mapping[str, np.ndarray] | None = None  # the fixture's weights (for the weight-layout bugs)
    precision: str = ""  # what the candidate computed in: values on a coarser grid than it are named

    def golden(self, tap: str) -> np.ndarray | None:
        g = self.goldens.get(tap)
        return None if g is None else np.asarray(g, dtype=np.float64)

    def weight(self, name: str) -> np.ndarray | None:
        w = None if self.weights is None else self.weights.get(name)
        return None if w is None else np.asarray(w, dtype=np.float64)


@dataclass(frozen=True)
class StepContext:
    """What a decoding step's diagnosis predicts from: the model, its weights, the fed token and the golden's cache."""

    config: ModelConfig
    weights: Mapping[str, np.ndarray]
    token: int  # the token fed at this step
    position: int  # its position: the cache's length before the step
    previous: Mapping[str, np.ndarray]  # the golden's decoding taps at the step before (its cache)
    precision: str = ""  # what the candidate computed in


def explains(a: np.ndarray, b: np.ndarray, pred: np.ndarray | None, bad: np.ndarray, atol: float,
              rtol: float) -> bool:
    """The prediction matches the candidate at every cell, and at each failing cell far nearer it than the golden."""
    if pred is None or pred.shape != a.shape or not bad.any():
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        both = np.isfinite(a) & np.isfinite(pred)
        if not np.all((a == pred)[~both]):  # infinities the same, no NaN
            return False
        err = np.abs(np.where(both, a - pred, 0.0))
        off = np.abs(np.where(both & np.isfinite(b), a - b, 0.0))
        ok = err <= MATCH_SLACK * (atol + rtol * np.abs(np.where(both, pred, 0.0))) + MATCH_SHARE * off
        return bool(np.all(ok) and np.all(err[bad & both] <= MATCH_SHARE * off[bad & both]))


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def layer(tap: str) -> int | None:
    m = _BLOCK.match(tap)
    return int(m.group(1)) if m else None
