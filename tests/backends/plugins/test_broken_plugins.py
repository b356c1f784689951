"""One broken plugin is one line, not a stopped tool (issue 37, items 7 and 8).

A plugin written for the previous layout (`from harness.plugin import Backend`, `from reference.numpy_model
import forward`) fails to import: its one line names the module to import instead. Registered beside a working
backend, it is listed as broken by `parity backends`; a run that did not name it (the default selection) runs the
others and ends with exit 2 naming it, through the CLI, the API and the pytest plugin alike; a run that named it
is refused before anything runs. Exit 0 never happens with a broken plugin registered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from parity_harness import api
from parity_harness._core.errors import ParityError
from parity_harness._core.status import Verdict
from tests.helpers import plugin_args

OLD_HARNESS = '''
from harness.plugin import Backend


class OldLayout(Backend):
    name = "old-layout"
'''
OLD_REFERENCE = '''
from parity_harness.plugin import Backend
from reference.numpy_model import forward


class OldReference(Backend):
    name = "old-reference"
'''


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, EntryPoint]:
    """`numpy` and two plugins of the previous layout registered, nothing else (importable from tmp_path)."""
    import parity_harness._backends.registry as registry
    import parity_harness._cli.main as cli

    (tmp_path / "old_layout_plugin.py").write_text(OLD_HARNESS)
    (tmp_path / "old_reference_plugin.py").write_text(OLD_REFERENCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = registry.backend_entry_points()
    registered = {"numpy": real["numpy"],
                  "old-layout": EntryPoint("old-layout", "old_layout_plugin:OldLayout", registry.GROUP),
                  "old-reference": EntryPoint("old-reference", "old_reference_plugin:OldReference", registry.GROUP)}
    monkeypatch.setattr(registry, "backend_entry_points", lambda: registered)
    monkeypatch.setattr(cli, "backend_entry_points", lambda: registered)
    return registered


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    import parity_harness._cli.main as cli

    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("name", "old", "new"), [("old-layout", "harness", "parity_harness.plugin"),
                                                  ("old-reference", "reference", "parity_reference")])
def test_a_module_that_moved_is_one_line_naming_the_new_one(plugins: dict[str, EntryPoint], name: str, old: str,
                                                             new: str) -> None:
    from parity_harness._backends.registry import load_backend

    with pytest.raises(ParityError) as caught:
        load_backend(name)
    line = str(caught.value)
    assert "\n" not in line and f"backend {name!r}" in line, line
    assert f"No module named '{old}" in line and f"import {new} " in line, line


def test_parity_backends_lists_a_broken_plugin_with_its_line(plugins: dict[str, EntryPoint],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "backends")
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert code == 2, (out, err)  # listed, and still an error: a CI step sees it
    assert "available" in rows["numpy"], out
    assert "broken:" in rows["old-layout"] and "parity_harness.plugin" in rows["old-layout"], out
    assert "broken:" in rows["old-reference"] and "parity_reference" in rows["old-reference"], out
    assert err.count("\n") == 1 and "2 registered backend(s) broken" in err, err


def test_a_run_that_did_not_name_it_runs_the_others_and_exits_2(plugins: dict[str, EntryPoint],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", "-q", "--precision", "fp64")
    assert code == 2, (out[-1500:], err)
    assert "backends: numpy" in out and "numpy" in out.splitlines()[-1] + out, out[-1500:]  # numpy ran, reported
    broken = [line for line in err.splitlines() if "broken plugin" in line]
    assert len(broken) == 2, err
    assert "old-layout" in broken[0] and "parity_harness.plugin" in broken[0], broken
    assert "old-reference" in broken[1] and "parity_reference" in broken[1], broken
    assert "Traceback" not in err


def test_a_run_that_named_it_is_refused_before_running(plugins: dict[str, EntryPoint],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "run", "-q", "--backends", "numpy,old-layout", "--precision", "fp64")
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and "old-layout" in err and "parity_harness.plugin" in err, err


def test_the_api_runs_the_others_and_never_passes(plugins: dict[str, EntryPoint], toy_dir: Path) -> None:
    report = api.run(None, toy_dir, "fp64", decoding=False)
    assert report.n_passed > 0 and {r.backend for r in report.results} == {"numpy"}
    assert not report and report.verdict == Verdict.CRASHED  # exit 2, never AGREE
    assert [b.split(":")[0] for b in report.broken] == ["old-layout", "old-reference"]
    with pytest.raises(api.ParityAssertionError) as caught:
        api.assert_agrees(None, toy_dir, "fp64", decoding=False)  # type: ignore[arg-type]
    assert "broken" in str(caught.value) and "old-layout" in str(caught.value), str(caught.value)
    assert "PASS" not in str(caught.value)
    with pytest.raises(ParityError, match=r"parity_harness\.plugin"):
        api.run(["numpy", "old-layout"], toy_dir, "fp64")


CONFTEST = '''
from importlib.metadata import EntryPoint

import parity_harness._backends.registry as registry

_real = registry.backend_entry_points()
_registered = {{"numpy": _real["numpy"], "old-layout": EntryPoint("old-layout", "old_layout_plugin:OldLayout",
                                                                  registry.GROUP)}}
registry.backend_entry_points = lambda: _registered
'''
SUITE = '''
def test_default_selection(parity):
    report = parity.run(None, precisions="fp64", decoding=False)
    assert report.n_passed > 0 and not report and report.broken, report.broken
    parity.assert_agrees(None, precision="fp64", decoding=False)


def test_named(parity):
    parity.assert_agrees(["numpy", "old-layout"], precision="fp64", decoding=False)
'''


def test_the_pytest_plugin_behaves_the_same(tmp_path: Path) -> None:
    (tmp_path / "old_layout_plugin.py").write_text(OLD_HARNESS)
    (tmp_path / "conftest.py").write_text(CONFTEST.format())
    (tmp_path / "test_broken.py").write_text(textwrap.dedent(SUITE))
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "CI": "true"}  # CI: pytest's summary lines uncut
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-rf",
                           "-p", "no:randomly"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False, env=env)
    out = proc.stdout
    assert proc.returncode == 1 and "2 failed" in out, out[-3000:] + proc.stderr[-2000:]
    default = next(ln for ln in out.splitlines() if ln.startswith("FAILED test_broken.py::test_default_selection"))
    assert "1 registered plugin(s) broken, not run: old-layout" in default, default
    assert "1 registered plugin(s) broken, not run: old-layout" in out, out[-3000:]
    named = next(ln for ln in out.splitlines() if ln.startswith("FAILED test_broken.py::test_named"))
    assert "parity: error:" in named and "old-layout" in named, named
    assert "import parity_harness.plugin" in out, out[-3000:]
