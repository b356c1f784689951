"""The conformance kit: check a backend's contract before its numbers (`parity check-backend NAME`).

`check_backend(backend, fixture)` runs a backend on small fixtures derived from `fixture` (same
config and weights, new cases) and returns one `ConformanceResult` per check:

- its declarations hold (name, precisions a non-empty subset of ("fp32", "fp64", "fp16", "bf16") and the stored
  weight formats ("f16", "q8_0", "q4_0", "q4_k"), requires, ...);
- its dependencies are present (otherwise nothing else can run);
- `supported_taps` is a non-empty subset of the manifest's taps, in dataflow order, no repeats;
- in every declared precision, for T = 1 and T = n_ctx (one single-case fixture each): it runs,
  returns exactly its declared taps for exactly the fixture's cases, with the manifest's shapes,
  the precision's dtype, and no NaN;
- on bad input (a token id out of range, a truncated weights file, a weights file missing a
  tensor) it raises a `ParityError`: not another exception, and never numbers. The contract that
  applies: a backend that declares `runs_graph` (it computes from the fixture's ONNX graph, which
  embeds its weights) is not asked about the weights file, which the harness checks itself before any
  backend runs; it is asked instead to reject a fixture whose manifest lists no ONNX graph;
- when it says it decodes the fixture (`supports_decoding`): in fp32 and fp64 (fp16, bf16 and the stored formats are
  checked on the forward pass only), a one-token prompt
  decoding its own greedy tokens and a longer prompt fed to the end of the context, each step's cache
  and logits with their shapes, the precision's dtype, and no NaN.

Every call goes through the same boundary as `parity run` (parity_harness/_backends/boundary.py), which holds
the contract's rules; a check fails with the line the run would stop with.

The numbers themselves are not compared here: that is `parity run`. The golden files of the
derived fixtures are written by the NumPy backend's forward pass, only so that they are complete;
`parity_harness._authoring.fixture_writer.write_fixture_files` writes them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from parity_harness._authoring.fixture_writer import seal_manifest, write_fixture_files
from parity_harness._backends.base import Backend, Precision
from parity_harness._backends.boundary import GuardedBackend, decode_output_problems, guarded, output_problems
from parity_harness._backends.guard import one_line
from parity_harness._backends.onnx.graph import GRAPHS
from parity_harness._core.errors import BackendMisbehaved, ParityError
from parity_harness._core.precision import DTYPES, PRECISIONS, TIERS, is_tier
from parity_harness._fixture.decoding import DecodeRequest
from parity_harness._fixture.fixture import MANIFEST, Case, Fixture, load_fixture
from parity_harness._fixture.schema import SEAL_KEY, manifest_digest
from parity_harness._run.request import ONNX_FILE_BACKEND, onnx_backend, select_backends

T = TypeVar("T")


@dataclass(frozen=True)
class ConformanceResult:
    name: str  # what was checked, e.g. "fp32 T=1: runs (single)"
    passed: bool
    message: str = ""  # why it failed (or a detail when it passed)


# -- derived fixtures ---------------------------------------------------------------------------


def _rehash(root: Path) -> None:
    """Recompute the manifest's sha256 table (and its seal) after a file was changed on purpose."""
    seal_manifest(root, rehash_files=True)


def _derived_fixture(parent: Fixture, root: Path, cases: Sequence[Case], with_onnx: bool = True) -> Fixture:
    """A fixture with `parent`'s config, weights, tolerances and ONNX files (unless not `with_onnx`), and these
    cases."""
    from parity_harness._fixture.model_spec import family

    forward = family(parent.family).module("numpy").forward  # the family's float64 NumPy reference
    config = parent.model.config
    weights = parent.weights()
    golden: dict[Precision, dict[str, dict[str, np.ndarray]]] = {}
    for precision in TIERS:
        params = {k: w.astype(DTYPES[precision]) for k, w in weights.items()}
        golden[precision] = {c.name: forward(params, config, list(c.tokens)) for c in cases}
    extra = {kind: p for kind in GRAPHS if (p := parent.onnx_path(kind)) and p.is_file()} if with_onnx else {}
    write_fixture_files(
        root,
        config=config,
        vocab=parent.vocab,
        cases=cases,
        weights=weights,
        golden=golden,
        onnx=extra,
        provenance={"command": "parity check-backend (derived fixture)"},
        tolerances=parent.manifest["tolerances"],
        family=parent.family,
    )
    return load_fixture(root)


# -- the checks ---------------------------------------------------------------------------------


def _guarded_check(name: str, fn: Callable[[], T]) -> tuple[ConformanceResult, T | None]:
    """Run one call through the boundary: a passed check and its value, or a failed one with the line it gave."""
    try:
        return ConformanceResult(name, True), fn()
    except ParityError as exc:
        return ConformanceResult(name, False, one_line(str(exc))), None


def _expect_parity_error(backend: GuardedBackend, fixture: Fixture, precision: Precision) -> str:
    """An empty string when the backend raises a ParityError of its own on this bad input, else what happened."""
    try:
        backend.outputs(fixture, precision)
    except BackendMisbehaved as exc:  # a crash (not a ParityError), or a result that breaks the contract
        return one_line(str(exc)) + " (expected a ParityError)"
    except ParityError:
        return ""
    return "returned numbers instead of raising a ParityError"


def _bad_input_checks(
    backend: GuardedBackend, parent: Fixture, work: Path, precision: Precision
) -> list[ConformanceResult]:
    config = parent.model.config
    results: list[ConformanceResult] = []

    # A token id one past the vocabulary. The loader rejects it, so it is put in after loading,
    # in the Fixture object and in manifest.json (for backends that read the directory).
    root = work / "bad_token"
    fixture = _derived_fixture(parent, root, [Case("bad_token", (0,), "bad")]).for_backend()  # editable copy
    fixture.cases = [Case("bad_token", (0, config.vocab_size), "bad")]
    fixture.manifest["cases"][0]["tokens"] = [0, config.vocab_size]
    fixture.manifest[SEAL_KEY] = manifest_digest(fixture.manifest)
    (root / MANIFEST).write_text(json.dumps(fixture.manifest, indent=2) + "\n", encoding="utf-8")
    problem = _expect_parity_error(backend, fixture, precision)
    results.append(
        ConformanceResult(f"rejects a token id out of range ({config.vocab_size})", not problem, problem)
    )

    if backend.runs_graph:
        return results + _graph_input_checks(backend, parent, work, precision)

    # A weights file cut in half (the manifest's hash updated, so only reading it can tell).
    root = work / "truncated_weights"
    _derived_fixture(parent, root, [Case("pair", (0, 1), "bad")])
    data = (root / "weights.safetensors").read_bytes()
    (root / "weights.safetensors").write_bytes(data[: len(data) // 2])
    _rehash(root)
    problem = _expect_parity_error(backend, load_fixture(root), precision)
    results.append(ConformanceResult("rejects a truncated weights file", not problem, problem))

    # A readable weights file missing its last tensor (GPT-2's ln_f.bias, the Llama family's lm_head.weight).
    from safetensors.numpy import save_file

    root = work / "missing_tensor"
    _derived_fixture(parent, root, [Case("pair", (0, 1), "bad")])
    weights = dict(parent.weights())
    last = list(weights)[-1]
    weights.pop(last)
    save_file(weights, str(root / "weights.safetensors"))
    _rehash(root)
    problem = _expect_parity_error(backend, load_fixture(root), precision)
    results.append(ConformanceResult(f"rejects weights missing a tensor ({last})", not problem, problem))
    return results


def _graph_input_checks(
    backend: GuardedBackend, parent: Fixture, work: Path, precision: Precision
) -> list[ConformanceResult]:
    """A graph backend (`runs_graph`) computes from the ONNX graph, which embeds its weights: it is not asked
    to read weights.safetensors (the harness checks that file before any backend runs), but to refuse a
    fixture whose manifest lists no graph, with a ParityError (`onnx_file` raises it)."""
    if backend.name == ONNX_FILE_BACKEND:  # the graph it runs is the one given to it, not the fixture's
        given = "not asked: it runs the graph given to it (--onnx), not the fixture's"
        return [ConformanceResult("weights file checks", True, given),
                ConformanceResult("rejects a fixture without its ONNX graph", True, given)]
    root = work / "no_graph"
    fixture = _derived_fixture(parent, root, [Case("pair", (0, 1), "bad")], with_onnx=False)
    problem = _expect_parity_error(backend, fixture, precision)
    return [ConformanceResult("weights file checks", True, "not asked: it runs the fixture's ONNX graph "
                              "(runs_graph), whose weights the harness checks"),
            ConformanceResult("rejects a fixture without its ONNX graph", not problem, problem)]


_OUTPUT_CHECKS = (("taps", "returns exactly its declared taps"), ("shapes", "shapes and dtype {dtype}"),
                  ("nan", "no NaN"))


def _output_results(label: str, problems: dict[str, str], precision: Precision) -> list[ConformanceResult]:
    dtype = np.dtype(DTYPES[precision])
    return [ConformanceResult(f"{label}: {what.format(dtype=dtype)}", not problems[key], problems[key])
            for key, what in _OUTPUT_CHECKS]


def _decoding_checks(backend: GuardedBackend, fixture: Fixture) -> list[ConformanceResult]:
    """Decoding, when the backend says it decodes `fixture`: two requests (a one-token prompt left to its own
    greedy tokens, and a longer prompt fed given tokens to the end of the context), in every precision."""
    supports, decodes = _guarded_check("supports_decoding returns a bool", lambda: backend.decodes(fixture))
    if not supports.passed or not decodes:
        return [supports] if not supports.passed else [
            ConformanceResult("decoding", True, "not supported (supports_decoding is False): not checked")]
    config = fixture.model.config
    long_prompt = tuple(i % config.vocab_size for i in range(max(1, config.n_ctx - 2)))
    requests = [
        DecodeRequest("single", (config.vocab_size - 1,), 1, None),
        DecodeRequest("to_the_end", long_prompt, config.n_ctx - len(long_prompt),
                      tuple((i + 1) % config.vocab_size for i in range(config.n_ctx - len(long_prompt)))),
    ]
    results: list[ConformanceResult] = [supports]
    for precision in (p for p in backend.precisions if is_tier(p)):  # fp32, fp64: the decoding goldens' tiers
        label = f"{precision} decoding"
        ran, out = _guarded_check(f"{label}: runs and returns a dict of arrays by prompt",
                                  lambda p=precision: backend.decoded(fixture, p, requests))  # type: ignore[misc]
        results.append(ran)
        if out is not None:
            results += _output_results(label, decode_output_problems(fixture, out, requests, precision), precision)
    return results


def backend_to_check(name: str, onnx: object = None, onnx_map: object = None) -> GuardedBackend:
    """The registered backend `name`, or, with `onnx` (and `onnx_map`), the onnx-file backend running that graph;
    a graph given for any other backend is one line."""
    graph = onnx_backend(onnx, onnx_map)
    if graph is None:
        return select_backends([name])[0][0]
    if name != ONNX_FILE_BACKEND:
        raise ParityError(f"--onnx: a graph is checked by the {ONNX_FILE_BACKEND!r} backend, not {name!r}")
    return graph


def check_backend(backend: GuardedBackend | Backend, fixture: Fixture) -> list[ConformanceResult]:
    """Every contract check of `backend` on fixtures derived from `fixture`, one result per check.

    Every call goes through the boundary (parity_harness/_backends/boundary.py), which holds the rules: what
    fails a run fails a check here, with the same line.
    """
    declared, wrapped = _guarded_check(f"declares a name, precisions (a non-empty subset of {PRECISIONS}), "
                                       "requires, description and install_hint", lambda: guarded(backend))
    if wrapped is None:
        return [declared]
    backend = wrapped
    results = [declared]
    deps, missing = _guarded_check("dependencies present", backend.missing)
    if missing:
        deps = ConformanceResult("dependencies present", False,
                                 f"missing {', '.join(missing)}; {backend.install_hint}".rstrip("; "))
    results.append(deps)
    if not deps.passed:
        return results
    declines, why = _guarded_check("declines() returns a reason or None", lambda: backend.declined(fixture))
    if not declines.passed:
        return [*results, declines]
    if why:  # nothing of its contract can be checked on a fixture it does not run on: a usage error, not a FAIL
        raise ParityError(f"check-backend {backend.name}: it declines the fixture: {why}")
    listed, taps = _guarded_check("supported taps: a subset of the manifest's, in dataflow order",
                                  lambda: backend.taps(fixture))
    if taps is not None:
        listed = ConformanceResult(listed.name, True, f"{len(taps)} of {len(fixture.tap_names)} taps")
    results.append(listed)
    if taps is None:
        return results
    config = fixture.model.config
    shortest = Case("single", (config.vocab_size - 1,), "single")  # the highest token id, alone
    longest = Case("longest", tuple(i % config.vocab_size for i in range(config.n_ctx)), "longest")
    with tempfile.TemporaryDirectory(prefix="parity-conformance-") as tmp:
        work = Path(tmp)
        derived = {c.name: _derived_fixture(fixture, work / c.name, [c]) for c in (shortest, longest)}
        for precision in backend.precisions:
            for case_name, sub in derived.items():
                label = f"{precision} T={len(sub.cases[0].tokens)}"
                ran, out = _guarded_check(f"{label}: runs ({case_name})",
                                          lambda s=sub, p=precision: backend.outputs(s, p))  # type: ignore[misc]
                results.append(ran)
                if out is not None:
                    results += _output_results(label, output_problems(sub, out[1], taps, precision), precision)
        results += _bad_input_checks(backend, fixture, work, backend.precisions[0])
    results += _decoding_checks(backend, fixture)
    return results
