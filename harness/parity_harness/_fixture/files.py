"""Reading a fixture's data files: sha256 in chunks, safetensors as NumPy arrays, read-only copies.

The primitives `Fixture` (fixture.py) and the decoding goldens' reader (decoding.py) share, in a module of their
own so that neither imports the other.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from parity_harness._core.errors import FixtureError


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


__all__ = ["frozen", "read_safetensors", "sha256_file"]
