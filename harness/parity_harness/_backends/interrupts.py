"""Interrupts held back while process state is swapped: a Ctrl-C or SIGTERM that comes inside
`interrupts_held` is raised when the last thread leaves it, not in the middle.

For code that swaps process state and undoes it in a `finally` (quiet.silenced: sys.stderr and fd 2 to a
temporary file): an interrupt between the swap and the `try` that undoes it would leave stderr pointing at the
file, and the command's `parity: interrupted` line would be lost (a SIGTERM test saw exit 130 and an empty
stderr, once in five full runs). guard's signal handler asks `defer` first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_held = 0  # > 0: inside `interrupts_held`
_pending: Callable[[], None] | None = None  # how to raise the interrupt that came while held


def defer(raise_interrupt: Callable[[], None]) -> bool:
    """For a signal handler: True if the interrupt is held (`raise_interrupt` runs when the hold ends)."""
    global _pending
    if _held:
        _pending = raise_interrupt
        return True
    return False


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Inside, an interrupt waits; it is raised as the last thread leaves."""
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
    if not _held and _pending is not None:
        raise_interrupt, _pending = _pending, None
        raise_interrupt()
