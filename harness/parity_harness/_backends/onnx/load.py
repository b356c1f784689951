"""Reading an .onnx file parity will run: parsed, self-contained, checked by onnx's checker (one line if not).

Its own module so that the graph helpers (graph.py) and the weights check (weights.py) both use it without
importing each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity_harness._core.errors import FixtureError


def load_onnx(path: Path) -> Any:
    """Parse and check an .onnx file (onnx.ModelProto); FixtureError naming the file if it is unusable."""
    import onnx

    if not path.is_file():
        raise FixtureError(f"{path}: file not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, OSError, ...: any of them means unreadable
        raise FixtureError(f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc})") from None
    if not model.graph.node or not model.graph.output:
        raise FixtureError(f"{path}: not a usable ONNX file (empty or truncated graph)")
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise FixtureError(
            f"{path}: refers to external data for {external[:3]}; the file must be self-contained"
        )
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        raise FixtureError(f"{path}: not a valid ONNX model ({first_line(exc)})") from None
    return model


def first_line(exc: BaseException) -> str:
    """The first line of what a library raised, or its type's name when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["first_line", "load_onnx"]
