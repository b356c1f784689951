"""torch-compile with an unusable cache directory: a private temporary cache, said once on stderr, never a crash.

The fast tests check the choice of directory (`usable_cache_dir`, which `import_requirements` calls first: no torch
imported, no compile); the full one compiles the toy in fp32 through the CLI with $TORCHINDUCTOR_CACHE_DIR under a
regular file (a cold compile: a minute or more on the toy, `nox -s full`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import parity_harness._backends.torch_compile_backend as tcb
from parity_harness._backends.torch_compile_backend import cxx_name, find_cxx
from tests.helpers import TOY, run_cli


@pytest.fixture
def bad_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TORCHINDUCTOR_CACHE_DIR set to a path under a regular file: it can be neither created nor written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    bad = blocker / "torchinductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(bad))
    return bad


def test_an_unusable_cache_directory_falls_back_to_a_private_one_said_once(
        bad_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tcb.usable_cache_dir()
    chosen = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert chosen != bad_cache and chosen.is_dir()
    (chosen / "probe").write_text("x")  # writable
    tcb.usable_cache_dir()  # run_cases calls it again (and --jobs 2's lane before it): no second line
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == chosen
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad_cache) in err[0] and "private temporary directory" in err[0], err


def test_a_usable_cache_directory_is_kept_silently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    tcb.usable_cache_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")
    assert capsys.readouterr().err == ""


@pytest.mark.full
def test_the_run_passes_with_an_unusable_cache_directory(bad_cache: Path) -> None:
    pytest.importorskip("torch")
    if find_cxx() is None:
        pytest.skip(f"no C++ compiler ({cxx_name()!r}) on PATH: torch inductor needs one")
    done = run_cli("run", "--backends", "torch-compile", "--precision", "fp32", "--fixture", str(TOY), "-q",
                   env={"TORCHINDUCTOR_CACHE_DIR": str(bad_cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PASS" in done.stdout
    said = [line for line in done.stderr.splitlines() if "private temporary directory" in line]
    assert len(said) == 1 and str(bad_cache) in said[0]
