"""Run parity's browser driver (`ts_model/browser/run-browser.mts`) from Python, for the browser backends.

The driver is one Node script that bundles the page (esbuild), serves it and the fixture from
127.0.0.1 and runs it in headless Chrome (puppeteer-core); see docs/browser.md. This module finds
what it needs without starting anything (`missing`), and runs it as a subprocess without a shell,
through the typescript backend's Node finder and process-group handling: on a timeout the whole
group, Chrome included, is killed.

The browser backends' runs go to one driver process per run, `run-browser.mts session`, so one
Node and one Chrome serve all of them (`BrowserSession`): started by the first browser run,
closed when the run ends (`_backends/sessions.py`), restarted if the environment changed
(PARITY_CHROME, PARITY_TS_DIR, ...) and after any failed request. A request whose browser or driver
was killed by a signal (a Chromium that died of SIGSEGV on a loaded machine) is sent once more, to a
new browser, and the restart is noted in the run's report (`run_in_session`); a second kill stops the
run with one line naming the signal (exit 2). `parity serve`'s bundle and page checks run the driver
once each (`run_driver`).

Settings: `PARITY_CHROME` (a Chrome or Chromium executable; default: the Chromium of the npm
package @sparticuz/chromium), `PARITY_BROWSER_TIMEOUT` (seconds for one browser run, default 120;
the driver enforces it, and this side kills the process group 15 s later if it has not ended).
It guards against a hang: a run that is only slow, on a busy machine, has the whole of it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from parity_harness._backends import sessions
from parity_harness._backends.node.runtime import (
    Killed,
    find_node,
    kill_group,
    last_line,
    node_env,
    restarted_once,
    run_node,
    signal_name,
    tail_text,
)
from parity_harness._backends.onnx.graph import OnnxGraph, expected_outputs, onnx_file
from parity_harness._backends.quiet import unsilenced_stderr
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError
from parity_harness._core.precision import BackendOutput
from parity_harness._core.resources import CHECKOUT_DIR
from parity_harness._core.settings import seconds_from_env

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


DRIVER = CHECKOUT_DIR / "ts_model" / "browser" / "run-browser.mts"  # a source checkout only: not in the wheel
DEFAULT_TIMEOUT_S = 120.0
GRACE_S = 15.0  # after the driver's own deadline, before its process group is killed
INSTALL_HINT = "npm ci (in the parity source checkout; needs Node from `pip install 'parity-harness[node]'`)"
# What every browser run needs from node_modules; the packaged Chromium unless PARITY_CHROME is set.
DRIVER_PACKAGES = ("esbuild", "puppeteer-core")
CHROMIUM_PACKAGE = "@sparticuz/chromium"


def package_dir(name: str) -> Path | None:
    """node_modules/NAME as Node finds it from ts_model/browser/ (up the directory tree), or None."""
    for parent in DRIVER.parents:
        candidate = parent / "node_modules" / name
        if (candidate / "package.json").is_file():
            return candidate
    return None


def missing(packages: tuple[str, ...] = (), need_browser: bool = True) -> list[str]:
    """What a browser run lacks (empty when it can run): cheap, starts nothing but a cached `node --version`.

    `need_browser=False`: only bundling (`parity serve` builds the page; the user brings the browser).
    """
    try:
        find_node()
    except BackendUnavailable:
        return ["node (Node.js >= 22.18)"]
    if not DRIVER.is_file():
        return [f"{DRIVER} (a source checkout of parity)"]
    out = [f"node_modules/{p}" for p in (*DRIVER_PACKAGES, *packages) if package_dir(p) is None]
    chrome = os.environ.get("PARITY_CHROME")
    if not need_browser:
        pass
    elif chrome:
        if not (os.path.isfile(chrome) and os.access(chrome, os.X_OK)):
            out.append(f"a browser (PARITY_CHROME={chrome} is not an executable file)")
    elif package_dir(CHROMIUM_PACKAGE) is None:
        out.append(f"node_modules/{CHROMIUM_PACKAGE} (or PARITY_CHROME naming a Chrome)")
    return out


def browser_timeout() -> float:
    """PARITY_BROWSER_TIMEOUT in seconds (default 120); BackendFailed if it is not a positive number."""
    return seconds_from_env("PARITY_BROWSER_TIMEOUT", DEFAULT_TIMEOUT_S)


def run_driver(who: str, args: list[str], cwd: str) -> None:
    """`node run-browser.mts ARGS` in its own process group; BackendFailed (one line, naming `who`) on trouble."""
    node = find_node()
    if not DRIVER.is_file():
        raise BackendUnavailable(f"{DRIVER}: not found (the browser backends need a source checkout)")
    timeout = browser_timeout()
    env_timeout = os.environ.get("PARITY_BROWSER_TIMEOUT")
    try:
        run_node([node, str(DRIVER), *args], cwd, timeout + GRACE_S, DRIVER, who=who)
    except BackendFailed as exc:
        message = str(exc).removeprefix(f"{who}: ")
        if "timed out" in message and not env_timeout:
            message += " (set PARITY_BROWSER_TIMEOUT to allow more)"
        raise BackendFailed(f"{who}: {message}") from None


class BrowserSession:
    """One `run-browser.mts session` process: requests in on its stdin, one answer line each on its stdout.

    Its own process group (Chrome is the driver's child, in the same group): `close` ends stdin, so the
    driver closes Chrome and exits, and then kills whatever is left of the group. Its stderr goes to
    a file (no pipe a stray grandchild could hold open), read back for the message of a crash.
    """

    def __init__(self, node: str, key: tuple[Any, ...]) -> None:
        self.key = key
        self.tmp = tempfile.mkdtemp(prefix="parity-browser-session-")
        self.stderr = open(Path(self.tmp) / "driver.stderr", "w+b")  # noqa: SIM115 (closed in close())
        try:
            self.proc = subprocess.Popen(
                [node, str(DRIVER), "session"], cwd=self.tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.stderr, start_new_session=os.name != "nt", env=node_env(),
            )
        except OSError as exc:
            self._cleanup()
            raise BackendFailed(f"cannot start {node}: {exc}") from None
        self.answers: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.next_id = 0

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self.answers.put(line)
        self.answers.put(None)  # the driver is gone

    def request(self, argv: list[str], timeout: float) -> str | None:
        """Run one request; None when it succeeded, else the driver's one-line error. BackendFailed if the
        driver crashed or did not answer within `timeout` (then the session is closed)."""
        self.next_id += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"id": self.next_id, "argv": argv}) + "\n").encode())
            self.proc.stdin.flush()
            while True:
                line = self.answers.get(timeout=timeout)
                if line is None:
                    stderr = last_line(self._stderr_text())
                    self.close()
                    killed = signal_name(self.proc.returncode)
                    if killed is not None:
                        raise Killed(stderr, f"{DRIVER.name} (Node)", killed)
                    raise BackendFailed(f"{DRIVER.name} session ended unexpectedly "
                                        f"(exit code {self.proc.returncode}): {stderr}")
                answer = json.loads(line)
                if isinstance(answer, dict) and answer.get("id") == self.next_id:
                    break
        except queue.Empty:
            self.close()
            raise BackendFailed(f"{DRIVER.name} timed out after {timeout:g} s") from None
        except (OSError, ValueError) as exc:  # a broken pipe, an answer that is not JSON
            self.close()
            killed = signal_name(self.proc.returncode)
            if killed is not None:
                raise Killed(str(exc), f"{DRIVER.name} (Node)", killed) from None
            raise BackendFailed(f"{DRIVER.name} session broke: {exc}") from None
        except BaseException:  # Ctrl-C: never leave the driver (and its Chrome) running
            self.close()
            raise
        return None if answer.get("ok") is True else str(answer.get("error", "failed"))

    def _stderr_text(self) -> str:
        try:
            return tail_text(self.stderr)
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """End the session: stdin closed (the driver closes Chrome), then its process group killed."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=CLOSE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_group(self.proc)  # whatever is left (a Chrome that would not quit)
        self._cleanup()

    def _cleanup(self) -> None:
        self.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


CLOSE_S = 10.0  # for the driver to close Chrome and exit after its stdin ends, before its group is killed
_session: BrowserSession | None = None
_session_lock = threading.Lock()


def close_session() -> None:
    """Close this process's browser session, if one runs (registered with _backends/sessions.py)."""
    global _session
    with _session_lock:
        session, _session = _session, None
    if session is not None:
        session.close()


def driver_environment() -> tuple[tuple[str, str], ...]:
    """What the driver reads from its environment when it starts: parity's settings (PARITY_CHROME,
    PARITY_TS_DIR, PARITY_BROWSER_TIMEOUT, PARITY_BROWSER_TAG, ...), Node's, and where temporary files
    and home are. A session started under other values is replaced (other variables, such as those
    a backend sets for its own library, do not matter to it)."""
    names = ("TMPDIR", "TMP", "TEMP", "HOME")
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("PARITY_", "NODE_")) or k in names))


# How chrome.mts says a signal ended the browser: "the browser (PATH) was killed by SIGSEGV ..."
_BROWSER_KILLED = re.compile(r"\bthe browser \(.*\) was killed by (SIG[A-Z0-9]+)")


def run_in_session(who: str, argv: list[str]) -> None:
    """One browser run through this process's session (started, or restarted, as needed). A run whose browser or
    driver a signal killed is run once more (`restarted_once`: noted in the report; a second kill is exit 2)."""
    restarted_once(who, lambda: _run_in_session_once(who, argv))


def _run_in_session_once(who: str, argv: list[str]) -> None:
    global _session
    node = find_node()
    if not DRIVER.is_file():
        raise BackendUnavailable(f"{DRIVER}: not found (the browser backends need a source checkout)")
    timeout = browser_timeout()
    key = (node, str(DRIVER), driver_environment())
    with _session_lock:
        if _session is not None and (_session.key != key or _session.proc.poll() is not None):
            _session.close()
            _session = None
        if _session is None:
            try:
                _session = BrowserSession(node, key)
            except BackendFailed as exc:
                raise BackendFailed(f"{who}: {exc}") from None
            sessions.register(close_session)
        session = _session
        try:
            error = session.request(argv, timeout + GRACE_S)
        except Killed:
            _session = None
            raise
        except BackendFailed as exc:
            _session = None
            message = str(exc)
            if "timed out" in message and not os.environ.get("PARITY_BROWSER_TIMEOUT"):
                message += " (set PARITY_BROWSER_TIMEOUT to allow more)"
            raise BackendFailed(f"{who}: {message}") from None
    if error is not None:
        killed = _BROWSER_KILLED.search(error)
        if killed is not None:  # the driver closed that browser: the next request starts another
            raise Killed(error, "the browser", killed.group(1))
        if "timed out" in error and not os.environ.get("PARITY_BROWSER_TIMEOUT"):
            error += " (set PARITY_BROWSER_TIMEOUT to allow more)"
        raise BackendFailed(f"{who}: {DRIVER.name} failed: {error}")


def run_to_file(
    who: str, mode: str, fixture_root: Path, extra: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Run the driver in `mode` on a fixture, through the run's session; the tensors it wrote, its metadata."""
    from safetensors import safe_open

    from parity_harness._fixture.fixture import read_safetensors

    with tempfile.TemporaryDirectory(prefix="parity-browser-") as tmp:
        out = Path(tmp) / "taps.safetensors"
        run_in_session(who, [mode, str(fixture_root.resolve()), str(out), *extra])
        if not out.is_file():
            raise BackendFailed(f"{who}: {DRIVER.name} exited 0 but wrote no output")
        try:
            tensors = read_safetensors(out)
            with safe_open(str(out), "np") as handle:
                metadata = dict(handle.metadata() or {})
        except (FixtureError, OSError, ValueError) as exc:
            raise BackendFailed(f"{who}: unreadable output: {exc}") from None
    return tensors, metadata


_said: set[str] = set()


def say_once(message: str) -> None:
    """Print a note on stderr the first time it comes up in this process."""
    if message not in _said:
        _said.add(message)
        print(f"parity: {message}", file=unsilenced_stderr(), flush=True)  # seen even beside a silenced backend


def run_onnx_graph(who: str, fixture: Fixture, graph: OnnxGraph, optimization: str) -> BackendOutput:
    """Every case through one of the fixture's graphs on onnxruntime-web: {case: {output: float32}}."""
    path = onnx_file(fixture, graph)  # FixtureError (exit 2) when the manifest lists no such graph
    names = expected_outputs(fixture.tap_names, graph)
    tensors, _ = run_to_file(who, "onnxruntime-web", fixture.root, [graph, optimization])
    return graph_outputs(who, fixture, path.name, names, tensors)


def graph_outputs(who: str, fixture: Fixture, graph_name: str, names: list[str],
                  tensors: dict[str, np.ndarray]) -> BackendOutput:
    """The page's tensors (`CASE/OUTPUT`) as {case: {output: float32}}; BackendFailed naming a missing one."""
    out: BackendOutput = {}
    for case in fixture.cases:
        out[case.name] = {}
        for name in names:
            value = tensors.get(f"{case.name}/{name}")
            if value is None:
                raise BackendFailed(f"{who}: {graph_name} gave no output {name!r} for case {case.name!r}")
            out[case.name][name] = np.asarray(value, dtype=np.float32)
    return out


BROWSER_LIMIT = 10_000_000  # parameters: a browser tab holds the model, its taps and the goldens in memory


def declines_big(fixture: Fixture) -> str | None:
    """The browser backends' `declines`: a GPT-2-sized model does not fit the page's in-memory design."""
    from parity_harness._fixture.fixture import too_big

    return too_big(fixture, BROWSER_LIMIT, "the browser page keeps the weights, every tap and both golden files "
                   "in one tab's memory (a GPT-2-small fixture is ~2 GB of files)")
