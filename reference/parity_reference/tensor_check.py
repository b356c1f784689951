"""The one check of a safetensors file's tensors against what is expected: names, dtypes, shapes, then values.

Every reader of golden and weight tensors goes through it: the harness's goldens (in memory and read tensor by
tensor from a checked header), its decoding and gradient goldens and its weights (parity_harness/_fixture/files.py
turns the error into a `FixtureError`), the reference's `load_weights` (model.py, as `WeightsError`) and the
Hugging Face import's two weight readers. A reader states what it expects as a table {name: `Expected`} and what the
file holds as {name: (dtype, shape)}, from a header (nothing read yet) or from arrays already read; `check_table`
refuses a missing, unexpected, mistyped or mis-shaped tensor, and `check_values` refuses a NaN in a golden or a
non-finite weight. Each refusal is one line naming the file and the tensor, the same from every reader.

A dtype is whatever name the reader uses (NumPy's "float32" for parity's own files, safetensors' "F32" for a
checkpoint read through `safe_open`): the table and the file's names only need to agree. NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TensorCheckError(ValueError):
    """A safetensors file whose tensors are not what was expected; the message names the file and the tensor."""


@dataclass(frozen=True)
class Expected:
    """One expected tensor: the dtypes it may have (the first is the usual one) and its shape."""

    dtypes: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TensorKind:
    """What the tensors of a file are: the noun its messages use, and the rule for its values.

    `finite`: every value finite (weights); otherwise only NaN is refused (a golden holds -inf where attention
    is masked). `dtype_note`: said after an unexpected dtype (why the reader takes only those)."""

    noun: str
    finite: bool
    dtype_note: str = ""


GOLDEN = TensorKind("golden tensor", finite=False)
DECODING_GOLDEN = TensorKind("decoding golden tensor", finite=False)
WEIGHTS = TensorKind("tensor", finite=True)
TRAINING_GOLDEN = TensorKind("gradient golden tensor", finite=True)  # gradients, training steps: finite

Found = Mapping[str, tuple[str, tuple[int, ...]]]  # what a file holds: {name: (dtype, shape)}
SHOWN_EXTRA = 3  # unexpected tensors named in the message; the rest are counted


def check_table(path: Path | str, found: Found, table: Mapping[str, Expected], kind: TensorKind) -> None:
    """Every tensor of `table` is in `found` with an allowed dtype and its shape, and nothing else is there.

    Checked in the table's order (the first problem is reported), the unexpected tensors last."""
    for name, want in table.items():
        if name not in found:
            raise TensorCheckError(f"{path}: missing {kind.noun} {name!r} (expected shape {list(want.shape)})")
        dtype, shape = found[name]
        if dtype not in want.dtypes:
            raise TensorCheckError(f"{path}: {kind.noun} {name!r} is {dtype}, expected {_either(want.dtypes)}"
                                   f"{kind.dtype_note}")
        if tuple(shape) != want.shape:
            raise TensorCheckError(f"{path}: {kind.noun} {name!r} has shape {list(shape)}, "
                                   f"expected {list(want.shape)}")
    extra = sorted(set(found) - set(table))
    if extra:
        shown = ", ".join(map(repr, extra[:SHOWN_EXTRA]))
        more = f" and {len(extra) - SHOWN_EXTRA} more" if len(extra) > SHOWN_EXTRA else ""
        raise TensorCheckError(f"{path}: unexpected {kind.noun}(s) {shown}{more}")


def check_values(path: Path | str, name: str, array: np.ndarray, kind: TensorKind) -> None:
    """One tensor's values: finite for weights, no NaN for a golden (whose -inf are masked attention)."""
    if kind.finite:
        if not np.isfinite(array).all():
            raise TensorCheckError(f"{path}: {kind.noun} {name!r} has non-finite values (NaN or Inf)")
    elif np.isnan(array).any():
        raise TensorCheckError(f"{path}: {kind.noun} {name!r} holds NaN (a broken fixture)")


def _either(dtypes: tuple[str, ...]) -> str:
    return dtypes[0] if len(dtypes) == 1 else f"{', '.join(dtypes[:-1])} or {dtypes[-1]}"


__all__ = ["DECODING_GOLDEN", "GOLDEN", "TRAINING_GOLDEN", "WEIGHTS", "Expected", "Found", "TensorCheckError",
           "TensorKind", "check_table", "check_values"]
