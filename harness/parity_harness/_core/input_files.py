"""Reading input files safely: regular files only, under a size cap, checked with `os.stat` before reading.

A FIFO or a device named as an input once hung parity (`merge /dev/zero`, a manifest listing
`/dev/zero`), and a huge file cost minutes and gigabytes before it was refused. Every input parity
parses (a manifest, a JSON report, a dump's header) is checked here first; the caps are in one
place, listed in docs/security.md ("Files"). Every refusal is an `InputFileError`, one line naming
the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from parity_harness._core.errors import ParityError

# A manifest is a few kB (the toy 9 kB, the stress fixture 19 kB); a GPT-2-small one, with its
# 50,257-word vocabulary, under 1 MiB.
MAX_MANIFEST_BYTES = 4 << 20
# A JSON report of the toy: 1.9 MB for 2 backends x 2 tiers, ~10 MB with every backend (GPT-2 small: as many rows).
MAX_REPORT_BYTES = 64 << 20
# A dump's safetensors header: ~100 bytes per tensor, 51 kB for the toy's 516 tensors.
MAX_DUMP_HEADER_BYTES = 8 << 20
# The Markdown step summary parity appends to ($GITHUB_STEP_SUMMARY; GitHub itself takes 1 MiB per step).
MAX_STEP_SUMMARY_BYTES = 16 << 20


class InputFileError(ParityError):
    """An input that is not a readable regular file under its cap (exit 2); one line naming it."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: Path, what: str, max_bytes: int | None = None) -> int:
    """The size of `path` when it is a regular file of at most `max_bytes`; InputFileError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{path}: file not found") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{path}: the {what} must be a regular file, this is {_kind(st.st_mode)}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(f"{path}: the {what} is {st.st_size} bytes, more than the {max_bytes} "
                             f"a {what} may have (docs/security.md, Files)")
    return st.st_size


def read_input_bytes(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of a checked input file (`check_input_file`), never more than `max_bytes`."""
    check_input_file(path, what, max_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    if len(data) > max_bytes:  # it grew between the check and the read
        raise InputFileError(f"{path}: the {what} is more than the {max_bytes} bytes a {what} may have")
    return data


__all__ = ["MAX_DUMP_HEADER_BYTES", "MAX_MANIFEST_BYTES", "MAX_REPORT_BYTES", "MAX_STEP_SUMMARY_BYTES",
           "InputFileError", "check_input_file", "read_input_bytes"]
