"""Reading a fixture's data files: sha256, safetensors as NumPy arrays, read-only copies; the checked reader.

The primitives `Fixture` (fixture.py) and the decoding goldens' reader (decoding.py) share, in a module of their
own so that neither imports the other. `TensorFile` reads a file one tensor at a time, each straight into
immutable bytes (no second copy), from a header it checked itself (`open_tensor_file`). `open_checked` and
`read_checked` are the one checked reader of golden and weight tensors: the header against what is expected,
then each tensor's values, by the reference's check (parity_reference/tensor_check.py), whose error becomes a
`FixtureError` here and nowhere else (`fixture_errors`).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.strict_json import StrictJSONError, loads_strict
from parity_reference.tensor_check import Expected, TensorCheckError, TensorKind, check_table, check_values


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # in chunks: a GPT-2-sized file is hundreds of MB
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy backed by immutable bytes: `flags.writeable = True` cannot undo it."""
    data = np.ascontiguousarray(array)
    return np.frombuffer(data.tobytes(), dtype=data.dtype).reshape(data.shape)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as numpy arrays; FixtureError if the file is unreadable."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        # pread, not mmap: a mapped file's touched pages count in the process's RSS until it is closed.
        return dict(load_file(str(path), backend="pread"))
    except FileNotFoundError:
        raise FixtureError(f"{path}: file not found") from None
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise FixtureError(f"{path}: not a readable safetensors file ({exc})") from None


# A safetensors header's dtypes: their NumPy names (bfloat16 and float8 by their usual names) and item sizes.
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1), "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "I16": ("int16", 2), "U16": ("uint16", 2), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "I32": ("int32", 4), "U32": ("uint32", 4), "F32": ("float32", 4),
    "I64": ("int64", 8), "U64": ("uint64", 8), "F64": ("float64", 8),
}
_NUMPY_READABLE = {"bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32", "int64",
                   "uint64", "float64"}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


@dataclass(frozen=True)
class TensorSpan:
    """Where one tensor of a safetensors file is, from its checked header."""

    dtype: str  # NumPy's name for it (`SAFETENSORS_DTYPES`)
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file
    nbytes: int  # prod(shape) x the item size


@dataclass(frozen=True)
class TensorFile:
    """A safetensors file's checked table of contents, and the file's identity when it was read.

    `reading()` opens the file again, refuses it if it is no longer the same file (device, inode, size,
    modification and change times), and reads tensors one at a time: each is read (unbuffered) into a
    `bytes` object and wrapped by `np.frombuffer`, so the array is read-only and `flags.writeable = True`
    raises (its memory is immutable), with no copy after the read.
    """

    path: Path
    tensors: Mapping[str, TensorSpan]  # a read-only mapping
    identity: tuple[int, ...]

    @contextmanager
    def reading(self) -> Iterator[Callable[[str], np.ndarray]]:
        """The file open, checked to be the one whose header was read: `read(name)` gives one tensor."""
        with _open_read(self.path) as f:
            if file_identity(os.fstat(f.fileno())) != self.identity:
                raise FixtureError(f"{self.path}: the file changed since it was checked (size, inode or times "
                                   "differ); it may not change while parity runs")
            yield lambda name: self._read(f, name)

    def _read(self, f: BinaryIO, name: str) -> np.ndarray:
        span = self.tensors[name]
        if span.dtype not in _NUMPY_READABLE:
            raise FixtureError(f"{self.path}: tensor {name!r} is {span.dtype}, which NumPy cannot hold")
        data = _read_exact(f, span.nbytes, span.offset, self.path, name)
        return np.frombuffer(data, dtype=np.dtype(span.dtype).newbyteorder("<")).reshape(span.shape)


def file_identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells one state of a file from another without reading it: device, inode, size, mtime, ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open_read(path: Path) -> BinaryIO:
    """The file opened unbuffered (a read is one system call into its own `bytes`); FixtureError if it cannot be."""
    try:
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise FixtureError(f"{path}: file not found") from None
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_exact(f: BinaryIO, n: int, offset: int, path: Path, what: str) -> bytes:
    """`n` bytes at `offset` as one immutable `bytes` (a short read continues; an early end is an error)."""
    try:
        f.seek(offset)
        data = f.read(n)
        if len(data) == n:
            return data
        parts, got = [data], len(data)
        while got < n:
            more = f.read(n - got)
            if not more:
                raise FixtureError(f"{path}: not a readable safetensors file ({what} ends past the end of the file)")
            parts.append(more)
            got += len(more)
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    return b"".join(parts)


def open_tensor_file(path: Path) -> TensorFile:
    """Read and check a safetensors file's header as the safetensors library does; FixtureError naming the
    file (and the tensor) otherwise: an 8-byte little-endian header length within the file, a JSON object
    (no repeated key), each tensor's dtype known, shape a list of non-negative integers, data_offsets
    [begin, end] with end - begin its size in bytes, and the tensors tiling the data after the header
    exactly (no gap, no overlap, nothing past the end)."""
    with _open_read(path) as f:
        identity = file_identity(os.fstat(f.fileno()))
        size = identity[2]
        if size < 8:
            raise FixtureError(f"{path}: not a readable safetensors file (shorter than its 8-byte header length)")
        n = int.from_bytes(_read_exact(f, 8, 0, path, "the header length"), "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise FixtureError(f"{path}: not a readable safetensors file (a header of {n} bytes in a file of {size})")
        header = _parse_header(_read_exact(f, n, 8, path, "the header"), path)
    tensors = _spans(header, path, 8 + n, size)
    return TensorFile(path, MappingProxyType(tensors), identity)


def _parse_header(raw: bytes, path: Path) -> dict[str, Any]:
    try:  # strict JSON (the manifest's parser): a repeated key is refused, not resolved
        header = loads_strict(raw.decode("utf-8"))
    except (UnicodeDecodeError, StrictJSONError) as exc:
        raise FixtureError(f"{path}: not a readable safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise FixtureError(f"{path}: not a readable safetensors file (its header is not a JSON object)")
    return header


def _spans(header: dict[str, Any], path: Path, data_start: int, size: int) -> dict[str, TensorSpan]:
    """Each tensor's span from the header, checked; the spans tile [data_start, size) exactly."""
    spans: dict[str, TensorSpan] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: not a readable safetensors file (tensor {name!r}"
        if not isinstance(entry, dict):
            raise FixtureError(f"{where}: its entry is not an object)")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise FixtureError(f"{where}: unknown dtype {dtype!r})")
        if not isinstance(shape, list) or not all(_count(d) for d in shape):
            raise FixtureError(f"{where}: shape {shape!r} is not a list of non-negative integers)")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(o) for o in offsets)
                or offsets[0] > offsets[1]):
            raise FixtureError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end)")
        numpy_name, item = SAFETENSORS_DTYPES[dtype]
        nbytes = math.prod(shape) * item
        if offsets[1] - offsets[0] != nbytes:
            raise FixtureError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, its dtype and "
                               f"shape {nbytes})")
        if data_start + offsets[1] > size:
            raise FixtureError(f"{where}: data_offsets {offsets} reach past the end of the file, "
                               f"{size - data_start} bytes of data: truncated)")
        spans[name] = TensorSpan(numpy_name, tuple(shape), data_start + offsets[0], nbytes)
    end = data_start
    for name, span in sorted(spans.items(), key=lambda kv: (kv[1].offset, kv[1].nbytes)):
        if span.offset != end:
            raise FixtureError(f"{path}: not a readable safetensors file (tensor {name!r} starts at byte "
                               f"{span.offset - data_start} of the data, not {end - data_start}: a gap or an overlap)")
        end += span.nbytes
    if end != size:
        raise FixtureError(f"{path}: not a readable safetensors file ({size - end} bytes after the last tensor)")
    return spans


@contextmanager
def fixture_errors() -> Iterator[None]:
    """The one place the reference's tensor check (`TensorCheckError`) becomes a `FixtureError`, same message."""
    try:
        yield
    except TensorCheckError as exc:
        raise FixtureError(str(exc)) from None


def open_checked(path: Path, table: Mapping[str, Expected], kind: TensorKind) -> TensorFile:
    """A safetensors file whose header (`open_tensor_file`) holds exactly the tensors of `table`, with their
    dtypes and shapes (`check_table`); nothing is read yet. FixtureError naming the file and the tensor."""
    f = open_tensor_file(path)
    with fixture_errors():
        check_table(path, {name: (span.dtype, span.shape) for name, span in f.tensors.items()}, table, kind)
    return f


def read_checked(f: TensorFile, names: Iterable[str], kind: TensorKind) -> Iterator[tuple[str, np.ndarray]]:
    """Each named tensor of a checked file (`open_checked`), read one at a time (read-only, immutable bytes)
    and its values checked (`check_values`: finite weights, no NaN in a golden). Consume it to the end."""
    with f.reading() as read:
        for name in names:
            tensor = read(name)
            with fixture_errors():
                check_values(f.path, name, tensor, kind)
            yield name, tensor


def _count(x: object) -> bool:
    """A non-negative JSON integer (not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


__all__ = ["SAFETENSORS_DTYPES", "TensorFile", "TensorSpan", "file_identity", "fixture_errors", "frozen",
           "open_checked", "open_tensor_file", "read_checked", "read_safetensors", "sha256_file"]
