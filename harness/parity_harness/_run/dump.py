"""Tap dumps: one backend x precision's outputs in a safetensors file, written anywhere, judged later.

A dump holds tensors under "{case}/{tap}" (as the golden files) and string metadata naming the
backend, the precision, the fixture it was computed for (its id, parity_harness/_fixture/identity.py), the
platform and the writer's parity version. `parity run --save-outputs DIR` writes one per backend x
precision it ran; `parity compare DUMP ...` judges dumps against the fixture's goldens exactly as
`parity run` judges live backends. The format and its rules are in docs/dump-format.md.

Safetensors data is little-endian, and the format has no byte-order flag. A tensor written big-endian (its
bytes swapped: correct numbers from a big-endian writer) is bad input, never a disagreement: `byte_swapped`
tells it from numbers that are merely wrong (read as little-endian, a share of its values are no float a
computation gives, subnormal or beyond 1e10, while read with its bytes swapped every value is ordinary), and
`read_dump` refuses it naming the file and the tensor (exit 2). Arrays are handed on in native byte order.
"""

from __future__ import annotations

import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from parity_harness import __version__
from parity_harness._compare.report import BackendRun, Report, read_from
from parity_harness._core.errors import ParityError
from parity_harness._core.input_files import MAX_DUMP_HEADER_BYTES, InputFileError, check_input_file
from parity_harness._core.precision import PRECISIONS, BackendOutput, Precision, unrepresentable
from parity_harness._core.safe_write import write_atomic_with
from parity_harness._core.status import RunStatus
from parity_harness._core.strict_json import StrictJSONError, loads_strict
from parity_harness._fixture.fixture import Fixture
from parity_harness._fixture.identity import fixture_id
from parity_harness._run.runner import add_output, finish_report

FORMAT_NAME = "parity-dump"
FORMAT_VERSION = "1"
REQUIRED_METADATA = ("format", "format_version", "backend", "precision", "fixture_id", "platform", "parity_version")
SAFETENSORS_DTYPES: dict[Precision, str] = {"fp32": "F32", "fp64": "F64", "fp16": "F32", "bf16": "F32"}  # DTYPES
MAX_HEADER = MAX_DUMP_HEADER_BYTES  # bytes (the reference safetensors implementation's own limit is 100 MB)


class DumpError(ParityError):
    """A dump that cannot be judged: unreadable, malformed, or made for another fixture (exit 2)."""


@dataclass
class Dump:
    path: Path
    backend: str
    precision: Precision
    metadata: dict[str, str]
    supported: list[str]  # the taps it holds (or declares in "taps"), in dataflow order
    output: BackendOutput  # {case: {tap: array}}


def platform_text() -> str:
    """Where a dump was computed: OS, release, machine, Python and NumPy versions."""
    return f"{platform.platform()} {platform.machine()}; Python {platform.python_version()}; numpy {np.__version__}"


def dump_name(backend: str, precision: str) -> str:
    """The file name `--save-outputs` uses: "{backend}.{precision}.safetensors", unsafe characters replaced."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', backend)}.{precision}.safetensors"


def check_dump_names(runs: list[tuple[str, str]]) -> None:
    """Refuse (DumpError, exit 2) two backend x precision runs whose dumps would be one file.

    `dump_name` replaces unsafe characters, so 'a/b' and 'a_b' would write the same file, and the
    second would silently replace the first: `parity compare DIR/*` would then judge one of them
    only. Names that differ only in case collide too, on macOS's and Windows' file systems.
    """
    seen: dict[str, str] = {}
    for backend, precision in runs:
        name = dump_name(backend, precision)
        other = seen.setdefault(name.casefold(), backend)
        if other != backend:
            files = {dump_name(other, precision), name}
            where = (f"would both write {name!r} (characters other than letters, digits, '.', '_' and '-' become '_')"
                     if len(files) == 1 else
                     f"would write {' and '.join(map(repr, sorted(files)))}, one file where case is not significant "
                     "(macOS, Windows)")
            raise DumpError(f"--save-outputs: backends {other!r} and {backend!r} {where}: the second dump would "
                            "replace the first; save the outputs of one of them in another run")


def dump_metadata(backend: str, precision: str, fid: str, supported: list[str]) -> dict[str, str]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "backend": backend,
        "precision": precision,
        "fixture_id": fid,
        "platform": platform_text(),
        "parity_version": __version__,
        "writer": "parity run --save-outputs",
        "taps": ",".join(supported),
    }


def check_writable(directory: Path, names: list[str] | None = None) -> None:
    """Create `directory` if needed and prove a file can be written there; DumpError (exit 2) if not.

    `names`: the dumps the run will write there, each checked by `check_dump_target` (never through a
    link, never over a file that is not a parity dump).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".parity-write-check-"):
            pass
    except OSError as exc:
        raise DumpError(f"--save-outputs {directory}: cannot write there ({exc.strerror or exc})") from None
    for name in names or []:
        check_dump_target(directory / name)


def check_dump_target(path: Path) -> None:
    """DumpError unless `path` is free for a dump: absent, or a regular file that is a parity dump.

    A dump is written as a plain file in its directory: a symlink there (to a golden file, to
    /dev/null) is refused, not followed, and a file that is not a parity dump is never overwritten
    (docs/security.md, "Files"). Checked before the run and again just before each dump is written.
    """
    if os.path.islink(path):
        raise DumpError(f"--save-outputs: {path} is a symbolic link; dumps are written as plain files, never "
                        "through a link (remove it, or save to another directory)")
    if not os.path.lexists(path):
        return
    try:
        meta = read_header(path).get("__metadata__")
    except DumpError as exc:
        why = str(exc).removeprefix(f"{path}: ")
        raise DumpError(f"--save-outputs: {path} exists and is not a parity dump ({why}); parity never overwrites "
                        "a file it did not write") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DumpError(f"--save-outputs: {path} exists and is not a parity dump (no '{FORMAT_NAME}' metadata); "
                        "parity never overwrites a file it did not write")


def write_dump(
    path: Path, backend: str, precision: Precision, fixture: Fixture, fid: str, output: BackendOutput,
    supported: list[str],
) -> None:
    """Write one backend x precision's output: every supported tap it returned as an array, for every case."""
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    for case in fixture.cases:
        taps = output.get(case.name, {})
        for tap in fixture.tap_names:
            value = taps.get(tap) if tap in supported else None
            if isinstance(value, np.ndarray):  # anything else is left out: "missing", as in the run
                tensors[f"{case.name}/{tap}"] = np.ascontiguousarray(value)
    meta = dump_metadata(backend, precision, fid, supported)
    check_dump_target(path)  # again: the directory may have changed during the run
    try:  # through a temporary file renamed into place (parity_harness/_core/safe_write.py)
        write_atomic_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), "dump")
    except (ValueError, TypeError) as exc:
        raise DumpError(f"{path}: cannot write the dump ({exc})") from None


def save_outputs(report: Report, fixture: Fixture, directory: Path) -> list[Path]:
    """One dump per backend x precision of a run's report (`parity run --save-outputs DIR`)."""
    paths = []
    for (backend, precision), output in report.outputs.items():
        path = directory / dump_name(backend, precision)
        write_dump(path, backend, cast(Precision, precision), fixture, report.fixture_id, output,
                   report.supported.get((backend, precision), []))
        paths.append(path)
    return paths


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file; DumpError naming the file if it is not one."""
    try:
        check_input_file(path, "dump")  # a regular file (a FIFO or a device would hang the read)
    except InputFileError as exc:
        raise DumpError(str(exc)) from None
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DumpError(f"{path}: not a safetensors file ({len(head)} bytes, too short for a header)")
            n = int.from_bytes(head, "little")
            size = os.fstat(f.fileno()).st_size
            if n > size - 8:
                raise DumpError(f"{path}: not a safetensors file (header length {n} is beyond the file's {size} bytes)")
            if n > MAX_HEADER:  # refused before it is read or parsed
                raise DumpError(f"{path}: dump header of {n} bytes, more than the {MAX_HEADER} a dump's header "
                                "may have (docs/security.md, Files)")
            header = loads_strict(f.read(n).decode("utf-8"))
    except FileNotFoundError:
        raise DumpError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DumpError(f"{path}: is a directory, not a dump") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, StrictJSONError) as exc:
        raise DumpError(f"{path}: not a safetensors file (header is not strict UTF-8 JSON: {exc})") from None
    if not isinstance(header, dict):
        raise DumpError(f"{path}: not a safetensors file (header is not a JSON object)")
    return header


def check_metadata(path: Path, header: dict[str, Any], fid: str) -> dict[str, str]:
    """The dump's `__metadata__`, checked: format, version, backend, precision, and the fixture it was made for."""
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise DumpError(f"{path}: no parity dump metadata (a safetensors '__metadata__' of strings); "
                        "see docs/dump-format.md")
    if meta.get("format") != FORMAT_NAME:
        raise DumpError(f"{path}: not a parity dump (metadata format is {meta.get('format')!r}, "
                        f"expected {FORMAT_NAME!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DumpError(f"{path}: unknown dump format version {meta.get('format_version')!r} "
                        f"(this parity reads version {FORMAT_VERSION})")
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    if missing:
        raise DumpError(f"{path}: metadata lacks {', '.join(map(repr, missing))}")
    if not meta["backend"].strip() or any(ch in meta["backend"] for ch in "\n\r\t"):
        raise DumpError(f"{path}: metadata 'backend' {meta['backend']!r} must be a non-empty one-line name")
    if meta["precision"] not in PRECISIONS:
        raise DumpError(f"{path}: metadata 'precision' is {meta['precision']!r}, "
                        f"expected one of {', '.join(PRECISIONS)}")
    if meta["fixture_id"] != fid:
        raise DumpError(f"{path}: made for another fixture (its fixture_id is {meta['fixture_id'][:19]}..., "
                        f"this fixture's is {fid[:19]}...)")
    return cast(dict[str, str], meta)


def _declared_taps(path: Path, meta: dict[str, str], fixture: Fixture) -> list[str] | None:
    if "taps" not in meta:
        return None
    taps = [t for t in meta["taps"].split(",") if t]
    unknown = [t for t in taps if t not in fixture.tap_names]
    if unknown:
        raise DumpError(f"{path}: metadata 'taps' names unknown tap {unknown[0]!r}")
    return [t for t in fixture.tap_names if t in taps]


def read_dump(path: Path, fixture: Fixture, fid: str) -> Dump:
    """Read and check one dump against the fixture; DumpError (exit 2) with one line naming the file."""
    header = read_header(path)
    meta = check_metadata(path, header, fid)
    precision = cast(Precision, meta["precision"])
    want_dtype = SAFETENSORS_DTYPES[precision]
    cases = {c.name: c for c in fixture.cases}
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if not entries:
        raise DumpError(f"{path}: holds no tensors")
    held: dict[str, set[str]] = {c: set() for c in cases}
    for key, info in entries.items():
        case, _, tap = key.partition("/")
        if case not in cases or tap not in fixture.tap_names:
            raise DumpError(f"{path}: unknown key {key!r} (keys are '{{case}}/{{tap}}' of this fixture)")
        if not isinstance(info, dict) or info.get("dtype") != want_dtype:
            got = info.get("dtype") if isinstance(info, dict) else info
            raise DumpError(f"{path}: tensor {key!r} is {got}, expected {want_dtype} for a {precision} dump")
        shape = fixture.tap_shape(tap, cases[case])
        kept = fixture.golden_shape(tap, cases[case])  # a tap with "rows": its last positions, as the golden
        if info.get("shape") not in (list(shape), list(kept)):
            also = f" or {list(kept)}" if kept != shape else ""
            raise DumpError(f"{path}: tensor {key!r} has shape {info.get('shape')}, expected {list(shape)}{also}")
        held[case].add(tap)
    empty = [c for c, taps in held.items() if not taps]
    if empty:
        raise DumpError(f"{path}: holds no tensor for case {empty[0]!r}")
    declared = _declared_taps(path, meta, fixture)
    holds = set().union(*held.values())
    if declared is not None:
        extra = sorted(holds - set(declared))
        if extra:
            raise DumpError(f"{path}: holds tap {extra[0]!r}, which its metadata 'taps' does not list")
    supported = declared if declared is not None else [t for t in fixture.tap_names if t in holds]
    output = _load_tensors(path, fixture)
    for case, taps in output.items():  # written big-endian: a malformed file, before any value is judged
        for tap, array in taps.items():
            if byte_swapped(array):
                raise DumpError(f"{path}: tensor '{case}/{tap}' was written big-endian (read as safetensors' "
                                "little-endian its values are subnormal or beyond 1e10, its bytes swapped they are "
                                "ordinary numbers): write the data little-endian (docs/dump-format.md)")
    for case, taps in output.items():  # an fp16/bf16 dump holds float32 tensors of that precision's values
        for tap, array in taps.items():
            index = unrepresentable(array, precision)
            if index is not None:
                raise DumpError(f"{path}: tensor '{case}/{tap}' holds {float(array[index])!r} at {list(index)}, not a "
                                f"{precision} value (a {precision} dump holds float32 tensors of {precision} values)")
    return Dump(path, meta["backend"], precision, meta, supported, output)


# The magnitudes of the values a computation of this model gives, by dtype: zero, infinities (masked scores), and
# normal numbers up to 1e10. A tensor's bytes read in the wrong order give, for each value, an exponent taken
# from its lowest mantissa bits: about a third to a half of them fall outside.
_ORDINARY = {np.dtype(np.float32): (float(np.finfo(np.float32).tiny), 1e10),
             np.dtype(np.float64): (1e-300, 1e10)}
SWAPPED_SHARE = 0.125  # the share of non-zero values read out of the ordinary that marks a tensor byte-swapped


def _ordinary(array: np.ndarray) -> np.ndarray:
    """Per cell (like `array`): zero, an infinity, or a normal number of magnitude at most 1e10."""
    low, high = _ORDINARY[array.dtype.newbyteorder("=")]
    magnitude = np.abs(array)  # like array
    return (array == 0) | np.isinf(array) | ((magnitude >= low) & (magnitude <= high))  # type: ignore[no-any-return]


def byte_swapped(array: np.ndarray) -> bool:
    """True when `array` (float32 or float64, as read) holds numbers written in the other byte order: with its bytes
    swapped every value is ordinary (`_ORDINARY`), as read at least `SWAPPED_SHARE` of its non-zero values are not.
    A wrong result in the right order is not swapped: its swapped bytes are not all ordinary."""
    if array.dtype.newbyteorder("=") not in _ORDINARY or array.size == 0:
        return False
    with np.errstate(all="ignore"):
        nonzero = int(np.count_nonzero(array))
        odd = array.size - int(np.count_nonzero(_ordinary(array)))
        if nonzero == 0 or odd < SWAPPED_SHARE * nonzero:
            return False
        return bool(_ordinary(array.byteswap()).all())


def _load_tensors(path: Path, fixture: Fixture) -> BackendOutput:
    from safetensors import SafetensorError, safe_open

    output: BackendOutput = {c.name: {} for c in fixture.cases}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                case, _, tap = key.partition("/")
                array = f.get_tensor(key)
                if not array.dtype.isnative:  # safetensors' little-endian on a big-endian host: native order
                    array = array.astype(array.dtype.newbyteorder("="))
                output[case][tap] = array
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise DumpError(f"{path}: not a readable safetensors file ({exc})") from None
    return output


def compare_dumps(fixture: Fixture, paths: list[Path], budget: bool = True) -> Report:
    """A Report judging every dump against the fixture's goldens, as `run_parity` judges live backends.

    Two dumps of the same backend x precision are refused (exit 2): which one would the verdict be about?
    """
    fid = fixture_id(fixture)
    dumps = [read_dump(p, fixture, fid) for p in paths]
    seen: dict[tuple[str, str], Path] = {}
    for d in dumps:
        key = (d.backend, d.precision)
        if key in seen:
            raise DumpError(f"{d.path}: a second dump of {d.backend} {d.precision} (the first is {seen[key]})")
        seen[key] = d.path
    report = Report(str(fixture.root), fixture_id=fid, tolerances=fixture.tolerance_summary(), measure_budget=budget,
                    read_from=read_from([fixture.root], "the fixture directory")
                    | read_from([d.path for d in dumps], "a dump it judged"))
    for d in dumps:
        report.runs.append(BackendRun(d.backend, d.precision, 0.0, RunStatus.DUMP, str(d.path)))
        add_output(report, fixture, d.backend, d.precision, d.output, d.supported)
    finish_report(report, fixture)
    return report
