"""One gate for `--grad`: every request `parity run --grad` refuses, `api.run(grad=True)` and the pytest plugin's
`parity.assert_agrees(..., grad=True)` refuse too, with the same line (exit 2 from the CLI, never a pass).

- a fixture without gradient goldens: refused before any backend runs;
- backends none of which has a backward: nothing compared in the backward, the verdict NOTHING_COMPARED.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parity_harness import api
from parity_harness._core.errors import ParityError
from parity_harness._core.status import Verdict
from tests.helpers import REPO, cli_with_backends, edit_manifest, plugin_args

BACKENDS = '''
from parity_harness._backends.numpy_backend import NumpyBackend


class GradNone(NumpyBackend):
    """The NumPy forward, declaring no backward."""

    name = "grad-none"

    def supports_grad(self, fixture):
        return False
'''

_module = type(sys)("tests._grad_gate_backends")
exec(compile(BACKENDS, "<grad-gate backends>", "exec"), _module.__dict__)
sys.modules[_module.__name__] = _module

# (id, fixture kind, words the one line must hold)
REFUSALS = [
    ("no-gradient-goldens", "untrained", "has no gradient goldens"),
    ("no-backend-has-a-backward", "toy", "no backend run has a backward"),
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory, toy_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grad-gate") / "untrained"
    shutil.copytree(toy_dir, root)

    def drop(m: dict) -> None:  # type: ignore[type-arg]
        for name in m["files"].pop("training").values():
            m["sha256"].pop(name)
            (root / name).unlink()
        m.pop("training")

    edit_manifest(root, drop)
    return {"toy": toy_dir, "untrained": root}


@pytest.mark.parametrize(("case", "kind", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_cli_refuses(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                         fixtures: dict[str, Path], case: str, kind: str, needle: str) -> None:
    cli = cli_with_backends(monkeypatch, capsys, _module.__name__, [_module.GradNone])
    code, out, err = cli("run", "-q", "--grad", "--fixture", str(fixtures[kind]), "--backends", "grad-none",
                         "--precision", "fp64")
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-800:], err)
    assert len(lines) == 1 and lines[0].startswith("parity: error: ") and needle in lines[0], lines
    assert "PASS" not in out


@pytest.mark.parametrize(("case", "kind", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_api_refuses(fixtures: dict[str, Path], case: str, kind: str, needle: str) -> None:
    try:
        report = api.run([_module.GradNone()], fixtures[kind], "fp64", grad=True)
    except ParityError as exc:
        assert needle in str(exc) and "\n" not in str(exc), str(exc)
        return
    assert not report and report.verdict == Verdict.NOTHING_COMPARED
    assert needle in report.nothing_compared_reason()
    with pytest.raises(api.ParityAssertionError, match=needle):
        api.assert_agrees([_module.GradNone()], fixtures[kind], "fp64", grad=True)


def test_a_fixture_without_goldens_is_refused_before_any_backend_runs(fixtures: dict[str, Path]) -> None:
    said: list[str] = []
    with pytest.raises(ParityError, match="has no gradient goldens"):
        api.run(["numpy"], fixtures["untrained"], "fp64", grad=True, progress=said.append)
    assert said == []  # no backend started


PLUGIN_TEST = '''
{backends}


def test_refused(parity):
    parity.assert_agrees([GradNone()], precision="fp64", grad=True)
'''


@pytest.mark.full  # a pytest subprocess per refusal (~10 s each): CI runs the full set
@pytest.mark.parametrize(("case", "kind", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_pytest_plugin_refuses(tmp_path: Path, fixtures: dict[str, Path], case: str, kind: str,
                                   needle: str) -> None:
    (tmp_path / "test_gate.py").write_text(PLUGIN_TEST.format(backends=BACKENDS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
                           "--parity-fixture", str(fixtures[kind])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert needle in proc.stdout, proc.stdout[-3000:]
