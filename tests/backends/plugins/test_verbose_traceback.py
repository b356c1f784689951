"""`parity run -v` keeps a plugin's traceback in its lines (issue 37, item 8).

The CLI's streams make every line feed inside one print a space (the backstop against a fake line from
outside), so the traceback printed in one call became one line of about 1,200 characters. Each of its lines
is now printed on its own, each sanitized: still no control character from the plugin's message.
"""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from tests.helpers import cli_with_backends

BACKENDS = '''
from parity_harness._backends.numpy_backend import NumpyBackend


def _deep(n):
    if n == 0:
        raise RuntimeError("the kernel failed\\x1b[2K: FAKE PASS")
    return _deep(n - 1)


class VerboseCrasher(NumpyBackend):
    name = "verbose-crasher"

    def run(self, fixture, precision):
        return _deep(3)
'''

_module = ModuleType("tests._verbose_traceback_backends")
exec(compile(BACKENDS, "<verbose-traceback backends>", "exec"), _module.__dict__)
sys.modules[_module.__name__] = _module


def test_verbose_keeps_the_traceback_s_lines(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cli = cli_with_backends(monkeypatch, capsys, _module.__name__, [_module.VerboseCrasher])
    code, out, err = cli("run", "-q", "-v", "--backends", "verbose-crasher", "--precision", "fp64")
    assert code == 2, (out[-500:], err)
    lines = err.splitlines()
    assert lines[0].startswith("parity: error: backend 'verbose-crasher' crashed in run (fp64): RuntimeError"), lines
    assert "Traceback (most recent call last):" in lines, lines[:5]
    assert sum(1 for ln in lines if ln.lstrip().startswith("File ")) >= 4, err  # run, _deep x 4: a frame a line
    assert lines[-1].startswith("RuntimeError: the kernel failed"), lines[-1]
    assert max(len(ln) for ln in lines) < 400, max(lines, key=len)
    assert "\x1b" not in err and "\\x1b[2K" in lines[-1]  # each line sanitized

