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

**The backward** (`parity run --grad`, fp32 and fp64, both families) goes through the compiled graph: the function
compiled is (params, probes, tokens) -> the case's summed next-token cross-entropy, and `torch.autograd.grad` of
that sum over the case's T - 1 cells runs AOTAutograd's compiled backward (inductor's kernels) for the parameters
and for every tap on the loss's path, the key bias included. The tap gradients are read without changing the
reference: the compiled function runs the family's `forward` unchanged, under a TorchFunctionMode that dynamo
traces; when `forward` records a tap, the mode takes note of that tensor, and every later torch operation that
reads it reads `tap + probe` instead, the probe a zero input of the tap's shape (x + 0 is x: the forward's values
are the reference's). The gradient with respect to the probe is the sum of the adjoints of every use of the tap:
the tap's own adjoint. Nothing is written in place (a tap is often an output some backward formula keeps, such
as the softmax's pattern or the sqrt's scale, or a view of a split); a tensor recorded under two names (a
block's `hook_resid_post` is the next block's `hook_resid_pre`) gets both probes, and each name its adjoint. So
every gradient of the fixture is supported, `hook_pos_embed`'s included (a probe on the position table, learned
or sinusoidal, whose adjoint is the embedding's). The training step is the same compiled function summed over
the batch, `loss.backward()` through the compiled graphs and `torch.optim.AdamW` (foreach=False, fused=False,
the no_decay group) as parity_reference/training.py specifies.

One loss graph per precision serves every case (dynamic in T: tokens and each probe's T axes), precompiled and
cached as the forward's are (`parity-precompiled/`, the key's `graph` "loss T>=2" and the probed taps; the mode and
the taps dict are this module's `ProbeMode` and `TapRecorder`, so that a saved graph can name them): about 75 s of
wall time per precision on an empty inductor cache (toy, shared 2-core machine), about 15 s once saved.
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision, training_spec
from parity_harness._backends.quiet import silenced, unsilenced_stderr
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError
from parity_harness._core.resources import user_cache_dir
from parity_harness._core.sanitize import one_line

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture
    from parity_reference.training import TrainingSpec

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

    # -- the backward and the training step (parity run --grad) -------------------------------------------------

    def supports_grad(self, fixture: Fixture) -> bool:
        return True

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        import torch

        from parity_reference.training import grad_name

        spec, params, loss_graph = self._loss_setup(fixture, precision)
        out: dict[str, dict[str, np.ndarray]] = {}
        for name in spec.cases:
            tokens = list(fixture.case(name).tokens)
            probes = probe_inputs(fixture, len(tokens), params)
            loss = self._case_loss(loss_graph, params, probes, tokens, name) / (len(tokens) - 1)  # ()
            with _running(loss_graph):  # the compiled backward
                grads = torch.autograd.grad(loss, [*probes.values(), *params.values()])
            result = {"loss": loss.detach().numpy().copy()}
            for key, g in zip([*probes, *params], grads, strict=True):
                result[grad_name(key)] = g.detach().contiguous().numpy().copy()
            out[name] = result
        return out

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        from parity_reference.backward import adamw_steps
        from parity_reference.training import predicted_cells

        spec, params, loss_graph = self._loss_setup(fixture, precision)
        batch = [(name, list(fixture.case(name).tokens)) for name in spec.cases]
        total = sum(predicted_cells(len(tokens)) for _, tokens in batch)

        def loss_of_batch() -> Any:  # the batch's summed cross-entropy, case by case, over every cell
            loss: Any = None
            for name, tokens in batch:
                part = self._case_loss(loss_graph, params, probe_inputs(fixture, len(tokens), params), tokens, name)
                loss = part if loss is None else loss + part
            return loss / total  # ()

        def backward(loss: Any) -> None:
            with _running(loss_graph):  # the compiled backward of every case
                loss.backward()

        return adamw_steps(params, spec, loss_of_batch, backward)

    def _loss_setup(self, fixture: Fixture, precision: Precision) -> tuple[TrainingSpec, dict[str, Any], LossGraph]:
        """The training spec, the fixture's weights as leaf tensors of the precision (requiring gradients), and the
        precision's loss graph (precompiled, or compiled and saved; one per process and key)."""
        if find_cxx() is None:
            raise BackendUnavailable(f"backend {self.name!r} needs a C++ compiler ({cxx_name()!r} on PATH); "
                                     f"install with: {self.install_hint}")
        spec = training_spec(fixture, self.name, precision)
        config: Any = fixture.model.config
        for name in spec.cases:
            if len(fixture.case(name).tokens) > config.n_ctx:
                raise FixtureError(f"case {name!r}: {len(fixture.case(name).tokens)} tokens, more than the "
                                   f"context ({config.n_ctx})")
        self.import_requirements()
        import torch

        from parity_reference.run import torch_params

        params = {k: t.requires_grad_(True) for k, t in torch_params(fixture.weights(), precision).items()}
        taps = probed_taps(fixture)
        parts = key_parts(config, None, precision, params, fixture.family) | {"graph": "loss T>=2", "probes": taps}
        cached: dict[str, LossGraph] = self.__dict__.setdefault("_loss_graphs", {})
        key = graph_key(parts)
        if key not in cached:
            loss_of = probed_loss(reference_module(fixture.family), config)
            first = list(fixture.case(spec.cases[0]).tokens)

            def example(dynamic: bool) -> tuple[Any, ...]:  # marked dynamic in T to compile; as a case runs to load
                tokens = torch.tensor(first, dtype=torch.int64)  # (T,)
                return params, probe_inputs(fixture, len(first), params, dynamic), _dynamic_tokens(tokens, dynamic)

            with ExitStack() as stack:
                stack.enter_context(silenced(QUIET_LOGGERS))
                stack.enter_context(torch._inductor.config.patch(compile_threads=1))
                try:
                    if torch._inductor.config.force_disable_caches:  # compiled in the process, no cache
                        graph: Any = torch.compile(loss_of, backend="inductor", fullgraph=True)
                        graph(*example(True))  # compiled now, dynamic in T (its example's marks)
                        loaded = False
                    else:
                        graph, loaded = _load_or_compile_loss(loss_of, example, parts)
                except Exception as exc:
                    raise BackendFailed(f"backend {self.name!r}: torch.compile failed on the loss of case "
                                        f"{spec.cases[0]!r}: {compile_error_line(exc)}") from None
            if len(cached) >= 2:  # both precisions of one fixture's shapes at most
                cached.clear()
            cached[key] = (graph, loaded)
        return spec, params, cached[key]

    def _case_loss(self, loss_graph: LossGraph, params: dict[str, Any], probes: dict[str, Any], tokens: list[int],
                   case: str) -> Any:
        """One case's summed cross-entropy through the compiled loss graph (its backward compiled with it)."""
        import torch

        graph, loaded = loss_graph
        ids = torch.tensor(tokens, dtype=torch.int64)  # (T,)
        if loaded and not graph.guard_check(params, probes, ids):
            raise BackendFailed(f"backend {self.name!r}: the loss graph does not serve case {case!r} "
                                f"(T = {len(tokens)}; its guards fail)")
        with _running(loss_graph):
            try:
                return graph(params, probes, ids)  # ()
            except BackendFailed:
                raise
            except Exception as exc:
                raise BackendFailed(f"backend {self.name!r}: the compiled loss failed on case {case!r}: "
                                    f"{compile_error_line(exc)}") from None

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
LossGraph = tuple[Any, bool]  # the compiled (params, probes, tokens) -> summed cross-entropy, and whether it loaded


@contextmanager
def _running(loss_graph: LossGraph) -> Iterator[None]:
    """Around a loss graph's forward and backward calls: compile chatter silenced, no compile workers, and for a
    loaded graph (whose kernels load on first call) the ISAs taken as they were when it was compiled."""
    import torch

    loaded = loss_graph[1]
    with silenced(QUIET_LOGGERS), torch._inductor.config.patch(
            {"compile_threads": 1, "cpp.vec_isa_ok": True} if loaded else {"compile_threads": 1}):
        yield


def probed_taps(fixture: Fixture) -> list[str]:
    """The taps whose gradient the backward reads through a probe: every tap on the loss's path."""
    from parity_reference.training import has_backward

    return [t for t in fixture.tap_names if has_backward(t)]


def _time_axes(fixture: Fixture, tap: str) -> list[int]:
    """The axes of a tap whose size is the sequence length (they change with T)."""
    a, b = fixture.model.tap_shape(tap, 2), fixture.model.tap_shape(tap, 3)
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def _dynamic_tokens(tokens: Any, dynamic: bool) -> Any:
    import torch

    if dynamic:
        torch._dynamo.maybe_mark_dynamic(tokens, 0)  # dynamic in T only; the weights' shapes stay static
    return tokens


def probe_inputs(fixture: Fixture, n_tokens: int, params: dict[str, Any], dynamic: bool = False) -> dict[str, Any]:
    """One zero probe per probed tap, in the tap's shape for `n_tokens` and the parameters' dtype, requiring a
    gradient (the tap's adjoint); `dynamic` marks their T axes dynamic (the compile's example only)."""
    import torch

    dtype = next(iter(params.values())).dtype
    probes: dict[str, Any] = {}
    for tap in probed_taps(fixture):
        probe = torch.zeros(fixture.model.tap_shape(tap, n_tokens), dtype=dtype, requires_grad=True)
        if dynamic:
            for axis in _time_axes(fixture, tap):
                torch._dynamo.maybe_mark_dynamic(probe, axis)
        probes[tap] = probe
    return probes


PROBE_CLASSES = ("ProbeMode", "TapRecorder")  # defined on first use (they subclass torch's), found by name


def __getattr__(name: str) -> Any:
    """`ProbeMode` and `TapRecorder` on first use: a saved loss graph names them, and loading it finds them here."""
    if name in PROBE_CLASSES:
        return probe_classes()[PROBE_CLASSES.index(name)]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def probe_classes() -> tuple[type, type]:
    """The probing TorchFunctionMode and the taps dict that hands it each tap, defined once, as this module's
    `ProbeMode` and `TapRecorder` (so that a compiled graph that names them can be saved and loaded)."""
    made = globals().get("_probe_classes")
    if made is not None:
        return cast(tuple[type, type], made)
    import torch
    from torch.overrides import TorchFunctionMode

    class ProbeMode(TorchFunctionMode):
        """Substitutes `tap + probe` for a recorded tap in every torch call that reads it."""

        def __init__(self, probes: dict[str, torch.Tensor]) -> None:
            super().__init__()
            self.probes = probes
            self.seen: list[list[torch.Tensor]] = []  # [tap, tap + its probes]

        def record(self, name: str, value: torch.Tensor) -> None:
            for entry in self.seen:
                if entry[0] is value:  # recorded under a second name: both probes, each its adjoint
                    entry[1] = entry[1] + self.probes[name]
                    return
            self.seen.append([value, value + self.probes[name]])

        def _probed(self, arg: Any) -> Any:
            if isinstance(arg, torch.Tensor):
                for tap, probed in self.seen:
                    if tap is arg:
                        return probed
            elif isinstance(arg, (list, tuple)):
                return type(arg)(self._probed(a) for a in arg)
            return arg

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            args = tuple(self._probed(a) for a in args)
            kwargs = {k: self._probed(v) for k, v in (kwargs or {}).items()}
            return func(*args, **kwargs)

    class TapRecorder(dict):  # type: ignore[type-arg]
        """The taps dict `forward` fills: a probed tap is handed to the mode, nothing is kept."""

        def __init__(self, mode: ProbeMode) -> None:
            super().__init__()
            self.mode = mode

        def __setitem__(self, name: str, value: torch.Tensor) -> None:
            if name in self.mode.probes:
                self.mode.record(name, value)

    for cls in (ProbeMode, TapRecorder):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls
    globals()["_probe_classes"] = made = (ProbeMode, TapRecorder)
    return made


def probed_loss(model: ModuleType, config: Any) -> Callable[..., Any]:
    """(params, probes, tokens) -> the case's summed next-token cross-entropy, the model's `forward` run as it is,
    every later read of a recorded tap reading `tap + probe` (`ProbeMode`, which dynamo traces; nothing in place)."""
    import torch

    probe_mode, recorder = probe_classes()

    def loss_of(params: dict[str, torch.Tensor], probes: dict[str, torch.Tensor],
                tokens: torch.Tensor) -> torch.Tensor:
        mode = probe_mode(probes)
        with mode:
            logits = model.forward(params, config, tokens, recorder(mode), 1)  # (T, V)
            return torch.nn.functional.cross_entropy(logits[:-1], tokens[1:], reduction="sum")  # ()

    return loss_of


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


def _load_or_compile_loss(loss_of: Callable[..., Any], example: Callable[[bool], tuple[Any, ...]],
                          parts: dict[str, Any]) -> tuple[Any, bool]:
    """The loss graph of `parts` as `_load_or_compile` gets a forward graph: loaded from `parity-precompiled/` when
    its guards accept `example(False)` (params, probes, tokens, as a case runs), else compiled from `example(True)`
    (its T axes marked dynamic; forward and backward, AOTAutograd and inductor) and saved."""
    import torch
    from torch._dynamo.aot_compile import AOTCompiledFunction

    path = precompiled_dir() / f"{graph_key(parts)}.bin"
    try:
        with open(path, "rb") as f, torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
            graph = torch.compiler.load_compiled_function(f)
        if isinstance(graph, AOTCompiledFunction) and graph.guard_check(*example(False)):
            return graph, True
        _debug(f"precompiled loss graph {path.name} refused by its guards; compiling it again")
    except FileNotFoundError:
        pass
    except Exception as exc:
        _debug(f"precompiled loss graph {path.name} not loaded ({type(exc).__name__}: {exc}); compiling it again")
    compiled = torch.compile(loss_of, backend="inductor", fullgraph=True)
    graph = compiled.aot_compile((example(True), {}))  # type: ignore[attr-defined]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save_compiled_function(str(path))
    except Exception as exc:
        _debug(f"precompiled loss graph {path.name} not saved ({type(exc).__name__}: {exc})")
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
