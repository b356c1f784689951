"""Reading an .onnx file parity will run: parsed, self-contained, checked by onnx's checker (one line if not).

Its own module so that the graph helpers (graph.py) and the weights check (weights.py) both use it without
importing each other. It also keys what those checks decide: `file_key` names a graph file by its resolved
path and the sha256 the fixture's manifest holds for it (which the fixture checked at load), so that a
verdict reached once in a process is not reached again (`onnx.checker` here; the contract in graph.py,
the weights in weights.py). A file the manifest does not hash has no key and is checked every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_harness._core.errors import FixtureError

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

FileKey = tuple[str, str]  # (resolved path, the manifest's sha256 of the file)

_valid: set[FileKey] = set()  # files that passed `load_onnx`'s checks in this process


def file_key(fixture: Fixture, path: Path) -> FileKey | None:
    """`path` as a file of `fixture` the manifest hashes: (resolved path, that sha256); None if it is not one."""
    resolved = path.resolve()
    for name, digest in fixture.spec.hashes.items():
        if (fixture.root / name).resolve() == resolved:
            return str(resolved), str(digest)
    return None


def load_onnx(path: Path, key: FileKey | None = None) -> Any:
    """Parse and check an .onnx file (onnx.ModelProto); FixtureError naming the file if it is unusable.

    `key` (`file_key`): the file as the fixture verified it; `onnx.checker` does not run again on a file
    that passed under that key. The file is read once: the checker is given its bytes, not the parsed
    model (which it would serialize again: seconds and 500 MB at GPT-2 size)."""
    import onnx

    if not path.is_file():
        raise FixtureError(f"{path}: file not found")
    try:
        data = path.read_bytes()
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError, OSError, ...: any of them means unreadable
        raise FixtureError(f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc})") from None
    if not model.graph.node or not model.graph.output:
        raise FixtureError(f"{path}: not a usable ONNX file (empty or truncated graph)")
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise FixtureError(
            f"{path}: refers to external data for {external[:3]}; the file must be self-contained"
        )
    if key is None or key not in _valid:
        try:
            onnx.checker.check_model(data)
        except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
            raise FixtureError(f"{path}: not a valid ONNX model ({first_line(exc)})") from None
        if key is not None:
            _valid.add(key)
    return model


def first_line(exc: BaseException) -> str:
    """The first line of what a library raised, or its type's name when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["FileKey", "file_key", "first_line", "load_onnx"]
