"""The CI workflows help when they fail: the Markdown summary is written, pip, npm and torch-compile's graphs
are cached by the content that decides them, torch is not installed for a session that can reuse another's,
and each OS job either runs the browser backends or says in one line why it cannot, by an explicit flag.

Read from .github/workflows/*.yml with PyYAML (installed with the test extra's dependencies).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from parity_harness._core.resources import user_cache_dir

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict)
    return data


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    steps = job["steps"]
    assert isinstance(steps, list)
    return steps


def _runs(job: dict[str, Any]) -> list[str]:
    return [" ".join(str(s["run"]).split()) for s in _steps(job) if "run" in s]


def _uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s.get("with", {}) for s in _steps(job) if str(s.get("uses", "")).startswith(action + "@")]


def _pip_cached(job: dict[str, Any]) -> bool:
    return any(w.get("cache") == "pip" and w.get("cache-dependency-path") == "pyproject.toml"
               for w in _uses(job, "actions/setup-python"))


@pytest.fixture
def gate() -> dict[str, Any]:
    job = _load("parity.yml")["jobs"]["parity"]
    assert isinstance(job, dict)
    return job


def test_the_gate_writes_the_markdown_summary(gate: dict[str, Any]) -> None:
    check = next(r for r in _runs(gate) if "nox -s parity" in r)
    match = re.search(r"--markdown[ =](\S+)", check)
    assert match, check
    # `parity run` appends the summary to $GITHUB_STEP_SUMMARY itself when it is set (writing --markdown's file
    # too): naming that file as --markdown would write the summary into it twice.
    assert "GITHUB_STEP_SUMMARY" not in match.group(1)
    main = (REPO / "harness" / "parity_harness" / "_cli" / "main.py").read_text()
    assert 'os.environ.get("GITHUB_STEP_SUMMARY")' in main
    summary = Path(match.group(1))
    uploaded = "\n".join(str(w.get("path", "")) for w in _uses(gate, "actions/upload-artifact"))
    assert str(summary) in uploaded and f"{summary.stem}.toy-stress{summary.suffix}" in uploaded, uploaded


def test_the_gate_caches_pip_npm_and_compiled_graphs_by_content(gate: dict[str, Any],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert _pip_cached(gate)
    caches = _uses(gate, "actions/cache")
    npm = [c for c in caches if c.get("path") == "~/.npm"]
    assert npm and "hashFiles('package-lock.json')" in npm[0]["key"], caches
    # torch-compile's graphs: the directory the backend uses by default (no TORCHINDUCTOR_CACHE_DIR, no
    # XDG_CACHE_HOME), written relative to the home directory, keyed by the files that decide the graphs.
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    default = user_cache_dir("torchinductor")
    home_relative = "~/" + default.relative_to(Path.home()).as_posix()
    graphs = [c for c in caches if c.get("path") == home_relative]
    assert graphs, (home_relative, caches)
    key = graphs[0]["key"]
    for decides in ("pyproject.toml", "harness/parity_harness/_backends/torch_compile_backend.py",
                    "reference/parity_reference/**/*.py", "fixtures/*/manifest.json"):
        assert f"'{decides}'" in key, key
        assert (REPO / decides.split("*")[0]).exists(), decides


def test_torch_is_installed_once_per_virtualenv_that_needs_its_own(gate: dict[str, Any]) -> None:
    sessions = [m.group(1) for r in _runs(gate) for m in re.finditer(r"nox -s (\w+)", r)]
    assert "slow" not in sessions, sessions  # the slow tests run in the tests session's virtualenv
    assert any(re.search(r"nox -s tests -- .*-m slow", r) for r in _runs(gate))
    assert len(set(sessions)) == len(sessions) - 1  # tests twice (fast, then slow), every other session once


def test_each_os_job_runs_the_browser_backends_or_says_why_not(gate: dict[str, Any]) -> None:
    matrix = gate["strategy"]["matrix"]["include"]
    assert len(matrix) >= 3
    for entry in matrix:
        assert "no_browser" in entry, entry  # a decision, for every OS
        x86_linux = entry["os"].startswith("ubuntu") and not entry["os"].endswith("-arm")
        if x86_linux:
            assert entry["no_browser"] == "", entry
        else:
            reason = entry["no_browser"]
            assert reason and "\n" not in reason and "x86-64" in reason, entry
    assert gate["env"]["NO_BROWSER"] == "${{ matrix.no_browser }}"
    check = next(r for r in _runs(gate) if "nox -s parity" in r)
    assert '${NO_BROWSER:+"--without-browser=$NO_BROWSER"}' in check  # the session's explicit flag (noxfile.py)
    said = [r for r in _runs(gate) if "::notice" in r and "$NO_BROWSER" in r]
    assert said, "the job prints the reason in one line"


def test_the_sharded_example_caches_pip_and_writes_summaries() -> None:
    jobs = _load("parity-sharded.yml")["jobs"]
    for name, job in jobs.items():
        assert _pip_cached(job), name
    assert any("--markdown summary-${{ matrix.group }}.md" in r for r in _runs(jobs["shard"]))
    assert any("parity merge" in r and "--markdown" in r for r in _runs(jobs["merge"]))
