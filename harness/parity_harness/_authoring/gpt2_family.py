"""The GPT-2 family's authoring code: what making a GPT-2 fixture needs beyond its reference (the family table's
`authoring` module, `parity_reference/families/gpt2.json`).

- `graph_constants` and `constants_in_use`: an exported GPT-2 graph needs no constant besides its weights (the
  sinusoidal table, when the config has one, is computed in the graph as the reference computes it).
- `truth_taps`: the GPT-2 forward in mpmath (`truth.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from parity_harness._authoring.truth import truth_taps

if TYPE_CHECKING:
    from parity_reference.config import GPTConfig


def graph_constants(config: GPTConfig) -> dict[str, Any]:
    """No constants beyond the weights."""
    return {}


def constants_in_use(constants: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """Nothing to put in place while tracing."""
    return contextlib.nullcontext()


__all__ = ["constants_in_use", "graph_constants", "truth_taps"]
