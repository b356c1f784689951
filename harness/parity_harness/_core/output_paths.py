"""Output paths: the one place they are checked (before any work) and written (atomically, one-line errors).

Every path parity writes a report or a file to (`--json`, `--junit`, `--markdown`, `--plot`,
`$GITHUB_STEP_SUMMARY`, `--save-outputs DIR`, `selftest --json`) is checked here before the
fixture's backends start:

- given as an empty string: refused (`--json ""` once silently wrote nothing);
- resolved (`os.path.realpath`, symlinks followed), it must not be an input of the command (the
  fixture directory or a file in it, a dump being compared, a report being merged), the same file
  as another output, or a dump the same command writes (inside `--save-outputs DIR`);
- it must be writable: opened for appending (nothing truncated; a file the check creates is
  removed again; a FIFO without a reader is refused, not waited for).

A typo in a path costs nothing and never follows a PASS line with a traceback. Reports are then
written through parity_harness/_core/safe_write.py (a temporary file renamed into place); a failure while
writing after the run (a full disk: `/dev/full`) is one line, exit 2, too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from parity_harness._core.errors import ParityError
from parity_harness._core.input_files import MAX_STEP_SUMMARY_BYTES
from parity_harness._core.safe_write import append_text_atomic, write_text_atomic

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


def check_writable(path: Path, label: str) -> None:
    """ParityError (one line) unless `path` can be opened for writing; leaves no new file behind."""
    try:
        if os.path.isdir(path):
            raise ParityError(f"{path}: cannot write the {label} (it is a directory)")
        existed = os.path.lexists(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        os.close(fd)
    except OSError as exc:
        why = "a FIFO nobody reads" if exc.errno == errno.ENXIO else _why(exc)
        raise ParityError(f"{path}: cannot write the {label} ({why})") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def _refuse_input(option: str, given: str, real: Path, inputs: Mapping[Path, str],
                  input_dirs: Mapping[Path, str]) -> None:
    """ParityError when the output `real` is an input of the command or lies in an input directory."""
    if real in inputs:
        raise ParityError(f"{option} {given}: is {inputs[real]}, an input of this command; an output never "
                          "overwrites what parity reads")
    for directory, what in input_dirs.items():
        if real == directory or real.is_relative_to(directory):
            raise ParityError(f"{option} {given}: is inside {what} {directory}; an output never overwrites "
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
        if dump_dir is not None and real.parent == _real(Path(dump_dir)) and real.name.endswith(DUMP_SUFFIXES):
            raise ParityError(f"{option} {text}: is where --save-outputs {dump_dir} writes a dump")
        if real in seen and not _is_device(real):
            raise ParityError(f"{path}: given for both the {LABELS.get(seen[real], seen[real])} and the {label}")
        seen[real] = option
        check_writable(path, label)


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


__all__ = ["check_output_paths", "check_report_paths", "check_writable", "output_inputs", "write_report_text"]
