"""The TypeScript backend: Node runs ts_model/node/run.ts on a fixture and its taps match the golden files.

Uses fixtures/toy when it exists, else a fixture of random weights
(`tests.helpers.build_random_fixture`, torch needed). Set PARITY_TEST_FIXTURE to use
another fixture directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from parity_harness._backends.node.runtime import find_node, ts_dir
from parity_harness._backends.node.typescript_backend import TypeScriptBackend
from parity_harness._core.errors import BackendFailed, BackendUnavailable
from parity_harness._fixture.fixture import Fixture, load_fixture
from tests.helpers import build_random_fixture, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

REPO = Path(__file__).resolve().parents[2]
TOY_FIXTURE = REPO / "fixtures" / "toy"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PARITY_TEST_FIXTURE, else fixtures/toy if it exists, else a random-weights fixture."""
    override = os.environ.get("PARITY_TEST_FIXTURE")
    if override:
        return Path(override)
    if (TOY_FIXTURE / "manifest.json").is_file():
        return TOY_FIXTURE
    pytest.importorskip("torch")
    return build_random_fixture(tmp_path_factory.mktemp("fixture") / "toy")


@pytest.fixture(scope="module")
def fixture(fixture_dir: Path) -> Fixture:
    return load_fixture(fixture_dir)


@pytest.fixture
def node_available() -> str:
    try:
        return find_node()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("PARITY_NODE", "PARITY_NODE_TIMEOUT", "PARITY_TS_DIR", "PARITY_TS_THREADS"):
        monkeypatch.delenv(name, raising=False)
    yield


def _fake_node(tmp_path: Path, body: str) -> Path:
    """An executable shell script standing in for Node."""
    script = tmp_path / "fake-node"
    script.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


# -- the backend on a fixture ----------------------------------------------------------------


def test_fp64_output_matches_both_golden_tiers(fixture: Fixture, node_available: str) -> None:
    out = TypeScriptBackend().run(fixture, "fp64")
    golden64, golden32 = fixture.golden("fp64"), fixture.golden("fp32")
    assert list(out) == [c.name for c in fixture.cases]
    for case in fixture.cases:
        assert list(out[case.name]) == fixture.tap_names
        for tap in fixture.tap_names:
            a, b64 = out[case.name][tap], golden64[case.name][tap]
            b32 = golden32[case.name][tap].astype(np.float64)
            assert a.dtype == np.float64 and a.shape == b64.shape, (case.name, tap, a.shape)
            assert not np.isnan(a).any(), (case.name, tap)
            np.testing.assert_array_equal(np.isinf(a), np.isinf(b64), err_msg=f"{case.name}/{tap}")
            finite = np.isfinite(b64)
            assert (a[~finite] == b64[~finite]).all(), (case.name, tap)  # -inf meets -inf
            assert np.abs(a[finite] - b64[finite]).max(initial=0.0) <= 1e-12, (case.name, tap)
            assert np.abs(a[finite] - b32[finite]).max(initial=0.0) <= 1e-5, (case.name, tap)


def test_missing_dependencies_empty_when_node_found(node_available: str) -> None:
    assert TypeScriptBackend().missing_dependencies() == []


def test_node_unit_tests_pass(node_available: str) -> None:
    proc = subprocess.run(
        [node_available, "--test", "ts_model/tests/*.test.ts"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout or "ℹ fail 0" in proc.stdout


def test_verify_forward_passes_and_catches_an_edited_golden(
    fixture_dir: Path, node_available: str, tmp_path: Path
) -> None:
    verify = [node_available, str(REPO / "ts_model" / "node" / "verify-forward.mts")]
    ok = subprocess.run([*verify, str(fixture_dir)], capture_output=True, text=True, timeout=300, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verify-forward: OK" in ok.stdout

    from safetensors.numpy import load_file, save_file

    edited = tmp_path / "edited"
    edited.mkdir()
    for f in fixture_dir.iterdir():
        if f.is_file():
            (edited / f.name).write_bytes(f.read_bytes())
    golden = load_file(str(edited / "golden.fp64.safetensors"))
    case = load_fixture(fixture_dir).cases[0].name
    golden[f"{case}/blocks.0.mlp.hook_post"].flat[0] += 1e-3
    save_file(golden, str(edited / "golden.fp64.safetensors"))
    bad = subprocess.run([*verify, str(edited)], capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "first diverging: fp64 blocks.0.mlp.hook_post" in bad.stdout
    failing = [line for line in bad.stdout.splitlines() if " FAIL " in line]
    assert len(failing) == 1 and "blocks.0.mlp.hook_post" in failing[0]


def test_ts_dir_override_runs_a_copy(
    fixture: Fixture, node_available: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PARITY_TS_DIR points at another copy of the model (what mutation tests need)."""
    copy = tmp_path / "ts_copy"
    shutil.copytree(ts_dir(), copy, ignore=shutil.ignore_patterns("tests", "browser", "web"))
    model = copy / "model" / "model.ts"  # a mutation: erf replaced by tanh
    text = model.read_text(encoding="utf-8")
    assert text.count("(1.0 + erf(v / Math.SQRT2))") == 1
    model.write_text(text.replace("(1.0 + erf(v / Math.SQRT2))", "(1.0 + Math.tanh(v / Math.SQRT2))"), encoding="utf-8")
    monkeypatch.setenv("PARITY_TS_DIR", str(copy))
    out = TypeScriptBackend().run(fixture, "fp64")
    case = fixture.cases[-1].name
    diff = np.abs(
        out[case]["blocks.0.mlp.hook_post"] - fixture.golden("fp64")[case]["blocks.0.mlp.hook_post"]
    )
    assert diff.max() > 1e-12


# -- a missing, crashing or hanging Node -------------------------------------------------------


def test_no_node_is_unavailable(fixture: Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARITY_NODE", str(tmp_path / "no-such-node"))
    backend = TypeScriptBackend()
    assert backend.missing_dependencies() == ["node (Node.js >= 22.18)"]
    with pytest.raises(BackendUnavailable) as info:
        backend.run(fixture, "fp64")
    message = str(info.value)
    assert "no-such-node" in message and "pip install 'parity-harness[node]'" in message and "\n" not in message


@pytest.mark.skipif(sys.platform == "win32", reason="shell-script stand-in for Node")
def test_crashing_node_fails_with_its_last_stderr_line(
    fixture: Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake_node(tmp_path, 'echo "some noise" >&2\necho "Error: boom in model.ts" >&2\nexit 3')
    monkeypatch.setenv("PARITY_NODE", str(fake))
    with pytest.raises(BackendFailed) as info:
        TypeScriptBackend().run(fixture, "fp64")
    message = str(info.value)
    assert "exit code 3" in message and "Error: boom in model.ts" in message and "\n" not in message


@pytest.mark.skipif(sys.platform == "win32", reason="shell-script stand-in for Node")
def test_hanging_node_times_out(fixture: Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _fake_node(tmp_path, "sleep 30")
    monkeypatch.setenv("PARITY_NODE", str(fake))
    monkeypatch.setenv("PARITY_NODE_TIMEOUT", "1")
    with pytest.raises(BackendFailed, match=r"timed out after 1 s$") as info:
        TypeScriptBackend().run(fixture, "fp64")
    assert "\n" not in str(info.value)


def test_bad_timeout_value(fixture: Fixture, monkeypatch: pytest.MonkeyPatch, node_available: str) -> None:
    monkeypatch.setenv("PARITY_NODE_TIMEOUT", "soon")
    with pytest.raises(BackendFailed, match="PARITY_NODE_TIMEOUT"):
        TypeScriptBackend().run(fixture, "fp64")


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "four", "65", "\u0663"])
def test_bad_thread_count_is_one_line_before_node_starts(fixture: Fixture, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path, value: str) -> None:
    started = tmp_path / "started"
    monkeypatch.setenv("PARITY_NODE", str(_fake_node(tmp_path, f"touch {started}")))
    monkeypatch.setenv("PARITY_TS_THREADS", value)
    with pytest.raises(BackendFailed, match=r"^PARITY_TS_THREADS=.* must be a whole number from 1 to 64$"):
        TypeScriptBackend().run(fixture, "fp64")
    assert not started.exists()


def test_node_runs_with_its_compile_cache_in_the_user_cache_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from parity_harness._backends.node.runtime import node_env

    for name in ("NODE_COMPILE_CACHE", "NODE_DISABLE_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert node_env()["NODE_COMPILE_CACHE"] == str(tmp_path / "cache" / "parity" / "node-compile-cache")
    monkeypatch.setenv("NODE_COMPILE_CACHE", str(tmp_path / "mine"))
    assert node_env()["NODE_COMPILE_CACHE"] == str(tmp_path / "mine")
    monkeypatch.delenv("NODE_COMPILE_CACHE")
    monkeypatch.setenv("NODE_DISABLE_COMPILE_CACHE", "1")
    assert "NODE_COMPILE_CACHE" not in node_env()


def test_node_on_path_is_version_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without PARITY_NODE or the wheel, a `node` on PATH must be new enough to strip types."""
    import parity_harness._backends.node.runtime as tsb

    old = _fake_node(tmp_path, 'echo "v20.11.1"')
    old.rename(tmp_path / "node")
    monkeypatch.setattr(tsb, "_wheel_node", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailable, match=r"Node 20\.11, too old"):
        find_node()
    assert tsb.can_strip_types((22, 18)) and tsb.can_strip_types((23, 6)) and tsb.can_strip_types((24, 0))
    assert not tsb.can_strip_types((22, 17)) and not tsb.can_strip_types((23, 5))


def test_verify_mjs_says_in_one_line_when_node_cannot_run_typescript(node_available: str) -> None:
    """verify.mjs is plain JavaScript: on a Node without type stripping (Node 20, or stripping turned off,
    as here) it prints one line naming the Node and the fix, exit 2, no stack trace."""
    verify = str(REPO / "ts_model" / "node" / "verify.mjs")
    proc = subprocess.run([node_available, "--no-experimental-strip-types", verify],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verify: error: this Node (v"), proc.stderr
    assert "needs Node >= 22.18" in lines[0] and "parity verify-ts" in lines[0]
    ok = subprocess.run([node_available, verify], capture_output=True, text=True,
                        timeout=300, check=False)
    assert ok.returncode == 0 and "verify-forward: OK" in ok.stdout, ok.stdout + ok.stderr


def test_parity_verify_ts_runs_the_node_only_check_with_pips_node(
    node_available: str, fixture_dir: Path, tmp_path: Path
) -> None:
    ok = run_cli("verify-ts", "--fixture", str(fixture_dir))
    assert ok.returncode == 0 and "verify-forward: OK" in ok.stdout, ok.stdout + ok.stderr
    missing = run_cli("verify-ts", "--fixture", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.startswith("parity: error: ") and "nowhere" in missing.stderr
