"""Beyond a source checkout: the wheel carries what every built-in backend needs, and the toy fixture.

The wheel is built from this checkout and unpacked into a directory put first on PYTHONPATH (what
`pip install` would put in site-packages, without reinstalling torch and onnxruntime); `parity run`
then runs from an empty directory, with the fixture and the TypeScript model the wheel holds.
`nox -s install_check` does the same with a real `pip install .` into a fresh virtualenv.
The browser backends need npm packages (`npm ci` in a source checkout), which no wheel carries:
there they are skipped, each with one line that says so, and every other built-in backend runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import NAMED_ONLY, REPO, builtin_backends

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools builds in the source tree (build/, *.egg-info), so a build in the
    # checkout itself would leave those behind and would ship whatever stale files an earlier build left.
    source = out / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".nox", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("parity_harness-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_the_wheel_holds_the_typescript_model_and_the_fixtures(unpacked_wheel: Path) -> None:
    ts = unpacked_wheel / "parity_harness" / "_ts_model"
    shipped = {p.relative_to(ts).as_posix() for p in ts.rglob("*") if p.is_file()}
    for sub in ("model", "node"):  # every model file and Node entry point of the checkout, nothing else
        assert {f"{sub}/{p.name}" for p in (REPO / "ts_model" / sub).iterdir() if p.suffix in (".ts", ".mts", ".mjs")} \
            <= shipped
    assert {"model/model.ts", "model/erf.ts", "node/run.ts", "node/run-decode.ts", "node/verify-forward.mts",
            "node/verify.mjs"} <= shipped
    assert {p.split("/")[0] for p in shipped} == {"model", "node"}  # not tests/, browser/, web/ (a checkout's)
    toy = unpacked_wheel / "parity_harness" / "_toy_fixture"
    assert {p.name for p in toy.iterdir()} == {p.name for p in (REPO / "fixtures" / "toy").iterdir()}
    stress = unpacked_wheel / "parity_harness" / "_stress_fixture"  # for `parity selftest`'s stability mutants
    assert {p.name for p in stress.iterdir()} == {p.name for p in (REPO / "fixtures" / "toy-stress").iterdir()}


BROWSER_BACKENDS = {"typescript-browser", "onnxruntime-web", "onnxruntime-web-optimized", "onnxruntime-webgpu"}


def test_parity_run_from_an_empty_directory_runs_every_builtin_backend(unpacked_wheel: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PARITY_TS_DIR", "PYTHONPATH", "PARITY_CHROME")}
    env["PYTHONPATH"] = str(unpacked_wheel)
    proc = subprocess.run([sys.executable, "-m", "parity_harness", "run", "-q"], capture_output=True,
                          text=True, env=env, cwd=empty, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = proc.stdout.splitlines()[0]
    toy = unpacked_wheel / "parity_harness" / "_toy_fixture"
    assert header.startswith(f"parity: fixture {toy} (12 cases, 43 taps)")
    assert builtin_backends() > BROWSER_BACKENDS
    assert set(header.split("backends: ")[1].split(", ")) == builtin_backends() - BROWSER_BACKENDS - NAMED_ONLY
    assert f"parity: run only when named (--backends): {', '.join(sorted(NAMED_ONLY))}" in proc.stdout.splitlines()
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("parity: skipped: ")]
    assert len(skipped) == len(BROWSER_BACKENDS - NAMED_ONLY), skipped  # the default run never loads a named-only
    assert all("(a source checkout of parity)" in ln for ln in skipped), skipped
    assert proc.stdout.splitlines()[-1].startswith("PASS")
    assert list(empty.iterdir()) == []  # nothing written into the working directory
