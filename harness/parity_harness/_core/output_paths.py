"""Output paths: the one place they are checked (before any work) and written (atomically, one-line errors).

Every path parity writes a report or a file to (`--json`, `--junit`, `--markdown`, `--plot`,
`$GITHUB_STEP_SUMMARY`, `--save-outputs DIR`, `selftest --json`) is checked here before the
fixture's backends start:

- given as an empty string: refused (`--json ""` once silently wrote nothing);
- resolved (`os.path.realpath`, symlinks followed), it must not be an input of the command (the
  fixture directory or a file in it, a dump being compared, a report being merged), the same file
  as another output, or a dump the same command writes (inside `--save-outputs DIR`);
- an existing file there must be one parity wrote (a report, a picture, the self-test's JSON: each
  recognised by its first bytes, `written_by_parity`) or empty: parity never overwrites a file it did
  not write;
- it must be writable as it will be written (`safe_write.check_target`): its directory takes a new
  file (the temporary file renamed into place), an existing file opens for appending (nothing
  truncated), `/dev/stdout` and its kin are open for writing, a FIFO has a reader (refused, not
  waited for, when it has none; its descriptor kept for the write, so the reader sees no early end).

A typo in a path costs nothing and never follows a PASS line with a traceback. Reports are then
written through parity_harness/_core/safe_write.py (a temporary file renamed into place); a failure while
writing after the run (a full disk: `/dev/full`) is one line, exit 2, too.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from parity_harness._core.errors import ParityError
from parity_harness._core.input_files import MAX_STEP_SUMMARY_BYTES
from parity_harness._core.safe_write import append_text_atomic, check_target, is_stream, write_text_atomic

STEP_SUMMARY = "$GITHUB_STEP_SUMMARY"
# What each report option writes, for messages ("cannot write the JSON report").
LABELS = {"--json": "JSON report", "--junit": "JUnit file", "--markdown": "Markdown summary", "--plot": "picture",
          STEP_SUMMARY: STEP_SUMMARY, "--save-outputs": "dumps"}
DUMP_SUFFIXES = (".fp32.safetensors", ".fp64.safetensors")  # the names `--save-outputs DIR` writes


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _is_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


# What every kind of file parity writes starts with (or carries near its start), so that an existing file at
# an output path can be told to be parity's own: a JSON report or the self-test's JSON ("schema": "parity-..."
# first), JUnit XML, the Markdown summary, a picture (its title, _views/plots.py). Dumps carry their own
# metadata (parity_harness/_run/dump.py, `check_dump_target`).
PICTURE_TITLE = "parity"  # every picture's title in its metadata (PNG tEXt, SVG <dc:title>; _views/plots.py)
_OWN_HEAD = re.compile(rb'\A(?:\{\s*"schema":\s*"parity-|<\?xml[^>]*>\s*<testsuites name="parity"|## parity\b'
                       rb'|parity: fixture )')
_OWN_MARKS = (b"tEXtTitle\x00" + PICTURE_TITLE.encode(), f"<dc:title>{PICTURE_TITLE}</dc:title>".encode())
_SNIFF_BYTES = 64 << 10


def written_by_parity(path: Path) -> bool:
    """Whether the regular file `path` is one parity wrote (or is empty: nothing in it to lose)."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    return not head or _OWN_HEAD.match(head) is not None or any(mark in head for mark in _OWN_MARKS)


def _refuse_foreign(option: str, given: str, real: Path) -> None:
    """ParityError when an existing file at the output path is not one parity wrote: it is never overwritten."""
    if is_stream(Path(given)):  # /dev/stderr and its kin: appended to, never replaced
        return
    try:
        if not stat.S_ISREG(os.stat(real).st_mode) or written_by_parity(real):
            return
    except OSError:
        return  # absent, or unreadable: check_target says what is wrong with it
    raise ParityError(f"{option} {given}: exists and is not a file parity wrote; parity never overwrites a file it "
                      "did not write (remove it, or give another path)")


def _refuse_input(option: str, given: str, real: Path, inputs: Mapping[Path, str],
                  input_dirs: Mapping[Path, str]) -> None:
    """ParityError when the output `real` is an input of the command or lies in an input directory."""
    if real in inputs:
        raise ParityError(f"{option} {given}: is {inputs[real]}, an input of this command; an output never "
                          "overwrites what parity reads")
    for directory, what in input_dirs.items():
        if real == directory or real.is_relative_to(directory):
            where = "is" if real == directory and not directory.is_dir() else "is inside"
            raise ParityError(f"{option} {given}: {where} {what} {directory}; an output never overwrites "
                              "what parity reads")


def check_output_paths(
    outputs: Mapping[str, str | None],
    inputs: Mapping[str | Path, str] | None = None,
    input_dirs: Mapping[str | Path, str] | None = None,
    dump_dir: str | None = None,
) -> None:
    """Check every output path of one command before any work (see the module docstring).

    `outputs`: option -> the path as given (None: not given), e.g. {"--json": "r.json"};
    `$GITHUB_STEP_SUMMARY` is checked too when `--markdown` is given. `inputs`: input files ->
    what they are ("the dump being compared"); `input_dirs`: directories every file of which is an
    input ("the fixture directory"). `dump_dir`: the `--save-outputs` directory, if any.
    """
    ins = {_real(Path(p)): what for p, what in (inputs or {}).items()}
    in_dirs = {_real(Path(p)): what for p, what in (input_dirs or {}).items()}
    given = {option: p for option, p in outputs.items() if p is not None}
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and given.get("--markdown"):
        given[STEP_SUMMARY] = summary
    seen: dict[Path, str] = {}
    if dump_dir is not None:
        if not dump_dir:
            raise ParityError("--save-outputs: an empty path; give the directory to write the dumps to")
        _refuse_input("--save-outputs", dump_dir, _real(Path(dump_dir)), ins, in_dirs)
    for option, text in given.items():
        label = LABELS.get(option, option)
        if not text:
            raise ParityError(f"{option}: an empty path; give the file to write the {label} to")
        path = Path(text)
        real = _real(path)
        _refuse_input(option, text, real, ins, in_dirs)
        if option != STEP_SUMMARY:  # appended to, never replaced
            _refuse_foreign(option, text, real)
        if dump_dir is not None and real.parent == _real(Path(dump_dir)) and real.name.endswith(DUMP_SUFFIXES):
            raise ParityError(f"{option} {text}: is where --save-outputs {dump_dir} writes a dump")
        if real in seen and not _is_device(real):
            raise ParityError(f"{path}: given for both the {LABELS.get(seen[real], seen[real])} and the {label}")
        seen[real] = option
        check_target(path, label)  # writable as safe_write writes it; leaves nothing behind


def check_report_paths(paths: Mapping[str, str | None]) -> None:
    """Outputs without inputs to protect (kept for callers that have none): `check_output_paths(paths)`."""
    check_output_paths(paths)


def write_report_text(path: Path, text: str, label: str, append: bool = False) -> None:
    """Write (or append) a report atomically (_core/safe_write.py); ParityError (one line) if the system refuses."""
    if append:
        append_text_atomic(path, text, label, max_bytes=MAX_STEP_SUMMARY_BYTES)
    else:
        write_text_atomic(path, text, label)


def output_inputs(paths: Iterable[str | Path], what: str) -> dict[str | Path, str]:
    """{path: what} for `check_output_paths`' inputs, e.g. the dumps of `parity compare`."""
    return {p: what for p in paths}


__all__ = ["check_output_paths", "check_report_paths", "output_inputs", "write_report_text"]
