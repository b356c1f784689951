"""The exceptions that map to parity's exit codes (2: bad input, usage or environment)."""

from __future__ import annotations

EXIT_OK = 0  # every check agrees
EXIT_DISAGREE = 1  # at least one tap of one backend disagrees
EXIT_BAD_INPUT = 2  # bad input, usage or environment


class ParityError(Exception):
    """A user-facing problem: printed as one line, exit code 2, no traceback."""

    exit_code = EXIT_BAD_INPUT


class FixtureError(ParityError):
    """A fixture that cannot be trusted: unreadable, wrong hash, wrong shape, unknown version."""


class BackendUnavailable(ParityError):
    """A backend asked for by name whose dependencies are missing (the message says how to install them)."""


class BackendFailed(ParityError):
    """A backend that crashed, hung or returned something unusable (not a numerical disagreement)."""


class BackendMisbehaved(BackendFailed):
    """Raised by the harness about a backend: it crashed (raised something not parity's), or what it returned
    breaks the contract (harness/backends/boundary.py). A ParityError the backend raises itself stays its own."""
