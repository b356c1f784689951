"""The bytes of every ONNX graph parity writes: no exporter metadata, source location or object address.

`graph_bytes(model)` is the one function every writer of a graph calls (the exports of
`_authoring/onnx_export.py`, the fp16 conversion of `fp16.py`, the float32 copy the `onnxruntime-webgpu`
backend hands to the browser). It cleans `model` in place, then serializes it (every caller owns the model
it passes, freshly parsed or converted: no copy, which at GPT-2 size would be another 500 MB), so that a
graph says nothing about the machine or the process that wrote it, and the same export writes the same
bytes from any directory (docs/onnx.md, "What a graph holds"):

- every node, value (input, output, value_info), initializer, graph and function loses its
  `metadata_props` and `doc_string`: torch.onnx's dynamo exporter puts `pkg.torch.onnx.stack_trace`
  (absolute paths of the checkout that ran it), `pkg.torch.onnx.fx_node`, `pkg.torch.onnx.class_hierarchy`,
  `pkg.torch.onnx.name_scopes` and `namespace` (Python object addresses, `<function f at 0x7f...>`) on
  every node, and the exported program's signature on the graph; subgraphs (If, Loop, Scan) are cleaned
  the same way;
- the model's own `metadata_props` keep every entry but the exporter's (`pkg.` keys) and any that holds
  a source location or an object address (`LEAK`); its `doc_string` is dropped only when it holds one;
- what a graph needs to run stays untouched: nodes and their attributes, names, types and shapes,
  initializers, opsets, IR version, the producer's name and version, the graph's and the model's names.
"""

from __future__ import annotations

import re
from typing import Any

# A source location or an object address: a traceback line, an absolute POSIX or Windows path, an
# installed package's directory, a Python repr with an address.
LEAK = re.compile(
    r'File "|(?:^|[\s"\'(=:\[,])/(?:home|tmp|work|Users|usr|opt|var|root|private|mnt|srv)/'
    r"|\b[A-Za-z]:[\\/]|site-packages|dist-packages| at 0x[0-9a-fA-F]+"
)
EXPORTER_PREFIX = "pkg."  # torch.onnx's and onnxscript's metadata keys


def graph_bytes(model: Any) -> bytes:
    """`model` (an onnx.ModelProto the caller owns) cleaned in place as the module docstring says, serialized."""
    clean_model(model)
    data: bytes = model.SerializeToString()
    return data


def clean_model(model: Any) -> None:
    """Clean `model` in place (the module docstring); `graph_bytes` is what writers call."""
    keep = [(p.key, p.value) for p in model.metadata_props
            if not p.key.startswith(EXPORTER_PREFIX) and not LEAK.search(p.key + "\n" + p.value)]
    del model.metadata_props[:]
    for key, value in keep:
        model.metadata_props.add(key=key, value=value)
    if LEAK.search(model.doc_string):
        model.doc_string = ""
    _clean_graph(model.graph)
    for function in model.functions:
        _clear(function)
        for value in function.value_info:
            _clear(value)
        for node in function.node:
            _clean_node(node)


def _clear(proto: Any) -> None:
    """Drop a proto's metadata_props and doc_string."""
    del proto.metadata_props[:]
    proto.doc_string = ""


def _clean_graph(graph: Any) -> None:
    _clear(graph)
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        _clear(value)
    for sparse in graph.sparse_initializer:
        _clear(sparse.values)
        _clear(sparse.indices)
    for node in graph.node:
        _clean_node(node)


def _clean_node(node: Any) -> None:
    _clear(node)
    for attribute in node.attribute:
        attribute.doc_string = ""
        if attribute.HasField("g"):
            _clean_graph(attribute.g)
        for sub in attribute.graphs:
            _clean_graph(sub)


__all__ = ["LEAK", "clean_model", "graph_bytes"]
