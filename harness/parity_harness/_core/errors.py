"""parity's exceptions: every problem that is not a numerical verdict (the CLI exits 2 on any of them)."""

from __future__ import annotations


class ParityError(Exception):
    """A user-facing problem: printed as one line, exit code 2 (cli/exit_codes.py), no traceback."""


class FixtureError(ParityError):
    """A fixture that cannot be trusted: unreadable, wrong hash, wrong shape, unknown version."""


class BackendUnavailable(ParityError):
    """A backend asked for by name whose dependencies are missing (the message says how to install them)."""


class BackendFailed(ParityError):
    """A backend that crashed, hung or returned something unusable (not a numerical disagreement)."""


class BackendMisbehaved(BackendFailed):
    """Raised by the harness about a backend: it crashed (raised something not parity's), or what it returned
    breaks the contract (_backends/boundary.py). A ParityError the backend raises itself stays its own.

    `detail`: for a crash, the backend's full traceback (`parity run -v` prints it, sanitized); "" otherwise."""

    detail: str = ""
