"""The `torch-compile` backend: the reference under torch.compile (inductor) agrees with the goldens, and without a
C++ compiler it is reported missing in one line.

The compiling test runs once per module (toy, fp32 and fp64: four graphs, about 2 minutes on a cold inductor cache,
seconds once they are precompiled); a second run loads them and traces nothing. Without torch or a C++ compiler it
is skipped, which PARITY_REQUIRE_ALL_BACKENDS=1 (CI) turns into a failure (tests/conftest.py).
"""

from __future__ import annotations

import shutil
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import parity_harness._backends.registry
import parity_harness._backends.torch_compile_backend as tcb
import parity_harness._cli.main
from parity_harness import api
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.torch_compile_backend import TorchCompileBackend, cxx_name, find_cxx, inductor_cache_dir
from parity_harness._core.errors import BackendUnavailable
from parity_harness._fixture.fixture import load_fixture
from parity_reference.taps import tap_names
from tests.helpers import REPO, TOY

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

ENTRY = EntryPoint("torch-compile", "parity_harness._backends.torch_compile_backend:TorchCompileBackend",
                   parity_harness._backends.registry.GROUP)


def _rows(report: Any) -> list[tuple[Any, ...]]:
    """Every check of a report, timings left out: what two runs must agree on exactly."""
    return sorted((r.precision, r.golden, r.case, r.tap, r.status, r.passed, r.max_abs) for r in report.results)


@pytest.fixture(scope="module")
def toy_report() -> tuple[Any, int, list[str]]:
    """One run of the backend on the toy in fp32 and fp64 through the API, the graphs dynamo traced in it, and
    the kinds of graph the backend asked its cache for (loaded, or compiled and saved)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    if find_cxx() is None:
        pytest.skip(f"no C++ compiler ({cxx_name()!r}) on PATH: torch inductor needs one")
    from torch._dynamo.utils import counters

    asked: list[str] = []
    real = tcb._load_or_compile

    def spy(taps_of: Any, params: Any, tokens: Any, parts: dict[str, Any]) -> Any:
        asked.append(f"{parts['precision']} {parts['graph']}")
        return real(taps_of, params, tokens, parts)

    tcb._load_or_compile = spy
    try:
        before = counters["stats"]["unique_graphs"]
        report = api.run([TorchCompileBackend()], str(TOY), ["fp32", "fp64"], decoding=False)
    finally:
        tcb._load_or_compile = real
    return report, counters["stats"]["unique_graphs"] - before, asked


def test_it_passes_the_toy_in_fp32_and_fp64_on_every_tap(toy_report: tuple[Any, int, list[str]]) -> None:
    report, _graphs, _asked = toy_report
    assert report.passed, [(r.tap, r.case, r.max_abs) for r in report.results if not r.passed][:5]
    fixture = load_fixture(TOY)
    tiers = {(r.precision, r.golden) for r in report.results}
    assert tiers == {("fp32", "fp32"), ("fp64", "fp64"), ("fp64", "fp32")}
    for tier in tiers:  # every tap of every case, compared and within tolerance
        rows = [r for r in report.results if (r.precision, r.golden) == tier]
        assert {(r.case, r.tap) for r in rows} == {(c.name, t) for c in fixture.cases
                                                   for t in tap_names(fixture.config.n_layer)}
        assert all(r.status == "ok" and r.passed for r in rows), tier


def test_every_length_is_served_by_two_graphs_per_precision(toy_report: tuple[Any, int, list[str]]) -> None:
    """Dynamic in T: the toy's 8 distinct lengths take 2 graphs per precision (T = 1 specializes), each traced
    at most once (none when the cache had them)."""
    report, graphs, asked = toy_report
    fixture = load_fixture(TOY)
    assert len({len(c.tokens) for c in fixture.cases}) == 8
    assert {(r.backend, r.precision) for r in report.runs} == {("torch-compile", "fp32"), ("torch-compile", "fp64")}
    assert sorted(asked) == ["fp32 T=1", "fp32 T>=2", "fp64 T=1", "fp64 T>=2"], asked
    assert graphs in (0, 4), graphs  # 0: all four loaded; 4: compiled (and saved); never one per length


def test_a_second_run_loads_its_graphs_traces_nothing_and_agrees_exactly(
        toy_report: tuple[Any, int, list[str]]) -> None:
    from torch._dynamo.utils import counters

    first, _graphs, _asked = toy_report
    before = counters["stats"]["unique_graphs"]
    again = api.run([TorchCompileBackend()], str(TOY), ["fp32", "fp64"], decoding=False)
    assert counters["stats"]["unique_graphs"] - before == 0  # every graph loaded from the precompiled cache
    assert again.passed and _rows(again) == _rows(first)


def test_the_cache_key_is_the_content_a_graph_depends_on() -> None:
    """Each part of what a graph was compiled from changes its entry's name; the cache's path is no part of it."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    fixture = load_fixture(TOY)
    params = {"wte.weight": torch.zeros(12, 8, dtype=torch.float32)}
    parts = tcb.key_parts(fixture.config, None, "fp32", params) | {"graph": tcb.graph_kind(False)}
    key = tcb.graph_key(parts)
    assert key == tcb.graph_key(dict(reversed(list(parts.items()))))  # canonical: order does not matter
    assert str(inductor_cache_dir()) not in repr(parts)
    changed = [
        parts | {"graph": tcb.graph_kind(True)},
        parts | {"precision": "fp64"},
        parts | {"lens_rows": 2},
        parts | {"config": {**parts["config"], "n_layer": 3}},
        parts | {"params": {"wte.weight": [[13, 8], "torch.float32"]}},
        parts | {"model_source": "0" * 64},
        parts | {"backend_source": "0" * 64},
        parts | {"torch": "0.0"},
        parts | {"cpu_capability": "DEFAULT"},
    ]
    assert len({key, *(tcb.graph_key(p) for p in changed)}) == 1 + len(changed)
    assert parts["model_source"] == tcb.source_sha256(__import__("parity_reference.model").model)


def test_a_broken_cache_entry_is_compiled_again_and_replaced(
        toy_report: tuple[Any, int, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """In a copy of the cache: the shared one is read by this module's other tests, on another xdist worker
    (`-n 2`), and one of them read the broken entry while it was there. PARITY_DEBUG=1 says why it is compiled
    again, past the silencing the backend computes in."""
    import torch

    from parity_reference.run import torch_params

    first, _graphs, _asked = toy_report
    fixture = load_fixture(TOY)
    params = torch_params(fixture.weights(), "fp32")
    parts = tcb.key_parts(fixture.config, fixture.lens_rows(), "fp32", params)
    names = [f"{tcb.graph_key(parts | {'graph': tcb.graph_kind(single)})}.bin" for single in (False, True)]
    assert all((tcb.precompiled_dir() / n).is_file() for n in names)  # the first run saved them
    copy = tmp_path / "parity-precompiled"
    copy.mkdir()
    for name in names:
        shutil.copyfile(tcb.precompiled_dir() / name, copy / name)
    monkeypatch.setattr(tcb, "precompiled_dir", lambda: copy)
    entry = copy / names[0]
    entry.write_bytes(b"not a compiled graph")
    monkeypatch.setenv("PARITY_DEBUG", "1")
    capsys.readouterr()
    again = api.run([TorchCompileBackend()], str(TOY), ["fp32"], decoding=False)
    said = capsys.readouterr().err
    assert f"parity: debug: torch-compile: precompiled graph {names[0]} not loaded (UnpicklingError" in said, said
    assert again.passed and _rows(again) == [r for r in _rows(first) if r[0] == "fp32"]
    with open(entry, "rb") as f:  # replaced by a graph that loads
        assert torch.compiler.load_compiled_function(f) is not None


def test_without_a_compiler_it_is_missing_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))  # the variable torch reads its compiler from
    assert find_cxx() is None
    backend = GuardedBackend.wrap(TorchCompileBackend())
    why = backend.unavailable()
    assert why is not None and "\n" not in why
    assert why.startswith("backend 'torch-compile' needs ") and "a C++ compiler" in why and "no-such-g++" in why
    with pytest.raises(BackendUnavailable, match=r"needs .*a C\+\+ compiler"):
        api.run([TorchCompileBackend()], str(TOY), ["fp32"])
    # Asked for by name on the command line: one error line, exit 2, nothing compiled.
    registered = {**parity_harness._backends.registry.backend_entry_points(), "torch-compile": ENTRY}
    monkeypatch.setattr(parity_harness._backends.registry, "backend_entry_points", lambda: registered)
    monkeypatch.setattr(parity_harness._cli.main, "backend_entry_points", lambda: registered)
    capsys.readouterr()
    code = parity_harness._cli.main.main(["run", "--fixture", str(TOY), "--backends", "torch-compile", "-q"])
    out, err = capsys.readouterr()
    assert code == 2, (out[-2000:], err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parity: error: "), err
    assert "a C++ compiler" in lines[0] and "Traceback" not in out + err


def test_inductor_cache_is_the_users_cache_dir_never_the_checkout(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert inductor_cache_dir() == tmp_path / "cache" / "parity" / "torchinductor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert REPO not in inductor_cache_dir().parents
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"

