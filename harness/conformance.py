"""The conformance kit: check a backend's contract before its numbers (`parity check-backend NAME`).

`check_backend(backend, fixture)` runs a backend on small fixtures derived from `fixture` (same
config and weights, new cases) and returns one `ConformanceResult` per check:

- its name is usable and its precisions are a non-empty subset of ("fp32", "fp64");
- its dependencies are present (otherwise nothing else can run);
- `supported_taps` is a non-empty subset of the manifest's taps, in dataflow order, no repeats;
- in every declared precision, for T = 1 and T = n_ctx (one single-case fixture each): it runs,
  returns exactly its declared taps for exactly the fixture's cases, with the manifest's shapes,
  the precision's dtype, and no NaN;
- on bad input (a token id out of range, a truncated weights file, a weights file missing a
  tensor) it raises a `ParityError`: not another exception, and never numbers.

The numbers themselves are not compared here: that is `parity run`. The golden files of the
derived fixtures are written by the NumPy backend's forward pass, only so that they are complete;
`harness.fixture_writer.write_fixture_files` writes them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.backends.base import PRECISIONS, Backend, BackendOutput, Precision
from harness.errors import ParityError
from harness.fixture import MANIFEST, Case, Fixture, load_fixture
from harness.fixture_writer import seal_manifest, write_fixture_files
from harness.guard import describe_exception, reraise_if_interrupt
from harness.manifest import SEAL_KEY, manifest_digest
from harness.onnx_graph import GRAPHS
from harness.precision import DTYPES
from harness.registry import checked_missing_dependencies
from reference.taps import tap_shape


@dataclass(frozen=True)
class ConformanceResult:
    name: str  # what was checked, e.g. "fp32 T=1: runs (single)"
    passed: bool
    message: str = ""  # why it failed (or a detail when it passed)


# -- derived fixtures ---------------------------------------------------------------------------


def _rehash(root: Path) -> None:
    """Recompute the manifest's sha256 table (and its seal) after a file was changed on purpose."""
    seal_manifest(root, rehash_files=True)


def _derived_fixture(parent: Fixture, root: Path, cases: Sequence[Case]) -> Fixture:
    """A fixture with `parent`'s config, weights, tolerances and ONNX files, and these cases."""
    from reference.numpy_model import forward

    weights = parent.weights()
    golden: dict[Precision, dict[str, dict[str, np.ndarray]]] = {}
    for precision in PRECISIONS:
        params = {k: w.astype(DTYPES[precision]) for k, w in weights.items()}
        golden[precision] = {c.name: forward(params, parent.config, list(c.tokens)) for c in cases}
    extra = {kind: p for kind in GRAPHS if (p := parent.onnx_path(kind)) and p.is_file()}
    write_fixture_files(
        root,
        config=parent.config,
        vocab=parent.vocab,
        cases=cases,
        weights=weights,
        golden=golden,
        onnx=extra,
        provenance={"command": "parity check-backend (derived fixture)"},
        tolerances=parent.manifest["tolerances"],
    )
    return load_fixture(root)


# -- the checks ---------------------------------------------------------------------------------


def _check_output(
    out: Any, fixture: Fixture, taps: Sequence[str], precision: Precision
) -> list[tuple[str, str]]:
    """(check suffix, problem or "") for one run's output: taps, shapes and dtype, NaN."""
    dtype = np.dtype(DTYPES[precision])
    if not isinstance(out, dict) or set(out) != {c.name for c in fixture.cases}:
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        problem = f"expected cases {[c.name for c in fixture.cases]}, got {got}"
        return [
            ("returns exactly its declared taps", problem),
            (f"shapes and dtype {dtype}", "not checked"),
            ("no NaN", "not checked"),
        ]
    tap_problem = shape_problem = nan_problem = ""
    for case in fixture.cases:
        got_taps = out[case.name]
        if not isinstance(got_taps, dict):
            tap_problem = tap_problem or f"case {case.name!r}: {type(got_taps).__name__}, expected a dict"
            continue
        missing = [t for t in taps if t not in got_taps]
        extra = [t for t in got_taps if t not in taps]
        if (missing or extra) and not tap_problem:
            tap_problem = f"case {case.name!r}: missing {missing[:3]}, undeclared {extra[:3]}"
        for tap in taps:
            arr = got_taps.get(tap)
            if arr is None:
                continue
            if not isinstance(arr, np.ndarray):
                shape_problem = (
                    shape_problem or f"{case.name}/{tap}: {type(arr).__name__}, expected numpy.ndarray"
                )
                continue
            want = tap_shape(fixture.config, tap, len(case.tokens))
            if (arr.shape != want or arr.dtype != dtype) and not shape_problem:
                shape_problem = (
                    f"{case.name}/{tap}: {arr.dtype}{list(arr.shape)}, expected {dtype}{list(want)}"
                )
            if arr.dtype.kind == "f" and np.isnan(arr).any() and not nan_problem:
                nan_problem = f"{case.name}/{tap} holds NaN"
    return [
        ("returns exactly its declared taps", tap_problem),
        (f"shapes and dtype {dtype}", shape_problem),
        ("no NaN", nan_problem),
    ]


def _expect_parity_error(backend: Backend, fixture: Fixture, precision: Precision) -> str:
    """An empty string when `run` raises a ParityError, else what happened instead."""
    try:
        backend.run(fixture, precision)
    except ParityError:
        return ""
    except BaseException as exc:  # the point of the check: any other exception (SystemExit too) is a failure
        reraise_if_interrupt(exc)
        return f"raised {describe_exception(exc)} (expected a ParityError)"
    return "returned numbers instead of raising a ParityError"


def _bad_input_checks(
    backend: Backend, parent: Fixture, work: Path, precision: Precision
) -> list[ConformanceResult]:
    config = parent.config
    results: list[ConformanceResult] = []

    # A token id one past the vocabulary. The loader rejects it, so it is put in after loading,
    # in the Fixture object and in manifest.json (for backends that read the directory).
    root = work / "bad_token"
    fixture = _derived_fixture(parent, root, [Case("bad_token", (0,), "bad")])
    fixture.cases = [Case("bad_token", (0, config.vocab_size), "bad")]
    fixture.manifest["cases"][0]["tokens"] = [0, config.vocab_size]
    fixture.manifest[SEAL_KEY] = manifest_digest(fixture.manifest)
    (root / MANIFEST).write_text(json.dumps(fixture.manifest, indent=2) + "\n", encoding="utf-8")
    problem = _expect_parity_error(backend, fixture, precision)
    results.append(
        ConformanceResult(f"rejects a token id out of range ({config.vocab_size})", not problem, problem)
    )

    # A weights file cut in half (the manifest's hash updated, so only reading it can tell).
    root = work / "truncated_weights"
    _derived_fixture(parent, root, [Case("pair", (0, 1), "bad")])
    data = (root / "weights.safetensors").read_bytes()
    (root / "weights.safetensors").write_bytes(data[: len(data) // 2])
    _rehash(root)
    problem = _expect_parity_error(backend, load_fixture(root), precision)
    results.append(ConformanceResult("rejects a truncated weights file", not problem, problem))

    # A readable weights file missing its last tensor (ln_f.bias).
    from safetensors.numpy import save_file

    root = work / "missing_tensor"
    _derived_fixture(parent, root, [Case("pair", (0, 1), "bad")])
    weights = dict(parent.weights())
    weights.pop("ln_f.bias")
    save_file(weights, str(root / "weights.safetensors"))
    _rehash(root)
    problem = _expect_parity_error(backend, load_fixture(root), precision)
    results.append(ConformanceResult("rejects weights missing a tensor (ln_f.bias)", not problem, problem))
    return results


def _declaration_checks(backend: Backend) -> list[ConformanceResult]:
    name = backend.name
    name_ok = isinstance(name, str) and bool(name) and not any(c in name for c in ", \t\n")
    declared = tuple(backend.precisions) if isinstance(backend.precisions, Iterable) else ()
    prec_ok = bool(declared) and len(set(declared)) == len(declared) and set(declared) <= set(PRECISIONS)
    return [
        ConformanceResult(
            "has a name (non-empty, no comma or space)", name_ok, "" if name_ok else repr(name)
        ),
        ConformanceResult(
            "declares precisions, a non-empty subset of ('fp32', 'fp64')", prec_ok, repr(declared)
        ),
    ]


def _tap_checks(backend: Backend, fixture: Fixture) -> tuple[list[ConformanceResult], list[str] | None]:
    try:
        taps = backend.supported_taps(fixture)
    except BaseException as exc:  # a contract check reports, it does not crash
        reraise_if_interrupt(exc)
        return [ConformanceResult("supported_taps runs", False, describe_exception(exc))], None
    if not isinstance(taps, list) or not all(isinstance(t, str) for t in taps):
        return [ConformanceResult("supported_taps returns a list of tap names", False, repr(taps)[:80])], None
    unknown = [t for t in taps if t not in fixture.tap_names]
    in_order = [t for t in fixture.tap_names if t in taps] == taps
    problem = ""
    if not taps:
        problem = "empty"
    elif unknown:
        problem = f"unknown taps {unknown[:3]}"
    elif len(set(taps)) != len(taps):
        problem = "repeated taps"
    elif not in_order:
        problem = "not in dataflow order (the manifest's order)"
    detail = problem or f"{len(taps)} of {len(fixture.tap_names)} taps"
    result = ConformanceResult(
        "supported taps: a subset of the manifest's, in dataflow order", not problem, detail
    )
    return [result], taps


def check_backend(backend: Backend, fixture: Fixture) -> list[ConformanceResult]:
    """Every contract check of `backend` on fixtures derived from `fixture`, one result per check."""
    results = _declaration_checks(backend)
    if not results[1].passed:
        return results
    missing = checked_missing_dependencies(backend)
    results.append(
        ConformanceResult(
            "dependencies present",
            not missing,
            f"missing {', '.join(missing)}; {backend.install_hint}".rstrip("; ") if missing else "",
        )
    )
    if missing:
        return results
    tap_results, taps = _tap_checks(backend, fixture)
    results += tap_results
    if taps is None or not tap_results[0].passed:
        return results
    config = fixture.config
    shortest = Case("single", (config.vocab_size - 1,), "single")  # the highest token id, alone
    longest = Case("longest", tuple(i % config.vocab_size for i in range(config.n_ctx)), "longest")
    with tempfile.TemporaryDirectory(prefix="parity-conformance-") as tmp:
        work = Path(tmp)
        derived = {c.name: _derived_fixture(fixture, work / c.name, [c]) for c in (shortest, longest)}
        for precision in backend.precisions:
            for case_name, sub in derived.items():
                label = f"{precision} T={len(sub.cases[0].tokens)}"
                try:
                    out: BackendOutput = backend.run(sub, precision)
                except BaseException as exc:  # reported as a failed check, with the exception's line
                    reraise_if_interrupt(exc)
                    results.append(ConformanceResult(f"{label}: runs ({case_name})", False, describe_exception(exc)))
                    continue
                results.append(ConformanceResult(f"{label}: runs ({case_name})", True))
                for suffix, problem in _check_output(out, sub, taps, precision):
                    results.append(ConformanceResult(f"{label}: {suffix}", not problem, problem))
        results += _bad_input_checks(backend, fixture, work, backend.precisions[0])
    return results
