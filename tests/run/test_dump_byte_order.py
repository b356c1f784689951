"""A dump of correct numbers written big-endian (safetensors data is little-endian, docs/dump-format.md) is refused
as bad input naming the file and the tensor (exit 2), never judged as a numerical disagreement; the same numbers
written little-endian agree, and wrong numbers in the right order still disagree (exit 1).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._cli.main import main
from parity_harness._fixture.fixture import load_fixture
from parity_harness._fixture.identity import fixture_id
from tests.helpers import TOY


def write_dump(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str],
               order: Literal["<", ">"]) -> None:
    """docs/dump-format.md's recipe, with the data in byte order `order` ("<" as the format says, or ">")."""
    header: dict[str, object] = {"__metadata__": metadata}
    blobs, offset = [], 0
    for key, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder(order)).tobytes()
        header[key] = {"dtype": {"float32": "F32", "float64": "F64"}[array.dtype.name], "shape": list(array.shape),
                       "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def dump_of_numpy(tmp_path: Path, precision: str, order: Literal["<", ">"], scale: float = 1.0) -> Path:
    fixture = load_fixture(TOY)
    output = NumpyBackend().run(fixture, precision)  # type: ignore[arg-type]
    tensors = {f"{case}/{tap}": (value * value.dtype.type(scale)).astype(value.dtype)
               for case, taps in output.items() for tap, value in taps.items()}
    path = tmp_path / f"numpy.{precision}.{'big' if order == '>' else 'little'}.safetensors"
    write_dump(path, tensors, {"format": "parity-dump", "format_version": "1", "backend": "numpy-dump",
                               "precision": precision, "fixture_id": fixture_id(fixture), "platform": "test",
                               "parity_version": "0.1.0"}, order)
    return path


def compare(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["compare", "--fixture", str(TOY), str(path)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_a_big_endian_dump_of_correct_numbers_is_refused_naming_the_file_and_tensor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str) -> None:
    path = dump_of_numpy(tmp_path, precision, ">")
    code, out, err = compare(capsys, path)
    assert code == 2, (out[-1500:], err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "written big-endian" in lines[0], lines
    assert "tensor '" in lines[0] and "/" in lines[0].split("tensor '")[1].split("'")[0], lines


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_the_same_numbers_little_endian_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             precision: str) -> None:
    code, out, err = compare(capsys, dump_of_numpy(tmp_path, precision, "<"))
    assert code == 0, (out[-1500:], err)


def test_wrong_numbers_in_the_right_order_still_disagree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = compare(capsys, dump_of_numpy(tmp_path, "fp32", "<", scale=1.5))
    assert code == 1, (out[-1500:], err)
    assert "big-endian" not in err


def test_byte_swapped_tells_swapped_bytes_from_wrong_numbers() -> None:
    from parity_harness._run.dump import byte_swapped

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        honest: np.ndarray = rng.normal(size=(5, 8)).astype(dtype)  # [T, d]
        honest[0, :3] = [0.0, -np.inf, 1.0]
        assert not byte_swapped(honest)
        assert byte_swapped(honest.byteswap())  # the bytes a big-endian writer leaves, read as little-endian
        assert not byte_swapped(np.multiply(honest, 1e12).astype(dtype))  # wrong, but in the right order
        assert not byte_swapped(np.full((4,), np.nan, dtype=dtype))  # NaN is a computed value: judged (exit 1)
        assert not byte_swapped(np.zeros((3, 3), dtype=dtype))
