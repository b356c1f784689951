"""What the test modules share: paths, the CLI runners, manifest edits, the random-weight fixture, the
built-in backends' table and the one-line error checks. Every helper a test module imports lives here; no test
module imports another, and conftest.py holds only pytest's fixtures and hooks (tests/README.md).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from parity_harness._authoring.fixture_writer import write_fixture_files
from parity_harness._fixture.fixture import MANIFEST, Case, sha256_file
from parity_harness._fixture.schema import manifest_digest
from parity_harness._fixture.tolerances import FP32_ATOL, FP64_ATOL
from parity_reference.config import TOY as TOY_CONFIG
from parity_reference.config import GPTConfig
from parity_reference.run import reference_taps

REPO = Path(__file__).resolve().parent.parent
# Set by `nox -s tests` (and so by CI): a skip there means a built-in backend's dependency is
# missing from the environment, which must fail the run instead of hiding a backend.
REQUIRE_ALL = os.environ.get("PARITY_REQUIRE_ALL_BACKENDS") == "1"
TOY = REPO / "fixtures" / "toy"
# A real test vector from another machine: the toy's weights, goldens and ONNX graphs recomputed on AVX-512.
AVX512_VECTOR = REPO / "tests" / "data" / "toy-avx512"


# Manifest edits and the CLI runners.

def reseal(root: Path, manifest: dict, rehash_files: bool = False) -> None:  # type: ignore[type-arg]
    """Write `manifest` with its sha256 table (if `rehash_files`) and its seal recomputed, unchecked."""
    if rehash_files:
        manifest["sha256"] = {name: sha256_file(root / name) for name in manifest["sha256"]}
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def rehash(root: Path) -> None:
    """Rewrite the manifest's sha256 table and seal after a test changed a file on purpose."""
    reseal(root, json.loads((root / MANIFEST).read_text()), rehash_files=True)


def edit_manifest(root: Path, change: Callable[[dict], object], rehash_files: bool = False,  # type: ignore[type-arg]
                  seal: bool = True) -> None:
    """Change the manifest, re-sealed (as a reviewed edit would be) unless `seal` is False."""
    manifest = json.loads((root / MANIFEST).read_text())
    change(manifest)
    if seal:
        reseal(root, manifest, rehash_files)
    else:
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m parity_harness ARGS` in a subprocess, as a user would run it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "parity_harness", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


def cli_with_backends(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], module: str,
                      classes: Sequence[type]) -> Callable[..., tuple[int, str, str]]:
    """`parity ARGS` in-process with `classes` (defined in `module`) registered as entry points beside the real
    backends: (exit code, stdout, stderr). The tests' one way to run fake backends through the real CLI."""
    from importlib.metadata import EntryPoint

    import parity_harness._backends.registry as registry
    import parity_harness._cli.main as cli

    real = registry.backend_entry_points()
    registered = {**real, **{c.name: EntryPoint(c.name, f"{module}:{c.__name__}", registry.GROUP)  # type: ignore[attr-defined]
                             for c in classes}}
    monkeypatch.setattr(registry, "backend_entry_points", lambda: registered)
    monkeypatch.setattr(cli, "backend_entry_points", lambda: registered)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run



# The random-weight fixture the tests build (torch needed), through parity_harness._authoring.fixture_writer:
# `build_random_fixture` writes `parity_reference.model.GPT(config)` after `torch.manual_seed(seed)` (GPT-2's
# init), its golden taps from `run_with_taps` in float32 and in float64 (the stored float32 weights upcast), and
# optionally both ONNX graphs (~10 s a graph).

# T = 1, 5 and 16 (= n_ctx).
CASES = (
    Case("single", (0,), "single"),
    Case("short", (0, 1, 4, 7, 1), "grammar"),
    Case("longest", (0, 1, 3, 4, 7, 2, 6, 0, 2, 10, 11, 8, 1, 5, 9, 0), "longest"),
)

# What these fixtures have always declared: the fp32 tier without the rtol `parity export` writes.
TOLERANCES: dict[str, Any] = {
    "fp32": {"atol": FP32_ATOL, "rtol": 0.0, "overrides": {}},
    "fp64": {"atol": FP64_ATOL, "rtol": 0.0, "overrides": {}},
}


def build_random_fixture(
    root: Path,
    config: GPTConfig = TOY_CONFIG,
    cases: Sequence[Case] = CASES,
    seed: int = 0,
    onnx: bool = False,
) -> Path:
    """Write a complete fixture of random weights into `root` and return `root`."""
    torch = pytest.importorskip("torch")
    from parity_reference.model import GPT

    torch.manual_seed(seed)
    weights = {k: v.detach().to(torch.float32).numpy() for k, v in GPT(config).params().items()}
    write_fixture_files(
        root,
        config=config,
        vocab=[f"w{i}" for i in range(config.vocab_size)],
        cases=cases,
        weights=weights,
        golden=lambda precision: reference_taps(weights, config, cases, precision),
        onnx=onnx,
        provenance={"torch": torch.__version__, "seed": seed, "steps": 0, "command": "tests/helpers.py"},
        tolerances=TOLERANCES,
    )
    return root


# One-line errors of a `parity` subprocess, and a weight changed on purpose.

def assert_one_line_error(proc: object, *needles: str) -> None:
    """Exit 2, a single `parity: error:` line on stderr naming the problem, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])  # type: ignore[attr-defined]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("parity: running")]  # type: ignore[attr-defined]
    assert len(lines) == 1, proc.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("parity: error: ") and "Traceback" not in proc.stderr  # type: ignore[attr-defined]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def perturb_weight(root: Path, name: str, index: tuple[int, ...], delta: float) -> None:
    path = root / "weights.safetensors"
    tensors = load_file(str(path))
    tensors[name] = tensors[name].copy()
    tensors[name][index] += np.float32(delta)
    save_file(tensors, str(path))
    rehash(root)


# A child virtualenv that sees this environment's packages, and `parity` run with its Python.

def make_child_env(root: Path) -> Path:
    """A new venv whose Python also sees the running environment's packages; returns its python.

    `venv --system-site-packages` would expose the base interpreter's packages, not this venv's:
    a .pth file calling `site.addsitedir` on this environment's site-packages does it instead
    (their own .pth files, editable installs included, are processed too).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    child_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    parents = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    lines = [f"import site; site.addsitedir({p!r})" for p in parents]
    Path(child_site, "_parity_parent_env.pth").write_text("\n".join(lines) + "\n")
    return python


def pip_install_command(python: Path, *args: str) -> list[str]:
    """`pip install ARGS` with `python`, offline: no dependencies, no build isolation, no index."""
    return [
        str(python),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--disable-pip-version-check",
        *args,
    ]


def run_harness(
    python: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m parity_harness ARGS` (the `parity` command) with the child environment's Python."""
    return subprocess.run(
        [str(python), "-m", "parity_harness", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "PARITY_EXAMPLE_PLUGIN_BUG": "0", **(env or {})},
    )


def needs_cli() -> None:
    if not (REPO / "harness" / "parity_harness" / "_cli" / "main.py").is_file() \
            or not (REPO / "harness" / "parity_harness" / "__main__.py").is_file():
        pytest.skip("the parity CLI (parity_harness/_cli/main.py, parity_harness/__main__.py) is not there yet")


# pytest run in a subprocess, with the parity plugin.

def plugin_args() -> list[str]:
    """`-p parity_harness.pytest_plugin` unless this environment's parity already registers it (pytest11)."""
    registered = any(ep.name == "parity" and ep.value == "parity_harness.pytest_plugin"
                     for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", "parity_harness.pytest_plugin"]


def run_pytest(cwd: Path, *args: str, python: str = sys.executable,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, check=False, env=env if env is not None else {**os.environ})


# The built-in backends and their precisions, and what the full run of a committed fixture runs.

BUILTIN_PRECISIONS = {
    "pytorch": {"fp32", "fp64"},
    "numpy": {"fp32", "fp64"},
    "onnxruntime": {"fp32"},
    "onnxruntime-optimized": {"fp32"},
    "onnx-reference": {"fp32"},
    "typescript": {"fp64"},
    "typescript-browser": {"fp64"},
    "onnxruntime-web": {"fp32"},
    "onnxruntime-web-optimized": {"fp32"},
    "onnxruntime-webgpu": {"fp32"},
    "hf-transformers": {"fp32", "fp64"},
    "openvino": {"fp32"},
    "transformerlens": {"fp32", "fp64"},
    "torch-compile": {"fp32", "fp64"},
    "jax": {"fp32", "fp64"},
}


# Built-in backends that run only when named (`by_default = False`, the default `parity run` leaves them out):
# the toy's full run (the fast set's) leaves them out too; the stress fixture's (full set) and
# tests/backends/test_browser.py run them.
NAMED_ONLY = {"onnxruntime-webgpu", "llama-cpp", "onnx-file"}

# llama.cpp computes GELU from ggml's float16 table of the tanh GELU, so every GPT-2 fixture fails at
# blocks.0.mlp.hook_post by design (tests/backends/test_ggml_backend.py checks that, and the Llama toy passing):
# the runs of "every built-in backend" on a GPT-2 fixture that must agree (BUILTIN_PRECISIONS) leave it out.
GGML_GELU = {"llama-cpp"}

# The backend of `parity run --onnx FILE`: a user's graph, given at run time (tests/backends/test_onnx_file.py).
GIVEN_GRAPH = {"onnx-file"}


# Left out of the toy's full run too: torch-compile, whose inductor kernels are compiled again in every new
# virtualenv (45 s in a fresh clone's first run on 2 cores, 80 s on a machine that never compiled them), more
# than the fast set's whole budget. The stress fixture's full run and tests/backends/test_torch_compile_backend.py
# (both in the full set, run by CI) run it on the committed fixtures.
SLOW_TO_START = {"torch-compile"}


def full_run_backends(fixture_name: str) -> dict[str, set[str]]:
    """What the full run of a committed fixture runs: every built-in backend and precision, but on the toy
    (the fast set's run) neither those that run only when named nor those slow to start."""
    left_out = NAMED_ONLY | SLOW_TO_START if fixture_name == "toy" else set()
    return {b: ps for b, ps in BUILTIN_PRECISIONS.items() if b not in left_out}


def builtin_backends() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    eps = pyproject["project"]["entry-points"]["parity.backends"]
    return {name for name, target in eps.items() if target.startswith("parity_harness._backends.")}


DECODING_BACKENDS = {"pytorch", "numpy", "onnxruntime", "typescript", "openvino"}


# `parity` with the hostile plugin (tests/hostile_plugin) discoverable, and its one-line exit 2.

HOSTILE_PLUGIN_DIR = REPO / "tests" / "hostile_plugin"


def run_hostile(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m parity_harness ARGS` with the hostile plugin discoverable (PYTHONPATH), as users run it."""
    path = os.pathsep.join(p for p in (str(HOSTILE_PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return run_cli(*args, env={"PYTHONPATH": path, **(env or {})}, timeout=300)


def assert_exit_2_one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("parity: error: "), lines
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "PASS" not in proc.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def run_all(commands: dict[str, list[str]], **kwargs: Any) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run independent `parity` subprocesses concurrently (one per CPU): the cases are start-up bound."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {key: pool.submit(run_hostile, *args, **kwargs) for key, args in commands.items()}
    return {key: f.result() for key, f in futures.items()}


# A tiny GPT-2 checkpoint written by transformers.

def gpt2_checkpoint(root: Path, activation: str, monkeypatch: pytest.MonkeyPatch, dtype: str = "float32") -> Path:
    """A tiny GPT-2 checkpoint written by transformers' own save_pretrained (nothing downloaded), in `dtype`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_positions=24, n_embd=16, n_layer=2, n_head=2,
                                     activation_function=activation, bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).to(getattr(torch, dtype)).save_pretrained(str(root))
    return root


# Values rounded to the bf16 and fp16 grids.

def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest, ties to even), in a float32 container."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def round_fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


# One-line errors of an in-process `parity` run (cli_with_backends).

def assert_one_error_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parity: error: "), err
    assert "Traceback" not in out + err and "PASS" not in out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# PNG checks.

def png_info(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's signature and IHDR chunk; fails if the file is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_real_picture(path: Path, size: tuple[int, int]) -> None:
    """A valid PNG of `size` pixels that is not blank: several colors, non-zero variance."""
    import matplotlib.image as mpimg

    assert png_info(path) == size
    pixels = mpimg.imread(path)
    assert pixels.shape[:2] == (size[1], size[0])
    rgb = pixels[..., :3].reshape(-1, 3)
    assert float(rgb.var()) > 1e-3
    assert len(np.unique(rgb, axis=0)) > 20  # lines, text, shading: far more than a background color


# The largest error of a backend's taps against the golden.

def max_error(
    out: dict[str, dict[str, np.ndarray]], golden: dict[str, dict[str, np.ndarray]]
) -> tuple[float, str]:
    """The largest |a - b| over every finite cell, and where; infinities must match exactly."""
    worst, where = 0.0, ""
    for case, taps in golden.items():
        for tap, expected in taps.items():
            actual = out[case][tap]
            finite = np.isfinite(expected)
            assert np.array_equal(np.isfinite(actual), finite), f"{case}/{tap}: infinities differ"
            assert np.array_equal(actual[~finite], expected[~finite]), f"{case}/{tap}: infinities differ"
            if finite.any():
                err = float(
                    np.abs(actual[finite].astype(np.float64) - expected[finite].astype(np.float64)).max()
                )
                if err > worst:
                    worst, where = err, f"{case}/{tap}"
    return worst, where


# Gradients against the torch-autograd reference (parity_reference/backward.py), as the gradient judge reads them.

def grad_errors(got: dict[str, dict[str, np.ndarray]], want: dict[str, dict[str, np.ndarray]],
                order: Sequence[str] = ()) -> dict[str, float]:
    """Each name's error: max over cases of |got - want|, over its magnitude M = max over cases of |want| (the
    judge's M, docs/tolerances.md; 1 where M is 0). Cases, names, shapes and dtypes must match. The names come in
    `order` (e.g. "loss" then training.backward_names: the backward's), then any other in `want`'s order.

    `got` and `want` are {case: {name: array}} (a backend's `grad`), or {"": records} for the training steps.
    """
    assert list(got) == list(want), f"cases differ: {sorted(set(got) ^ set(want))}"
    worst: dict[str, float] = {}
    magnitude: dict[str, float] = {}
    for case, expected in want.items():
        assert set(got[case]) == set(expected), f"{case}: names differ: {sorted(set(got[case]) ^ set(expected))}"
        for name, e in expected.items():
            a = got[case][name]
            assert a.shape == e.shape and a.dtype == e.dtype, f"{case}/{name}: {a.dtype}{a.shape} != {e.dtype}{e.shape}"
            diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
            worst[name] = max(worst.get(name, 0.0), float(diff.max()) if diff.size else 0.0)
            magnitude[name] = max(magnitude.get(name, 0.0), float(np.abs(e).max()) if e.size else 0.0)
    names = [n for n in order if n in worst] + [n for n in worst if n not in order]
    return {name: worst[name] / (magnitude[name] or 1.0) for name in names}


def first_over(errors: dict[str, float], bound: float) -> tuple[str | None, float, str]:
    """The first name (in `errors`' order: the backward's) whose error exceeds `bound`, and the worst (value, name)."""
    first = next((name for name, err in errors.items() if err > bound), None)
    name = max(errors, key=lambda n: errors[n])
    return first, errors[name], name
