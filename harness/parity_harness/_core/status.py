"""The statuses parity reports, as enums: a check's, a greedy-token row's, a backend run's, a command's verdict.

They are `StrEnum`s: each member is its own string ("ok", "fail", ...), so JSON reports, comparisons
and old readers see the same values as before, while the code names a closed set.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """The verdict of one check (a tap of a case, a decoding step) and of a tap summary or budget row."""

    OK = "ok"  # within tolerance
    FAIL = "fail"  # out of tolerance, or structurally wrong (shape, dtype, NaN, missing)
    NOT_SUPPORTED = "not_supported"  # the backend does not produce this tap: reported, not failed


class GreedyStatus(StrEnum):
    """A backend's greedy tokens on one prompt against the golden's."""

    OK = "ok"  # the same tokens
    FAIL = "fail"  # another token where the logits are out of tolerance
    NEAR_TIE = "near_tie"  # another token where the logits agree: the golden's top two are within tolerance


class RunStatus(StrEnum):
    """One backend x precision run of a report."""

    RAN = "ran"  # run live and judged
    NOT_SUPPORTED = "not_supported"  # not run: the precision is not one it computes in, or it declined
    DUMP = "dump"  # its outputs were read from a dump (`parity compare`)
    CRASHED = "crashed"  # it failed mid-run (message: the error line); the run stopped there, never a pass


class Verdict(StrEnum):
    """What a command found, the only thing a layer below the CLI returns for it (_cli/exit_codes.py: 0, 1, 2)."""

    AGREE = "agree"  # every check compared agrees
    DISAGREE = "disagree"  # at least one check disagrees
    NOTHING_COMPARED = "nothing_compared"  # every tap of every run 'not supported', or no run: never a pass
    CRASHED = "crashed"  # a backend failed mid-run: the report keeps the runs before it, never a pass

    @classmethod
    def of(cls, agrees: bool) -> Verdict:
        return cls.AGREE if agrees else cls.DISAGREE
