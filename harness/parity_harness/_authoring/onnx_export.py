"""Export the reference model to ONNX (`parity export`) and check committed graphs against the golden files.

Two graphs are written from the same float32 weights, both with one input `tokens` (int64 [T],
T dynamic from 1 to n_ctx), opset `ONNX_OPSET`, weights embedded in the single file:

- `model.onnx` ("all_taps"): every tap of the manifest as a named graph output, in dataflow order;
- `model.logits.onnx` ("logits"): only `logits`, the graph a user would ship.

The graph is traced by torch.onnx's dynamo exporter from `parity_reference.model.forward` itself (a small
wrapper module returns the taps as a tuple), so the ONNX file cannot drift from the reference. Every file
is written by `_backends/onnx/clean.py`'s `graph_bytes`, without the exporter's metadata: no source path,
no object address, the same bytes from any directory (docs/onnx.md, "What a graph holds").
torch is imported inside `export_onnx` only; the checks need onnx and onnxruntime, not torch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._backends.onnx.graph import (
    GRAPH_FILES,
    INPUT_NAME,
    ONNX_OPSET,
    OnnxGraph,
    check_onnx_file,
    check_onnx_model,
    expected_outputs,
    load_onnx,
    onnx_file,
    ort_runner,
    run_cases,
)
from parity_harness._backends.onnx.weights import graph_weight_problem
from parity_harness._compare.judge import compare_tensors
from parity_harness._core.errors import FixtureError
from parity_reference.families import family_of

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture
    from parity_reference.families import ModelConfig

__all__ = [
    "ONNX_OPSET",
    "OnnxGraph",
    "OnnxTapCheck",
    "check_onnx_against_golden",
    "check_onnx_file",
    "export_decode_onnx",
    "export_onnx",
    "export_onnx_for",
    "verify_onnx_files",
]

_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch._export", "torch.fx", "onnxscript")


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Swallow the exporter's prints, warnings and log lines; yields what was printed."""
    captured = io.StringIO()
    levels = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(captured),
            contextlib.redirect_stderr(captured),
        ):
            warnings.simplefilter("ignore")
            yield captured
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def export_onnx(
    weights: dict[str, np.ndarray], config: ModelConfig, path: Path, outputs: OnnxGraph, lens_rows: int | None = None
) -> None:
    """Write the reference model of `config`'s family as one self-contained .onnx file.

    `weights`: float32 numpy arrays under Hugging Face names (GPT-2: Conv1D weights [in, out]; Llama:
    `LlamaForCausalLM`'s, nn.Linear [out, in]). `outputs`: "all_taps" (every tap, named, in dataflow order)
    or "logits" (only `logits`). `lens_rows`: probs and the logit lens for the last positions only (the
    family's `forward`). The traced forward is the family's `torch` module's; the graph's constants besides
    the weights are its `authoring` module's (`graph_constants`, put in place while tracing by
    `constants_in_use`: Llama's RoPE tables). The file is written next to `path` and renamed into place, then
    checked (`check_onnx_model`, and its initializers against `weights`).
    """
    import torch

    table = family_of(config)
    model, authoring = table.module("torch"), table.module("authoring")
    taps_all = table.tap_names(config)
    names = expected_outputs(taps_all, outputs)
    expected = table.module("params").param_shapes(config)
    if set(weights) != set(expected):
        missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
        raise ValueError(f"weights do not match the config (missing {missing}, extra {extra})")
    constants = authoring.graph_constants(config)

    class TapsModule(torch.nn.Module):
        """tokens (T,) -> the graph outputs as a tuple, computed by the family's reference `forward`."""

        def __init__(self) -> None:
            super().__init__()
            _register(self, weights, expected, constants)

        def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
            params = {key: getattr(self, key.replace(".", "__")) for key in expected}
            taps: dict[str, torch.Tensor] = {}
            with authoring.constants_in_use({name: getattr(self, name) for name in constants}):
                logits = model.forward(params, config, tokens, taps if outputs == "all_taps" else None, lens_rows)
            return tuple(taps[n] for n in names) if outputs == "all_taps" else (logits,)

    # An example longer than 1 (torch.export specializes a size-1 example), within the context.
    example = torch.arange(min(config.n_ctx, 3), dtype=torch.int64) % config.vocab_size
    dynamic: Any = ({0: torch.export.Dim("T", min=1, max=config.n_ctx)},) if config.n_ctx > 1 else None

    def check(graph: Any, where: Path) -> None:
        check_onnx_model(graph, where, taps_all, outputs)
        problem = graph_weight_problem(graph, weights)  # what every run checks again (_backends/onnx/weights.py)
        if problem is not None:
            raise FixtureError(f"{where}: {problem}")

    export_program(TapsModule().eval(), (example,), Path(path), [INPUT_NAME], names, dynamic, check)


def _register(module: Any, weights: Mapping[str, np.ndarray], keys: Iterable[str],
              constants: Mapping[str, Any]) -> None:
    """The weights (writable float32 copies) and the family's graph constants as buffers of `module`: buffers
    become ONNX initializers; '.' is not allowed in a buffer name, so it is written '__'."""
    import torch

    for key in keys:
        tensor = torch.from_numpy(np.array(weights[key], dtype=np.float32, copy=True))
        module.register_buffer(key.replace(".", "__"), tensor.clone())
    for name, value in constants.items():
        module.register_buffer(name, value.clone())


def export_program(
    module: Any, example: tuple[Any, ...], path: Path, input_names: list[str], output_names: list[str],
    dynamic: Any, check: Callable[[Any, Path], None],
) -> None:
    """Export `module` with the dynamo exporter into `path`, atomically: written beside it, cleaned of the
    exporter's metadata (`clean.graph_bytes`: no source path or object address, the same bytes from any
    directory), loaded and checked by `check(model, path)`, then moved in place. The exporter's chatter is
    kept quiet, and its last lines are in the error when it fails."""
    import onnx
    import torch

    from parity_harness._backends.onnx.clean import graph_bytes
    from parity_harness._core.safe_write import write_atomic_with

    def write(tmp: Path) -> None:
        with _quiet() as log, torch.no_grad():
            try:
                program = torch.onnx.export(
                    module, example, dynamo=True, opset_version=ONNX_OPSET,
                    input_names=input_names, output_names=output_names, dynamic_shapes=dynamic,
                    external_data=False, verbose=False,
                )
                assert program is not None
                program.save(str(tmp), external_data=False)
            except Exception as exc:
                tail = log.getvalue().strip().splitlines()[-5:]
                raise RuntimeError(f"ONNX export of {path} failed: {exc}\n" + "\n".join(tail)) from exc
        # The exporter's metadata names this checkout's paths and Python object addresses: dropped (clean.py).
        tmp.write_bytes(graph_bytes(onnx.load_model(str(tmp))))
        check(load_onnx(tmp), path)

    write_atomic_with(path, write, "ONNX graph")


@dataclass(frozen=True)
class OnnxTapCheck:
    """One committed graph's worst error on one tap over every case, against the fp32 golden."""

    file: str
    tap: str
    max_abs_err: float  # over finite cells; inf if -inf/inf/NaN do not line up
    atol: float
    ok: bool


def verify_onnx_files(fixture: Fixture) -> list[OnnxTapCheck]:
    """Run both committed graphs (onnxruntime, CPU, one thread) on every case; compare to golden fp32.

    FixtureError if a graph is missing or does not pass `check_onnx_file`.
    """
    golden = fixture.golden("fp32")
    tolerances = fixture.tolerances["fp32"]
    checks: list[OnnxTapCheck] = []
    for graph in ("all_taps", "logits"):
        path = onnx_file(fixture, graph)
        check_onnx_file(path, fixture, graph)
        names = expected_outputs(fixture.tap_names, graph)
        results = run_cases(fixture, path, names, ort_runner(path))
        for tap in names:
            tol = tolerances.for_tap(tap)
            cmps = [compare_tensors(np.asarray(results[c.name][tap]), golden[c.name][tap], tol.atol, tol.rtol)
                    for c in fixture.cases]
            worst = max(c.max_abs for c in cmps)
            checks.append(OnnxTapCheck(path.name, tap, worst, tol.atol, all(c.passed for c in cmps)))
    return checks


def check_onnx_against_golden(fixture: Fixture) -> list[str]:
    """`parity export --check`'s ONNX step: one line per graph; FixtureError if any tap breaches tolerance."""
    checks = verify_onnx_files(fixture)
    lines = []
    for name in dict.fromkeys(c.file for c in checks):
        mine = [c for c in checks if c.file == name]
        worst = max(mine, key=lambda c: c.max_abs_err)
        lines.append(
            f"{name}: {len(mine)} tap(s) x {len(fixture.cases)} case(s) reproduce golden fp32, "
            f"worst {worst.tap} max |diff| {worst.max_abs_err:.2e}"
        )
    bad = [c for c in checks if not c.ok]
    if bad:
        detail = ", ".join(f"{c.file}:{c.tap} {c.max_abs_err:.2e} > {c.atol:g}" for c in bad[:5])
        raise FixtureError(
            f"{fixture.root}: the committed ONNX graph(s) do not reproduce the golden files ({detail}); "
            "regenerate them with `parity export`"
        )
    return lines


def export_decode_onnx(weights: dict[str, np.ndarray], config: ModelConfig, path: Path) -> None:
    """Write the family's `decode_step` (its table's `torch` module's) as one self-contained .onnx file (checked,
    then renamed in): past keys and values [cache heads, P, d_head] per block (n_kv_heads heads with
    grouped-query attention, keys after RoPE for Llama), the graph's constants as in `export_onnx` (a Llama step
    reads RoPE's row P, the past length)."""
    import torch

    from parity_harness._backends.onnx.decode import check_decode_model, input_names, output_names
    from parity_harness._fixture.model_spec import ModelSpec

    table = family_of(config)
    model, authoring = table.module("torch"), table.module("authoring")
    keys = list(table.module("params").param_shapes(config))
    constants = authoring.graph_constants(config)
    L = config.n_layer

    class DecodeModule(torch.nn.Module):
        """(token (1,), past keys and values (Hc, P, dh) per block) -> (logits (V,), present (Hc, P + 1, dh) ...)."""

        def __init__(self) -> None:
            super().__init__()
            _register(self, weights, keys, constants)

        def forward(self, token: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            params = {key: getattr(self, key.replace(".", "__")) for key in keys}
            cache = [(past[2 * i], past[2 * i + 1]) for i in range(L)]
            with authoring.constants_in_use({name: getattr(self, name) for name in constants}):
                logits, grown = model.decode_step(params, config, token, cache)
            return (logits, *[t for kv in grown for t in kv])

    n_past = min(3, config.n_ctx - 1)  # an example past longer than 1 (torch.export specializes size 1)
    past_shape = ModelSpec(table, config).decode_tap_shape("blocks.0.attn.cache_k", n_past)  # (Hc, P, dh)
    example = (torch.zeros(1, dtype=torch.int64), *[torch.zeros(past_shape) for _ in range(2 * L)])
    past_dim = torch.export.Dim("P", min=1, max=max(config.n_ctx - 1, 2))
    dynamic: Any = (None, tuple({1: past_dim} for _ in range(2 * L)))  # token, then the *past tuple

    def check(graph: Any, where: Path) -> None:
        check_decode_model(graph, where, config)
        problem = graph_weight_problem(graph, weights)
        if problem is not None:
            raise FixtureError(f"{where}: {problem}")

    export_program(DecodeModule().eval(), example, Path(path), input_names(L), output_names(L), dynamic, check)


def export_onnx_for(fixture_dir: Path | str, progress: Callable[[str], None] | None = None) -> list[str]:
    """Export the fixture's own graphs into it and list them in its manifest; returns `check_onnx_against_golden`'s
    lines.

    For a fixture written without graphs (any family: GPT-2 or Llama): both graphs (`model.onnx`,
    `model.logits.onnx`) exported from its `weights.safetensors` with its `lens_rows`, and the decoder-with-past
    graph (`model.decode.onnx`) when it has a decoding section; `files.onnx` (`files.decoding.onnx`) and their
    sha256 added to the manifest, the manifest re-sealed (checked in memory, then written atomically), and the
    graphs run against the fp32 goldens (FixtureError if a tap breaches the tolerance). The fixture writer calls
    it after writing a fixture; on a committed fixture it is one command (docs/onnx.md).
    """
    import json

    from parity_harness._core.safe_write import write_text_atomic
    from parity_harness._core.strict_json import loads_strict
    from parity_harness._fixture.fixture import (
        MANIFEST,
        fixture_from_manifest,
        load_fixture,
        read_manifest,
        sha256_file,
    )
    from parity_harness._fixture.schema import SEAL_KEY, manifest_digest

    root = Path(fixture_dir)
    say = progress or (lambda _message: None)
    fixture = load_fixture(root)
    weights = {k: np.asarray(v, dtype=np.float32) for k, v in fixture.weights().items()}
    for kind, name in GRAPH_FILES.items():
        say(f"ONNX graph {name}")
        export_onnx(dict(weights), fixture.model.config, root / name, kind, lens_rows=fixture.lens_rows())
    written = list(GRAPH_FILES.values())
    manifest = read_manifest(root / MANIFEST)
    manifest["files"]["onnx"] = dict(GRAPH_FILES)
    if isinstance(manifest["files"].get("decoding"), dict):  # a decoding section: its decoder-with-past graph too
        from parity_harness._fixture.decoding import ONNX_FILE

        say(f"ONNX graph {ONNX_FILE}")
        export_decode_onnx(dict(weights), fixture.model.config, root / ONNX_FILE)
        manifest["files"]["decoding"]["onnx"] = ONNX_FILE
        written.append(ONNX_FILE)
    for name in written:
        manifest["sha256"][name] = sha256_file(root / name)
    manifest.pop(SEAL_KEY, None)
    manifest[SEAL_KEY] = manifest_digest(manifest)
    text = json.dumps(manifest, indent=1) + "\n"
    fixture_from_manifest(root, loads_strict(text))  # the new manifest checked before it replaces the old
    write_text_atomic(root / MANIFEST, text, "manifest")
    return check_onnx_against_golden(load_fixture(root))


