"""parity's harness: load a fixture, run every backend on it, and compare every tap.

Importing it is cheap: numpy and safetensors only. torch, onnxruntime and Node are loaded by
the backends that need them, when they run. The public Python API is one module, `parity_harness.api`
(`from parity_harness import api`, or `parity_harness.api` after `import parity_harness`: loaded on first use);
docs/api.md describes it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`parity_harness.api`, imported on first use, so `import parity_harness` stays cheap."""
    if name == "api":
        import importlib

        return importlib.import_module("parity_harness.api")
    raise AttributeError(f"module 'parity_harness' has no attribute {name!r}")
