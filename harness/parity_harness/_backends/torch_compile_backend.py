"""The `torch-compile` backend: the reference model (parity_reference/model.py) under `torch.compile`, inductor, on CPU.

The function compiled is `parity_reference.model.forward` filling its taps dict, and it returns that dict
(for a Llama fixture `parity_reference.llama_model.forward`, the same way; RoPE's tables are computed inside it):
every tap is an output of one compiled graph (`fullgraph=True`: a graph break is an error, never a
silent fallback to eager PyTorch), with no hooks. Float32 and float64 (the float32 weights upcast,
as the fp64 golden's are). Shapes are dynamic in the sequence length only (`mark_dynamic` on the
tokens): one graph serves every T >= 2 and T = 1 gets its own (0/1 specialization), where static
shapes compile one graph per distinct length (docs/backends.md has the times).

Each graph is compiled ahead of time (`torch.compile(...).aot_compile`: dynamo traces once, inductor
compiles) and saved in `parity-precompiled/` of inductor's cache directory under the SHA-256 of what
it depends on (`key_parts`: the traced code's sources, the model's configuration, the dtype and the
weights' shapes, torch, Python, the CPU and the compiler), so the next run loads it and traces
nothing. A loaded graph runs only inside its guards (`guard_check`, else one line); an entry that
does not load is compiled again and replaced. With inductor's caches disabled
(`TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`) the graphs are compiled in the process, as `torch.compile`
does, and a compile that would exceed the recompile limit fails instead of falling back to eager
(`fail_on_recompile_limit_hit`).

Inductor compiles its CPU kernels with a C++ compiler: the one torch looks for, `$CXX` or `g++`
(`clang++` on macOS), must be on PATH, or the backend is reported missing in one line.
Inductor's cache goes to `$TORCHINDUCTOR_CACHE_DIR` when set, else to the user's cache directory
(`$XDG_CACHE_HOME/parity/torchinductor`, by default `~/.cache/parity/torchinductor`), never into the
working directory. When that directory cannot be created or written (a path under a file, a read-only
disk), the run compiles into a private temporary directory instead, removed when the process exits, and
says so once on stderr (`usable_cache_dir`): the run costs a cold compile, never a crash. Compile warnings
and dynamo's log lines are kept off the terminal; a compile failure is one line naming the compiler's first
error line.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.quiet import silenced, unsilenced_stderr
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError
from parity_harness._core.resources import user_cache_dir
from parity_harness._core.sanitize import one_line

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

# The loggers that print compile chatter (recompiles, autotuning, fallbacks) at WARNING level.
QUIET_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes", "torch._functorch")


def cxx_name() -> str:
    """The C++ compiler torch inductor uses on CPU: `torch._inductor.config.cpp.cxx`'s default, read without torch."""
    if sys.platform == "win32":
        return os.environ.get("CXX", "cl")
    return os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")


def find_cxx() -> str | None:
    """The compiler's path, or None when it is not on PATH (cheap: no import of torch, no process started)."""
    return shutil.which(cxx_name())


def inductor_cache_dir() -> Path:
    """Where inductor's cache goes: $TORCHINDUCTOR_CACHE_DIR, else the user's cache directory, else a temp dir."""
    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return user_cache_dir("torchinductor")


_fallback_lock = threading.Lock()


def _unusable(path: Path) -> str | None:
    """Why inductor could not keep its cache in `path` (created if missing, a file written and removed), or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".parity-probe-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def usable_cache_dir() -> Path:
    """Inductor's cache directory for this process, set in $TORCHINDUCTOR_CACHE_DIR: `inductor_cache_dir()` when it
    can be created and written, else a private temporary directory (removed at exit), said once on stderr."""
    with _fallback_lock:
        wanted = inductor_cache_dir()
        reason = _unusable(wanted)
        if reason is not None:
            try:
                private = Path(tempfile.mkdtemp(prefix="parity-torchinductor-"))
            except OSError as exc:
                raise BackendFailed(one_line(f"backend 'torch-compile': the cache directory {wanted} is not usable "
                                             f"({reason}), nor is the temporary directory ({exc})")) from None
            atexit.register(shutil.rmtree, private, ignore_errors=True)
            print(one_line(f"parity: torch-compile: the cache directory {wanted} is not usable ({reason}); "
                           f"compiling into a private temporary directory for this run (nothing is kept for the "
                           f"next run; set TORCHINDUCTOR_CACHE_DIR to a writable directory to keep the graphs)", 1000),
                  file=unsilenced_stderr(), flush=True)
            wanted = private
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(wanted)
        return wanted


def compile_error_line(exc: BaseException) -> str:
    """The line that says why a compile failed: the compiler's first `error:` line, else the message's first."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln.lower():
            return f"{type(exc).__name__}: {ln}"
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class TorchCompileBackend(Backend):
    name: ClassVar[str] = "torch-compile"
    description: ClassVar[str] = "the PyTorch reference under torch.compile (inductor, CPU, every tap a graph output)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    install_hint: ClassVar[str] = "pip install 'parity-harness[torch]', and a C++ compiler (g++, or set CXX)"

    streams: ClassVar[bool] = True  # one case at a time: memory bounded by one case
    # It may run beside another backend: the process-wide state it changes is inductor's and dynamo's own
    # configuration (patched while it runs), which no other backend computes with, and TORCHINDUCTOR_CACHE_DIR,
    # set in import_requirements (torch sets it again, to the same value, on every cache lookup): with
    # --jobs 2 the lanes call it before it runs, under the import lock, and run_cases' own call changes nothing.
    concurrent: ClassVar[bool] = True
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")  # parity_reference/model.py or llama_model.py

    def import_requirements(self) -> None:
        """Inductor's cache directory chosen (`usable_cache_dir`: a private one when the configured one is not
        usable), then torch, inductor's configuration and dynamo imported."""
        usable_cache_dir()
        import torch._dynamo
        import torch._inductor.config  # noqa: F401

    def missing_dependencies(self) -> list[str]:
        missing = super().missing_dependencies()
        if find_cxx() is None:
            missing.append(f"a C++ compiler ({cxx_name()!r} on PATH, which torch inductor compiles CPU kernels with)")
        return missing

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        if find_cxx() is None:
            raise BackendUnavailable(f"backend {self.name!r} needs a C++ compiler ({cxx_name()!r} on PATH); "
                                     f"install with: {self.install_hint}")
        config: Any = fixture.model.config  # the family's config (GPTConfig, LlamaConfig)
        for case in fixture.cases:  # bad input is one line before anything is compiled
            if not 1 <= len(case.tokens) <= config.n_ctx:
                raise FixtureError(f"case {case.name!r}: {len(case.tokens)} tokens, expected 1 to {config.n_ctx}")
            bad = [t for t in case.tokens if not 0 <= t < config.vocab_size]
            if bad:
                raise FixtureError(f"case {case.name!r}: token id {bad[0]} out of range [0, {config.vocab_size})")
        self.import_requirements()  # one lane: here; --jobs 2 made it under the import lock, and this is a no-op
        import torch

        from parity_reference.run import torch_params

        model = reference_module(fixture.family)
        weights = fixture.weights()
        fixture.release_weights()
        params = torch_params(weights, precision, consume=True)  # one thread: inductor's kernels use one too
        lens_rows = fixture.lens_rows()

        def taps_of(params: dict[str, torch.Tensor], tokens: torch.Tensor) -> dict[str, torch.Tensor]:
            taps: dict[str, torch.Tensor] = {}
            model.forward(params, config, tokens, taps, lens_rows)
            return taps  # every tap an output of the graph

        if torch._inductor.config.force_disable_caches:  # no cache to load from or save to: compile in process
            graph_of = self._jit_graphs(taps_of, len({len(c.tokens) for c in fixture.cases}))
        else:
            parts = key_parts(config, lens_rows, precision, params, fixture.family)
            graph_of = self._precompiled_graphs(taps_of, parts)
        for case in fixture.cases:
            tokens = torch.tensor(list(case.tokens), dtype=torch.int64)  # (T,)
            with ExitStack() as stack:
                stack.enter_context(silenced(QUIET_LOGGERS))
                stack.enter_context(torch._inductor.config.patch(compile_threads=1))  # no worker pool
                stack.enter_context(torch.no_grad())
                try:
                    taps = graph_of(params, tokens)(params, tokens)
                except BackendFailed:
                    raise
                except Exception as exc:  # the first line of a compile error is "C++ compile error": find the cause
                    raise BackendFailed(f"backend {self.name!r}: torch.compile failed on case {case.name!r}: "
                                        f"{compile_error_line(exc)}") from None
            yield case.name, {tap: np.ascontiguousarray(t.numpy()) for tap, t in taps.items()}

    def _precompiled_graphs(self, taps_of: Callable[..., Any], parts: dict[str, Any]) -> GraphOf:
        """Two graphs, T = 1 and T >= 2, each loaded from the cache of precompiled graphs or compiled and saved."""
        import torch

        graphs: dict[bool, tuple[Any, bool]] = {}  # T = 1 or not -> (graph, loaded from the cache)

        def graph_of(params: dict[str, Any], tokens: Any) -> Callable[..., Any]:
            single = int(tokens.shape[0]) == 1
            entry = graphs.get(single)
            if entry is None:
                kind = {"graph": graph_kind(single)}
                entry = graphs[single] = _load_or_compile(taps_of, params, tokens, parts | kind)
            graph, loaded = entry
            if not graph.guard_check(params, tokens):  # never run a graph outside its guards: one line
                raise BackendFailed(f"backend {self.name!r}: the graph compiled for {graph_kind(single)} does not "
                                    f"serve T = {int(tokens.shape[0])} (its guards fail)")
            if not loaded:
                compiled: Callable[..., Any] = graph
                return compiled

            def run(*args: Any) -> Any:  # its kernels load on the first call: the ISAs as when it was compiled
                with torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
                    return graph(*args)

            return run

        return graph_of

    def _jit_graphs(self, taps_of: Callable[..., Any], lengths: int) -> GraphOf:
        """Without inductor's caches: one `torch.compile` in this process, dynamic in T, no silent fallback."""
        import torch

        torch._dynamo.reset()  # a fresh cache per run: the recompile limit counts this run's graphs only
        compiled = torch.compile(taps_of, backend="inductor", fullgraph=True)

        def graph_of(params: dict[str, Any], tokens: Any) -> Callable[..., Any]:
            torch._dynamo.mark_dynamic(tokens, 0)  # dynamic in T only; the weights' shapes stay static

            def run(params: dict[str, Any], tokens: Any) -> Any:
                with torch._dynamo.config.patch(recompile_limit=lengths + 2, fail_on_recompile_limit_hit=True):
                    return compiled(params, tokens)

            return run

        return graph_of


GraphOf = Callable[[dict[str, Any], Any], Callable[..., Any]]  # (params, tokens) -> the graph that runs them


def graph_kind(single: bool) -> str:
    """The two graphs of a precision: dynamo specializes T = 1, and one graph dynamic in T serves every T >= 2."""
    return "T=1" if single else "T>=2"


def precompiled_dir() -> Path:
    """Where precompiled graphs go: `parity-precompiled` in inductor's cache directory (`inductor_cache_dir`)."""
    return inductor_cache_dir() / "parity-precompiled"


def source_sha256(module: ModuleType) -> str:
    """The SHA-256 of a module's source file: a graph traced from changed code is never loaded."""
    return hashlib.sha256(Path(inspect.getfile(module)).read_bytes()).hexdigest()


def reference_module(family: str) -> ModuleType:
    """The reference module whose `forward` is compiled: parity_reference.model (GPT-2) or .llama_model (Llama)."""
    if family == "llama":
        from parity_reference import llama_model

        return llama_model
    from parity_reference import model

    return model


def key_parts(config: Any, lens_rows: int | None, precision: Precision, params: dict[str, Any],
              family: str = "gpt2") -> dict[str, Any]:
    """Everything a compiled graph depends on, but its kind (T = 1 or T >= 2): the code traced, the model's
    family and configuration, the dtype and every weight's shape, and the software and CPU it was compiled for."""
    import platform

    import torch

    model = reference_module(family)
    return {
        "format": 1,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cxx": find_cxx(),
        "model_source": source_sha256(model),
        "backend_source": source_sha256(sys.modules[__name__]),
        "config": dataclasses.asdict(config),
        **({"family": family} if family != "gpt2" else {}),  # absent for GPT-2: its cached graphs keep their keys
        "lens_rows": lens_rows,
        "precision": precision,
        "params": {name: [list(t.shape), str(t.dtype)] for name, t in sorted(params.items())},
    }


def graph_key(parts: dict[str, Any]) -> str:
    """The cache entry's name: the SHA-256 of `parts` as canonical JSON (content, never a path)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _load_or_compile(taps_of: Callable[..., Any], params: dict[str, Any], tokens: Any,
                     parts: dict[str, Any]) -> tuple[Any, bool]:
    """(the graph of `parts`, whether it was loaded): from the cache when it is there and its guards accept
    `tokens`, else compiled now (`aot_compile`: dynamo traces once, inductor compiles) and saved for the next
    run; a broken or stale entry is compiled again and replaced, an unwritable cache only costs the next run
    its compile.

    Loading, and on a loaded graph's first call (its kernels load then), inductor would probe every vector
    ISA the CPU advertises again: a compile and a child Python per ISA, 1.6 s of a toy run. A loaded entry
    was compiled after those probes passed, for this CPU capability, compiler, torch and Python (its key),
    so the ISAs are taken as they were then (`cpp.vec_isa_ok`); a graph compiled here probes as usual."""
    import torch
    from torch._dynamo.aot_compile import AOTCompiledFunction

    path = precompiled_dir() / f"{graph_key(parts)}.bin"
    try:
        with open(path, "rb") as f, torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
            graph = torch.compiler.load_compiled_function(f)
        if isinstance(graph, AOTCompiledFunction) and graph.guard_check(params, tokens):
            return graph, True
        _debug(f"precompiled graph {path.name} refused by its guards ({_guard_failure(graph, params, tokens)}); "
               "compiling it again")
    except FileNotFoundError:
        pass
    except Exception as exc:  # broken, or unreadable by this torch: compile it again
        _debug(f"precompiled graph {path.name} not loaded ({type(exc).__name__}: {exc}); compiling it again")
    example = tokens.clone()  # (T,)
    if int(example.shape[0]) > 1:
        torch._dynamo.mark_dynamic(example, 0)  # dynamic in T only; the weights' shapes stay static
    compiled = torch.compile(taps_of, backend="inductor", fullgraph=True)
    graph = compiled.aot_compile(((params, example), {}))  # type: ignore[attr-defined]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save_compiled_function(str(path))  # written to a temp file, then renamed
    except Exception as exc:
        _debug(f"precompiled graph {path.name} not saved ({type(exc).__name__}: {exc})")
    return graph, False


def _guard_failure(graph: Any, params: dict[str, Any], tokens: Any) -> str:
    """Why a loaded graph's guards refuse these inputs, in dynamo's words (for `_debug`; private API, so any
    trouble reading it is said instead)."""
    try:
        reason = graph._artifacts.guard_manager.check_verbose(graph.prepare_f_locals(params, tokens))
        return " ".join(str(getattr(reason, "verbose_code_parts", reason)).split())[:500]
    except Exception as exc:
        return f"reason not available: {type(exc).__name__}"


def _debug(message: str) -> None:
    """A cache's trouble costs time, never the verdict: said on stderr only when PARITY_DEBUG=1."""
    if os.environ.get("PARITY_DEBUG") == "1":
        print(f"parity: debug: torch-compile: {message}", file=unsilenced_stderr())  # it runs inside `silenced`


