"""Report paths: checked writable before any backend runs, and written with one-line errors.

`parity run --json/--junit/--markdown/--plot PATH` and `$GITHUB_STEP_SUMMARY` are opened for
appending (nothing truncated; a file created by the check is removed again) before the fixture's
backends start, so a typo in a path costs nothing and never follows a PASS line with a traceback.
A failure while writing after the run (a full disk: `/dev/full`) is one line, exit 2, too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from harness.errors import ParityError


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_writable(path: Path, label: str) -> None:
    """ParityError (one line) unless `path` can be opened for writing; leaves no new file behind."""
    if path.is_dir():
        raise ParityError(f"{path}: cannot write the {label} (it is a directory)")
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise ParityError(f"{path}: cannot write the {label} ({_why(exc)})") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def check_report_paths(paths: dict[str, str | None]) -> None:
    """Every report path given (label -> path) and $GITHUB_STEP_SUMMARY, when --markdown is given."""
    given = {label: Path(p) for label, p in paths.items() if p}
    seen: dict[str, str] = {}
    for label, path in given.items():
        key = os.path.realpath(path)
        if key in seen and not path.is_char_device():
            raise ParityError(f"{path}: given for both the {seen[key]} and the {label}")
        seen[key] = label
        check_writable(path, label)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and "Markdown summary" in given:
        check_writable(Path(summary), "$GITHUB_STEP_SUMMARY")


def write_report_text(path: Path, text: str, label: str, append: bool = False) -> None:
    """Write (or append) a report; ParityError (one line) if the system refuses."""
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise ParityError(f"{path}: cannot write the {label} ({_why(exc)})") from None
