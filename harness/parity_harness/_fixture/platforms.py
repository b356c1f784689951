"""What identifies a floating-point platform, and the rule for goldens recomputed on another one.

PyTorch reproduces its own numbers bit for bit only on the same platform: the same OS, CPU
architecture, torch build, CPU kernels (`cpu_capability`), BLAS library and CPU model. MKL picks
kernels by CPU vendor and model, so two AVX-512 CPUs can round differently (measured: an AMD EPYC
and an Intel AVX-512 machine differ by up to 8 float32 epsilons at a tap's magnitude). Every one
of `IDENTITY_KEYS` must be recorded and equal for two platforms to be "the same"; a fixture that
records fewer keys (older fixtures) is treated as made on another platform.

Across platforms, recomputed goldens are judged by `CROSS_PLATFORM_RULE` (docs/fixtures.md has
the measurement behind it): float32 goldens at the fixture's fp32 tier, float64 goldens within
`FP64_CROSS_PLATFORM_EPS` float64 epsilons at the tap's magnitude (max |golden| of that tap and case).
"""

from __future__ import annotations

import platform
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from parity_harness._fixture.tolerances import tap_magnitude

IDENTITY_KEYS = ("system", "machine", "torch", "cpu_capability", "blas", "cpu")
# Measured worst between three x86-64 platforms (AVX2 Intel, AVX-512 Intel, AVX-512 AMD): 6.9 epsilons
# at the tap's magnitude in float64; 64 leaves room for other CPUs and stays ~1e5 x below float32 round-off.
FP64_CROSS_PLATFORM_EPS = 64
CROSS_PLATFORM_RULE = (
    "fp32 goldens within the fixture's fp32 tier; fp64 goldens within "
    f"{FP64_CROSS_PLATFORM_EPS} float64 epsilons x max|golden| of each tap and case"
)


def cpu_model() -> str:
    """The CPU's model name as the OS reports it, "" when it cannot be read."""
    system = platform.system()
    if system == "Linux":
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        for key in ("model name", "Hardware", "CPU part"):  # x86, then ARM boards, then ARM cores
            match = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
            if match:
                return match.group(1).strip()
    if system == "Darwin":
        try:
            # A hang guard, generous: the CPU's name is part of the platform's identity (and so of the rule).
            proc = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=60, check=False)
            if proc.returncode == 0 and proc.stdout.strip():
                return proc.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor()


def current_platform() -> dict[str, str]:
    """This machine's platform, every key of IDENTITY_KEYS (imports torch)."""
    import torch

    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "blas": blas.group(1) if blas else "unknown",
        "cpu": cpu_model(),
    }


def same_platform(recorded: object, here: Mapping[str, str]) -> bool:
    """True when `recorded` (a manifest's platform entry) names every identity key, equal to `here`'s."""
    if not isinstance(recorded, Mapping):
        return False
    return all(key in recorded and recorded[key] == here.get(key) for key in IDENTITY_KEYS)


def describe(recorded: object) -> str:
    """A platform entry in one phrase: "system Linux, machine x86_64, torch 2.13.0+cpu, cpu_capability AVX512, ..."."""
    if not isinstance(recorded, Mapping):
        return "unrecorded"
    parts = [f"{k} {recorded[k]}" for k in IDENTITY_KEYS if recorded.get(k)]
    missing = [k for k in IDENTITY_KEYS if not recorded.get(k)]
    text = ", ".join(parts) or "unrecorded"
    return text + (f" (no {', '.join(missing)} recorded)" if missing else "")


def fp64_cross_platform_atol(golden: np.ndarray) -> float:
    """The float64 cross-platform allowance of one golden tensor: N epsilons at its largest finite magnitude."""
    return FP64_CROSS_PLATFORM_EPS * float(np.finfo(np.float64).eps) * tap_magnitude([golden])


def training_platform(provenance: Mapping[str, Any]) -> object:
    """Where the fixture's weights were trained: `training_platform`, else `platform` (both made in one run)."""
    return provenance.get("training_platform", provenance.get("platform"))
