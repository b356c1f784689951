"""`llama-cpp`: the fixture's model as GGUF in llama.cpp (llama-cpp-python), every tap read from its graph.

parity writes the model as a GGUF file (gguf_file.py: architecture `llama` or `gpt2`), loads it with
llama-cpp-python's C API on the CPU (one thread, no GPU offload, flash attention off so the attention
probabilities are a node, the KV cache in F32), feeds the case's token ids directly (no tokenizer), and reads
the taps through llama.cpp's evaluation callback (graph.py maps its node names to parity's). A tap llama.cpp
never materializes (the norms' scale, the scaled scores, probs, the lens) is "not supported".

Precisions: "fp32", the fixture's float32 weights; and the stored weight formats "f16", "q8_0", "q4_0",
"q4_k" (parity_harness/_fixture/stored_weights.py): the weights as that GGUF type stores them, which parity
quantizes itself and judges against the goldens of exactly those weights (docs/tolerances.md, "Stored weights").

Incremental decoding runs through llama.cpp's own KV cache: the prompt in one batch, then one token per
decode, the cache read from the graph's `cache_k_l{i}` / `cache_v_l{i}` writes. Token ids and lengths are
checked before llama.cpp sees them (its own checks are asserts that kill the process).

llama.cpp's fixed choices show up as they are: its GELU is the tanh approximation read from an fp16 table, so
the lesson's exact-GELU toy diverges at `blocks.0.mlp.hook_post` (docs/backends.md, "llama-cpp"). So it runs
only when named (`by_default = False`).
"""

from __future__ import annotations

import contextlib
import ctypes
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, Precision
from parity_harness._backends.ggml.graph import Collector, mapped_taps, taps_from_nodes, wants
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest, requests_for, step_key
from parity_harness._fixture.fixture import Fixture

THREADS = 1  # one thread: the same summation order on every run


def _check_tokens(fixture: Fixture, name: str, tokens: list[int]) -> None:
    """What llama.cpp would assert on, as one line naming the case: a length beyond the context, a bad id."""
    config = fixture.model.config
    if not 1 <= len(tokens) <= config.n_ctx:
        raise FixtureError(f"case {name!r}: {len(tokens)} tokens, expected 1 to {config.n_ctx}")
    bad = [t for t in tokens if not 0 <= t < config.vocab_size]
    if bad:
        raise FixtureError(f"case {name!r}: token id {bad[0]} out of range [0, {config.vocab_size})")


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """llama.cpp's log lines kept off the terminal (its log callback set to one that drops them)."""
    import llama_cpp

    drop = llama_cpp.llama_log_callback(lambda _level, _text, _user: None)
    llama_cpp.llama_log_set(drop, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(drop, ctypes.c_void_p(0))  # kept set: llama.cpp may log after we return


class LlamaCppSession:
    """One model loaded from a GGUF file and one context, with the evaluation callback attached."""

    def __init__(self, fixture: Fixture, fmt: str, directory: Path) -> None:
        import llama_cpp

        from parity_harness._backends.ggml.gguf_file import write_gguf

        self.fixture, self.lib = fixture, llama_cpp
        path = write_gguf(fixture, fmt, directory / f"model.{fmt}.gguf")
        self.collector = Collector(wants(fixture.family))
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_mmap = False
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise BackendFailed(f"llama-cpp: llama.cpp could not load the {fmt} GGUF file parity wrote")
        n_ctx = fixture.model.config.n_ctx
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_threads = cparams.n_threads_batch = THREADS
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # the probabilities a node of their own
        cparams.type_k = cparams.type_v = 0  # GGML_TYPE_F32: the cache holds what was computed
        cparams.offload_kqv = False
        cparams.cb_eval = self.collector.callback
        cparams.cb_eval_user_data = None
        self.context = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.context:
            raise BackendFailed("llama-cpp: llama.cpp could not make a context for the model")
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.context)
        self.lib.llama_model_free(self.model)

    def clear(self) -> None:
        """Forget the KV cache: the next decode starts a new sequence at position 0."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.context), True)

    def decode(self, tokens: list[int], start: int) -> list[Any]:
        """Decode `tokens` at positions start.., every position an output; the nodes the callback kept."""
        batch = self.batch
        for k, token in enumerate(tokens):
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, start + k, 1
            batch.seq_id[k][0], batch.logits[k] = 0, 1
        batch.n_tokens = len(tokens)
        status = self.lib.llama_decode(self.context, batch)
        nodes = self.collector.take()
        if status != 0:
            raise BackendFailed(f"llama-cpp: llama_decode returned {status} for {len(tokens)} tokens at {start}")
        return nodes


class LlamaCppBackend(Backend):
    """llama.cpp on the CPU through llama-cpp-python, the taps from its evaluation callback."""

    name = "llama-cpp"
    description = ("llama.cpp (llama-cpp-python) on the CPU, one thread, F32 cache; taps from its evaluation "
                   "callback; also weights stored as f16, q8_0, q4_0, q4_k")
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "f16", "q8_0", "q4_0", "q4_k")
    requires = ("llama_cpp", "gguf")
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")
    install_hint = ("pip install 'parity-harness[llama-cpp]' (builds llama.cpp from source: a C++ compiler and "
                    "cmake, about 5 minutes on 2 cores)")
    streams = True
    # Run when named: ggml's GELU is its fp16 tanh table, so on a GPT-2 fixture with the lesson's exact GELU it
    # fails by design (docs/backends.md); `nox -s parity` names it on the Llama toy.
    by_default: ClassVar[bool] = False

    def declines(self, fixture: Fixture) -> str | None:
        config: Any = fixture.model.config
        if not config.causal:
            return "llama.cpp's graphs are causal; this fixture's model is unmasked"
        if fixture.family == "llama" and config.bias:
            return "the fixture's Llama has biases, which parity's GGUF layout does not write"
        return None

    def build_info(self) -> str | None:
        from parity_harness._backends.ggml.graph import build_line

        return f"{build_line()}; {THREADS} thread, flash attention off, F32 KV cache"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        mapped = set(mapped_taps(fixture.family, fixture.model.config.n_layer))
        return [tap for tap in fixture.tap_names if tap in mapped]

    def run(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case in fixture.cases:
            _check_tokens(fixture, case.name, list(case.tokens))
        fmt = "f32" if precision == "fp32" else precision
        supported = self.supported_taps(fixture)
        with _silenced(), tempfile.TemporaryDirectory(prefix="parity-gguf-") as directory:
            session = LlamaCppSession(fixture, fmt, Path(directory))
            try:
                for case in fixture.cases:
                    tokens = list(case.tokens)
                    session.clear()
                    nodes = session.decode(tokens, 0)
                    taps = taps_from_nodes(nodes, fixture.family, fixture.model.config, len(tokens))
                    missing = [tap for tap in supported if tap not in taps]
                    if missing:
                        raise BackendFailed(f"llama-cpp: case {case.name!r}: llama.cpp's graph had no node for "
                                            f"{missing[0]} (its node names changed?)")
                    yield case.name, {tap: taps[tap] for tap in supported}
            finally:
                session.close()

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True

    def decode(self, fixture: Fixture, precision: Precision,
               requests: list[DecodeRequest] | None = None) -> DecodeOutput:
        """The prompt in one batch, then one token per step, through llama.cpp's KV cache."""
        config = fixture.model.config
        fmt = "f32" if precision == "fp32" else precision
        todo = requests_for(fixture, requests)
        for request in todo:
            fed = list(request.feed) if request.feed is not None else []
            _check_tokens(fixture, request.name, list(request.prompt) + fed[:request.steps])
            if len(request.prompt) + request.steps > config.n_ctx:  # greedy steps past the context, too
                raise FixtureError(f"prompt {request.name!r}: {len(request.prompt)} tokens and {request.steps} "
                                   f"steps, beyond the context of {config.n_ctx}")
        out: DecodeOutput = {}
        with _silenced(), tempfile.TemporaryDirectory(prefix="parity-gguf-") as directory:
            session = LlamaCppSession(fixture, fmt, Path(directory))
            session.collector.wanted = lambda name: name.startswith(("cache_k_l", "cache_v_l", "result_output"))
            try:
                for request in todo:
                    out[request.name] = self._decode_one(session, request, config)
            finally:
                session.close()
        return out

    def _decode_one(self, session: LlamaCppSession, request: DecodeRequest, config: Any) -> dict[str, np.ndarray]:
        session.clear()
        tokens, out = list(request.prompt), {}
        feed = list(request.feed) if request.feed is not None else None
        nodes = session.decode(tokens, 0)
        for step in range(request.steps + 1):
            logits = _last_logits(nodes)
            out[step_key(step, "logits")] = logits
            for i, (keys, values) in enumerate(_caches(nodes, config, len(tokens))):
                out[step_key(step, f"blocks.{i}.attn.cache_k")] = keys
                out[step_key(step, f"blocks.{i}.attn.cache_v")] = values
            if step == request.steps:
                break
            token = feed[step] if feed is not None else int(np.argmax(logits))
            nodes = session.decode([token], len(tokens))
            tokens.append(token)
        return out


def _last_logits(nodes: list[Any]) -> np.ndarray:
    """The last position's logits [V] of one decode."""
    logits = [node for node in nodes if node.name == "result_output"]
    if not logits:
        raise BackendFailed("llama-cpp: llama.cpp's graph had no result_output node")
    data = logits[-1].data
    return np.ascontiguousarray(data.reshape(-1, data.shape[-1])[-1])


def _caches(nodes: list[Any], config: Any, length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each block's cache after a decode, [n_kv_heads, length, d_head], read from the graph's writes to it."""
    d_head = config.d_model // config.n_head
    heads = getattr(config, "n_kv_heads", config.n_head)
    width = heads * d_head
    out = []
    for i in range(config.n_layer):
        written = {n.name.split(" ")[0][:8]: n.data for n in nodes
                   if n.op == "SET_ROWS" and n.name.startswith((f"cache_k_l{i} ", f"cache_v_l{i} "))}
        keys_flat, values_flat = written.get("cache_k_"), written.get("cache_v_")
        if keys_flat is None or values_flat is None:
            raise BackendFailed(f"llama-cpp: no write to block {i}'s KV cache in llama.cpp's graph")
        keys = keys_flat.reshape(-1, width)[:length].reshape(length, heads, d_head)  # [T, H, dh]
        values = values_flat.reshape(width, -1)[:, :length].T.reshape(length, heads, d_head)  # V is stored transposed
        if getattr(config, "rope_pairing", None) == "half":  # llama.cpp's interleaved pairs back to half-split
            keys = keys.reshape(length, heads, d_head // 2, 2).swapaxes(-1, -2).reshape(length, heads, d_head)
        out.append((np.ascontiguousarray(keys.transpose(1, 0, 2)), np.ascontiguousarray(values.transpose(1, 0, 2))))
    return out
