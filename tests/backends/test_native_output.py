"""`silenced()` keeps native code's output off the report (issue 37, item 8).

ExecuTorch's C++ logging wrote to file descriptors 1 and 2 under `silenced()`, which only replaced Python's
sys.stdout and sys.stderr, so it landed in the report. Now fd 1 and 2 point to a temporary file while any thread
is silenced: `os.write` and libc's printf/puts (buffered, never flushed by the backend) stay off, what native code
wrote is kept (`captured_native`), and the descriptors work as before afterwards.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from parity_harness import api
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._backends.quiet import silenced

posix = pytest.mark.skipif(os.name != "posix", reason="libc's printf through ctypes.CDLL(None)")


def _native_noise(tag: str) -> None:
    os.write(1, f"native noise {tag} fd1\n".encode())
    os.write(2, f"native noise {tag} fd2\n".encode())
    if os.name == "posix":
        libc = ctypes.CDLL(None)
        libc.printf(f"native noise {tag} printf\n".encode())  # buffered in C's stdout: no fflush here
        libc.puts(f"native noise {tag} puts".encode())


@posix
def test_native_writes_inside_silenced_stay_off(capfd: pytest.CaptureFixture[str]) -> None:
    from parity_harness._backends.quiet import captured_native

    capfd.readouterr()
    with silenced():
        _native_noise("a")
    print("parity's own line", flush=True)
    os.write(2, b"after: fd 2 works\n")
    out, err = capfd.readouterr()
    assert "native noise" not in out + err, (out, err)
    assert out == "parity's own line\n" and err == "after: fd 2 works\n", (out, err)
    kept = captured_native()
    assert all(f"native noise a {how}" in kept for how in ("fd1", "fd2", "printf", "puts")), kept


@posix
def test_nested_and_repeated_silenced_put_the_descriptors_back(capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    before = (os.fstat(1).st_ino, os.fstat(2).st_ino)
    for _ in range(3):
        with silenced(), silenced():
            _native_noise("b")
    assert (os.fstat(1).st_ino, os.fstat(2).st_ino) == before
    out, err = capfd.readouterr()
    assert "native noise" not in out + err, (out, err)
    # a backend stuck in native code under `silenced` is ended by the watchdog: its one line still reaches stderr
    code = ("from parity_harness._backends.quiet import silenced\n"
            "from parity_harness._backends.guard import hard_stop\n"
            "with silenced():\n"
            "    hard_stop(\"backend 'stuck' did not return\")\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr == "parity: error: backend 'stuck' did not return\n", proc.stderr


class NoisyNative(NumpyBackend):
    """A backend whose library logs from native code while it computes, inside `silenced` as the guide says."""

    name = "noisy-native"

    def run(self, fixture, precision):  # type: ignore[no-untyped-def]
        with silenced():
            _native_noise("backend")
            return super().run(fixture, precision)


@posix
def test_a_backend_s_native_logging_stays_off_the_report(capfd: pytest.CaptureFixture[str]) -> None:
    from parity_harness._backends.quiet import unsilenced_stderr

    capfd.readouterr()
    report = api.run(NoisyNative(), None, "fp64", decoding=False)
    text = api.render(report)
    out, err = capfd.readouterr()
    assert report and "native noise" not in text + out + err, (out, err)
    with silenced():
        print("parity: a note from inside", file=unsilenced_stderr(), flush=True)  # still reaches the user
    assert capfd.readouterr().err == "parity: a note from inside\n"
    assert sys.stdout.write("x") == 1  # the streams are usable again

