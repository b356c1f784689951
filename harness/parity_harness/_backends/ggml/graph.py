"""Reading llama.cpp's graph: the evaluation callback's tensors, and their names mapped to parity's taps.

llama.cpp names the nodes of its graph as its model code builds them (`cb(cur, "attn_norm", il)` gives
"attn_norm-0"); `cb_eval` (llama_context_params) is called for every node, first to ask whether we want it,
then with its data computed. `Collector` keeps the nodes `NODE_TAPS` names, in graph order: a node name can
repeat (llama.cpp names Q before and after RoPE alike; both RMSNorms of a block are "norm-{i}"), so a node is
known by its name, its op and its occurrence in the block. `taps_from_nodes` turns them into parity's taps, in
parity's layout: ggml's shapes are the reverse of NumPy's, the KV positions of the score matrices are cut to
the sequence, and Llama's q/k come back from llama.cpp's interleaved RoPE pairs to Hugging Face's half-split.

The `ggml_tensor` struct is ggml.h's (ggml 0.9, the version llama-cpp-python 0.3.36 vendors); its size is
checked against `ggml_tensor_overhead` before any is read.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from parity_harness._core.errors import BackendFailed

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
GGML_F32, GGML_F16 = 0, 1


class GgmlTensor(ctypes.Structure):
    """ggml.h's `struct ggml_tensor`, read-only."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
                ("nb", ctypes.c_size_t * GGML_MAX_DIMS), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * GGML_MAX_NAME), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


@functools.cache
def ggml_base() -> ctypes.CDLL:
    """llama-cpp-python's libggml-base, with the few functions read here typed; BackendFailed when its tensor
    struct is not the one this module reads."""
    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_op_desc.argtypes = [ctypes.c_void_p]  # the op's name, a unary or GLU op's own (GELU, SWIGLU)
    lib.ggml_op_desc.restype = ctypes.c_char_p
    lib.ggml_version.restype = lib.ggml_commit.restype = ctypes.c_char_p
    lib.ggml_version.argtypes = lib.ggml_commit.argtypes = []
    lib.ggml_tensor_overhead.restype = ctypes.c_size_t
    lib.ggml_tensor_overhead.argtypes = []
    # ggml_tensor_overhead() is GGML_OBJECT_SIZE + GGML_TENSOR_SIZE; the object header is 32 bytes on 64-bit.
    if lib.ggml_tensor_overhead() - ctypes.sizeof(GgmlTensor) != 32:
        raise BackendFailed("llama-cpp: this ggml's tensor struct is not the one parity reads "
                            f"(ggml_tensor_overhead {lib.ggml_tensor_overhead()}); pin llama-cpp-python==0.3.36")
    return lib


def build_line() -> str:
    """llama-cpp-python's version, ggml's version and commit, and the CPU features its build uses (ggml's own
    system info: "AVX2 AVX512 F16C FMA ...", the features set to 1)."""
    import llama_cpp

    lib = ggml_base()
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    features = [part.split("=")[0].strip() for part in info.split("|") if part.strip().endswith("= 1")]
    features = [f.split(":")[-1].strip() for f in features]
    return (f"llama-cpp-python {llama_cpp.__version__}, ggml {lib.ggml_version().decode()} "
            f"({lib.ggml_commit().decode()}), CPU: {' '.join(features) or 'none named'}")


@dataclasses.dataclass(frozen=True)
class Node:
    """One node the callback kept: its name, its op (ggml's name, "MUL_MAT"), and its data as NumPy."""

    name: str
    op: str
    data: np.ndarray
    pointer: int = 0  # the node's address in the graph: how another node names it as a source
    sources: tuple[int, ...] = ()  # its source nodes' addresses (src[0], src[1], ...)


def read_node(pointer: int) -> Node:
    """A computed node's name, op and data (float32; an F16 node widened), copied out of ggml's buffer with its
    strides (a permuted view is read as it is laid out)."""
    lib = ggml_base()
    tensor = GgmlTensor.from_address(pointer)
    name, op = tensor.name.decode("utf-8", "replace"), (lib.ggml_op_desc(pointer) or b"?").decode()
    dtype = {GGML_F32: np.float32, GGML_F16: np.float16}.get(tensor.type)
    if dtype is None:
        raise BackendFailed(f"llama-cpp: node {name!r} ({op}) has ggml type {tensor.type}, not F32 or F16")
    size = lib.ggml_nbytes(pointer)
    raw = (ctypes.c_char * size)()
    lib.ggml_backend_tensor_get(pointer, raw, 0, size)
    shape = tuple(int(n) for n in reversed(tensor.ne))  # NumPy order: ggml's ne[0] is the fastest axis
    strides = tuple(int(s) for s in reversed(tensor.nb))
    view = np.lib.stride_tricks.as_strided(np.frombuffer(raw, dtype=dtype), shape=shape, strides=strides)
    sources = tuple(int(p) for p in tensor.src if p)
    return Node(name, op, np.array(view, dtype=np.float32), pointer, sources)  # a copy: the buffer is ggml's, reused


class Collector:
    """The evaluation callback: keeps every node whose name `wanted` accepts, in the order computed."""

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        import llama_cpp

        self.wanted = wanted
        self.nodes: list[Node] = []
        self.error: BaseException | None = None

        def callback(pointer: int, ask: bool, _user: Any) -> bool:
            try:
                name = GgmlTensor.from_address(pointer).name.decode("utf-8", "replace")
                if not self.wanted(name):
                    return not ask  # not asked for: nothing to read; a computed node: go on
                if ask:
                    return True
                self.nodes.append(read_node(pointer))
            except BaseException as exc:  # never across the C boundary: kept, raised after decode returns
                self.error = exc
            return True

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(callback)

    def take(self) -> list[Node]:
        """The nodes kept since the last take; the error the callback met, raised."""
        if self.error is not None:
            error, self.error = self.error, None
            raise BackendFailed(f"llama-cpp: reading a node in the evaluation callback failed: {error}")
        nodes, self.nodes = self.nodes, []
        return nodes


# -- llama.cpp's node names -> parity's taps ---------------------------------------------------------------

# Per family: (node name, op, occurrence in the block) -> taps. `{i}` is the block; a node named without it
# ("norm", "result_output") is after the last block. The scaled scores, the norms' scale, probs and the lens
# are never a node of llama.cpp's graph (its scores are unscaled, "kq", scaled inside the softmax).
NODE_TAPS: dict[str, dict[tuple[str, str, int], tuple[str, ...]]] = {
    "llama": {
        ("embd", "GET_ROWS", 0): ("hook_embed", "blocks.0.hook_resid_pre"),
        ("norm-{i}", "RMS_NORM", 0): ("blocks.{i}.ln1.hook_normalized",),
        ("Qcur-{i}", "MUL_MAT", 0): ("blocks.{i}.attn.hook_q",),
        ("Kcur-{i}", "MUL_MAT", 0): ("blocks.{i}.attn.hook_k",),
        ("Vcur-{i}", "MUL_MAT", 0): ("blocks.{i}.attn.hook_v",),
        ("Qcur-{i}", "ROPE", 0): ("blocks.{i}.attn.hook_rot_q",),
        ("Kcur-{i}", "ROPE", 0): ("blocks.{i}.attn.hook_rot_k",),
        ("kq_soft_max-{i}", "SOFT_MAX", 0): ("blocks.{i}.attn.hook_pattern",),
        ("kqv_out-{i}", "CONT", 0): ("blocks.{i}.attn.hook_z",),
        ("attn_out-{i}", "MUL_MAT", 0): ("blocks.{i}.hook_attn_out",),
        ("ffn_inp-{i}", "ADD", 0): ("blocks.{i}.hook_resid_mid",),
        ("norm-{i}", "RMS_NORM", 1): ("blocks.{i}.ln2.hook_normalized",),
        ("ffn_gate-{i}", "MUL_MAT", 0): ("blocks.{i}.mlp.hook_pre",),
        ("ffn_up-{i}", "MUL_MAT", 0): ("blocks.{i}.mlp.hook_pre_linear",),
        ("ffn_swiglu-{i}", "SWIGLU", 0): ("blocks.{i}.mlp.hook_post",),
        ("ffn_out-{i}", "MUL_MAT", 0): ("blocks.{i}.hook_mlp_out",),
        ("l_out-{i}", "ADD", 0): ("blocks.{i}.hook_resid_post", "blocks.{i+1}.hook_resid_pre"),
        ("norm", "RMS_NORM", 0): ("ln_final.hook_normalized",),
        ("result_output", "MUL_MAT", 0): ("logits",),
    },
    "gpt2": {
        ("embd", "GET_ROWS", 0): ("hook_embed",),
        ("pos_embd", "GET_ROWS", 0): ("hook_pos_embed",),
        ("inpL", "ADD", 0): ("blocks.0.hook_resid_pre",),
        ("norm-{i}", "NORM", 0): ("blocks.{i}.ln1.hook_normalized",),
        ("Qcur-{i}", "VIEW", 0): ("blocks.{i}.attn.hook_q",),
        ("Kcur-{i}", "VIEW", 0): ("blocks.{i}.attn.hook_k",),
        ("Vcur-{i}", "VIEW", 0): ("blocks.{i}.attn.hook_v",),
        ("kq_soft_max-{i}", "SOFT_MAX", 0): ("blocks.{i}.attn.hook_pattern",),
        ("kqv_out-{i}", "CONT", 0): ("blocks.{i}.attn.hook_z",),
        ("ffn_inp-{i}", "ADD", 0): ("blocks.{i}.hook_resid_mid",),
        ("norm-{i}", "NORM", 1): ("blocks.{i}.ln2.hook_normalized",),
        ("ffn_up_b-{i}", "ADD", 0): ("blocks.{i}.mlp.hook_pre",),
        ("ffn_gelu-{i}", "GELU", 0): ("blocks.{i}.mlp.hook_post",),
        ("ffn_out-{i}", "ADD", 0): ("blocks.{i}.hook_mlp_out",),
        ("l_out-{i}", "ADD", 0): ("blocks.{i}.hook_resid_post", "blocks.{i+1}.hook_resid_pre"),
        ("norm", "NORM", 0): ("ln_final.hook_normalized",),
        ("result_output", "MUL_MAT", 0): ("logits",),
    },
}


# Taps a node has no name for, read as another's source: (node, op, occurrence) -> (source index, taps).
# GPT-2's attention output (after the output projection's bias) is unnamed ("node_29"): ffn_inp's first source.
SOURCE_TAPS: dict[str, dict[tuple[str, str, int], tuple[int, tuple[str, ...]]]] = {
    "llama": {},
    "gpt2": {("ffn_inp-{i}", "ADD", 0): (0, ("blocks.{i}.hook_attn_out",))},
}
UNNAMED = "node_"  # ggml's name for a node its model code did not name


def node_names(family: str) -> set[str]:
    """The node-name stems the family's map reads ("norm", "Qcur", ...): what the callback asks for."""
    return {name.split("-{i}")[0] for name, _, _ in NODE_TAPS[family]}


def wants(family: str) -> Callable[[str], bool]:
    """The callback's filter: a node whose name, less its "-{block}" suffix, the map reads."""
    stems, unnamed = node_names(family), bool(SOURCE_TAPS[family])

    def wanted(name: str) -> bool:
        stem, _, block = name.rpartition("-")
        return name in stems or (block.isdigit() and stem in stems) or (unnamed and name.startswith(UNNAMED))

    return wanted


def mapped_taps(family: str, n_layer: int) -> list[str]:
    """Every tap the map gives for a model of `n_layer` blocks (what the backend declares)."""
    taps: list[str] = []
    for names in [*NODE_TAPS[family].values(), *(names for _, names in SOURCE_TAPS[family].values())]:
        for i in range(n_layer):
            for template in names:
                tap = template.replace("{i+1}", str(i + 1)).replace("{i}", str(i))
                if tap not in taps and not tap.startswith(f"blocks.{n_layer}."):
                    taps.append(tap)
    return taps


def taps_from_nodes(nodes: list[Node], family: str, config: Any, n_tokens: int) -> dict[str, np.ndarray]:
    """parity's taps from the nodes of one decode of `n_tokens` tokens (every position an output)."""
    seen: dict[tuple[str, str], int] = {}
    out: dict[str, np.ndarray] = {}
    table, sources = NODE_TAPS[family], SOURCE_TAPS[family]
    by_pointer = {node.pointer: node for node in nodes}

    def put(names: tuple[str, ...], data: np.ndarray, layer: int | None) -> None:
        value = _to_tap(data, names[0], config, family, n_tokens)
        for tap in names:
            i = layer if layer is not None else 0
            out[tap.replace("{i+1}", str(i + 1)).replace("{i}", str(i))] = value

    for node in nodes:
        stem, _, block = node.name.rpartition("-")
        template, layer = (f"{stem}-{{i}}", int(block)) if block.isdigit() else (node.name, None)
        occurrence = seen.get((node.name, node.op), 0)
        seen[(node.name, node.op)] = occurrence + 1
        names = table.get((template, node.op, occurrence))
        if names is not None:
            put(names, node.data, layer)
        source = sources.get((template, node.op, occurrence))
        if source is not None and len(node.sources) > source[0] and node.sources[source[0]] in by_pointer:
            put(source[1], by_pointer[node.sources[source[0]]].data, layer)
    return out


def _to_tap(data: np.ndarray, tap: str, config: Any, family: str, n_tokens: int) -> np.ndarray:
    """A node's data (NumPy order: ggml's reversed) in the tap's layout."""
    array = data.reshape(data.shape[-3:]) if data.ndim > 3 else data  # ggml's trailing unit axes dropped
    kind = tap.rsplit(".", 1)[-1]
    if kind == "hook_pattern":  # [H, T, n_kv]: the KV positions beyond the sequence are masked, cut
        return np.ascontiguousarray(array[:, :n_tokens, :n_tokens])
    array = array.reshape(n_tokens, -1)  # [T, features]: every other tap is a row per position
    d_head = config.d_model // config.n_head
    if kind in ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_z"):
        array = array.reshape(n_tokens, -1, d_head)  # [T, heads, d_head]
        interleaved = family == "llama" and config.rope_pairing == "half" and kind in (
            "hook_q", "hook_k", "hook_rot_q", "hook_rot_k")
        if interleaved:  # llama.cpp's (2i, 2i + 1) pairs back to Hugging Face's (i, i + d_head / 2)
            array = array.reshape(n_tokens, -1, d_head // 2, 2).swapaxes(-1, -2).reshape(n_tokens, -1, d_head)
    return np.ascontiguousarray(array)
