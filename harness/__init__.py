"""parity's harness: load a fixture, run every backend on it, and compare every tap.

Importing it is cheap: numpy and safetensors only. torch, onnxruntime and Node are loaded by
the backends that need them, when they run.
"""

__version__ = "0.1.0"
