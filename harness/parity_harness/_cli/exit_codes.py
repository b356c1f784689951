"""The one place parity decides exit codes, from the verdicts the layers below return.

0: every check compared agrees; 1: a disagreement; 2: bad input, usage or environment (a `ParityError`,
a run that compared nothing, and a run a backend crashed in: never a silent pass); 130: interrupted.
Everything below the CLI returns a `Verdict` (`parity_harness._core.status`) or raises, and never picks
a number: the command line maps it here, and so does the JSON report's `exit_code` field, which says
what `parity` exits with for that report.
"""

from __future__ import annotations

from parity_harness._core.status import Verdict

AGREE = 0  # every check compared agrees
DISAGREE = 1  # at least one check of one backend disagrees
BAD_INPUT = 2  # bad input, usage or environment; or nothing was compared
INTERRUPTED = 130  # Ctrl-C

_BY_VERDICT: dict[Verdict, int] = {
    Verdict.AGREE: AGREE,
    Verdict.DISAGREE: DISAGREE,
    Verdict.NOTHING_COMPARED: BAD_INPUT,
    Verdict.CRASHED: BAD_INPUT,  # the report of the runs before the crash is kept, and is not a pass
}


def for_verdict(verdict: Verdict) -> int:
    """The exit code of a verdict; anything that is not a Verdict is bad input (2), never a pass."""
    return _BY_VERDICT.get(verdict, BAD_INPUT) if isinstance(verdict, Verdict) else BAD_INPUT


def for_command(result: object) -> int:
    """A command's return value as an exit code: only a Verdict (or a code 0/1 of a child process) may give 0 or 1."""
    if isinstance(result, Verdict):
        return for_verdict(result)
    return BAD_INPUT


__all__ = ["AGREE", "BAD_INPUT", "DISAGREE", "INTERRUPTED", "for_command", "for_verdict"]
