"""The `torch-compile` backend: the reference under torch.compile (inductor) agrees with the goldens, and without a
C++ compiler it is reported missing in one line.

The compiling test runs once per module (toy, fp32 and fp64: four graphs, about 2 minutes on a cold inductor cache,
seconds on a warm one). Without torch or a C++ compiler it is skipped, which PARITY_REQUIRE_ALL_BACKENDS=1 (CI)
turns into a failure (tests/conftest.py).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import parity_harness._backends.registry
import parity_harness._cli.main
from parity_harness import api
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.torch_compile_backend import TorchCompileBackend, cxx_name, find_cxx, inductor_cache_dir
from parity_harness._core.errors import BackendUnavailable
from parity_harness._fixture.fixture import load_fixture
from parity_reference.taps import tap_names
from tests.conftest import REPO, TOY

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

ENTRY = EntryPoint("torch-compile", "parity_harness._backends.torch_compile_backend:TorchCompileBackend",
                   parity_harness._backends.registry.GROUP)


@pytest.fixture(scope="module")
def toy_report() -> tuple[Any, int]:
    """One run of the backend on the toy in fp32 and fp64 through the API, and the graphs inductor compiled."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'parity-harness[torch]')")
    if find_cxx() is None:
        pytest.skip(f"no C++ compiler ({cxx_name()!r}) on PATH: torch inductor needs one")
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    report = api.run([TorchCompileBackend()], str(TOY), ["fp32", "fp64"], decoding=False)
    return report, counters["stats"]["unique_graphs"] - before


def test_it_passes_the_toy_in_fp32_and_fp64_on_every_tap(toy_report: tuple[Any, int]) -> None:
    report, _graphs = toy_report
    assert report.passed, [(r.tap, r.case, r.max_abs) for r in report.results if not r.passed][:5]
    fixture = load_fixture(TOY)
    tiers = {(r.precision, r.golden) for r in report.results}
    assert tiers == {("fp32", "fp32"), ("fp64", "fp64"), ("fp64", "fp32")}
    for tier in tiers:  # every tap of every case, compared and within tolerance
        rows = [r for r in report.results if (r.precision, r.golden) == tier]
        assert {(r.case, r.tap) for r in rows} == {(c.name, t) for c in fixture.cases
                                                   for t in tap_names(fixture.config.n_layer)}
        assert all(r.status == "ok" and r.passed for r in rows), tier


def test_every_length_is_served_by_few_compiled_graphs(toy_report: tuple[Any, int]) -> None:
    """Dynamic in T: the toy's 8 distinct lengths take at most 2 graphs per precision (T = 1 specializes)."""
    report, graphs = toy_report
    fixture = load_fixture(TOY)
    assert len({len(c.tokens) for c in fixture.cases}) == 8
    assert {(r.backend, r.precision) for r in report.runs} == {("torch-compile", "fp32"), ("torch-compile", "fp64")}
    assert 2 <= graphs <= 4, graphs  # at least one graph per precision (it compiled), never one per length


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

