"""The llama-cpp backend (parity_harness/_backends/ggml/): the fixture's model as GGUF in llama.cpp, taps from
its evaluation callback, and the stored weight formats judged against the goldens of the weights they store.

- the node map (graph.NODE_TAPS, SOURCE_TAPS) against llama.cpp's actual graph, every node read, on toy and
  toy-llama; the taps it maps are exactly the taps the backend declares;
- toy-llama in fp32 and every stored format (f16, q8_0, q4_0, q4_k: q5_0 there) passes, every block's residual
  stream, attention and MLP outputs and the logits compared, decoding checked in fp32; a generated llama-mini too;
- a planted bug: one q8_0 (or q4_0) block's float16 scale doubled in `blk.3.ffn_down.weight` of the GGUF file
  fails first at blocks.3.hook_mlp_out;
- the GPT-2 toy fails at blocks.0.mlp.hook_post, its cause ggml's GELU table; on gpt2-mini-gelu-new every tap
  before it passes;
- bad input never reaches llama.cpp (its checks are asserts that kill the process): a case longer than n_ctx or a
  token id beyond the vocabulary is one line naming the case, exit 2. The fixture's loader refuses such a
  manifest first (its own one line), so the bad case is put into what the backend is handed (`for_backend`), as
  tests/backends/test_openvino_backend.py does; an unmasked model is declined with one line;
- `parity check-backend llama-cpp` passes.

Where llama-cpp-python or gguf is missing these tests skip, which PARITY_REQUIRE_ALL_BACKENDS=1 (CI) turns into
failures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import Precision
from parity_harness._backends.ggml import gguf_file, graph
from parity_harness._backends.ggml import llama_cpp_backend as module
from parity_harness._backends.ggml.llama_cpp_backend import LlamaCppBackend
from parity_harness._compare.gpt2_causes import GELU_GGML_TABLE
from parity_harness._compare.judge import NOT_SUPPORTED
from parity_harness._compare.report import Report
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._core.status import Verdict
from parity_harness._fixture.decoding import DecodeRequest
from parity_harness._fixture.fixture import Case, Fixture, load_fixture
from parity_harness._fixture.stored_goldens import stored_goldens
from parity_harness._fixture.stored_weights import StoredTensor, dequantized
from tests.helpers import REPO, TOY, edit_manifest

TOY_LLAMA = REPO / "fixtures" / "toy-llama"
STORED_FORMATS = ("f16", "q8_0", "q4_0", "q4_k")
# Taps the acceptance names: every block's residual stream, attention output, MLP output, and the logits.
BLOCK_TAPS = ("hook_resid_post", "hook_attn_out", "hook_mlp_out")
# What llama.cpp's graph never holds as a node: the norms' scale, the scaled scores (its kq is unscaled), the
# probabilities and the logit lens.
NEVER_A_NODE = ("hook_scale", "hook_attn_scores", "probs", "logit_lens")


def llama_cpp() -> LlamaCppBackend:
    """The backend, or a skip (a failure under PARITY_REQUIRE_ALL_BACKENDS=1) when llama-cpp-python is missing."""
    backend = LlamaCppBackend()
    missing = backend.missing_dependencies()
    if missing:
        pytest.skip(f"llama-cpp backend: missing {missing} ({backend.install_hint})")
    return backend


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """llama-mini and gpt2-mini-gelu-new (seed 0, no ONNX graphs): exported once per pytest session, the xdist
    workers taking turns on a lock (read-only: copy one before changing it)."""
    llama_cpp()
    pytest.importorskip("torch")
    from parity_harness._authoring.presets import export_preset

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common parent
    root = shared / "llama-cpp-presets"
    root.mkdir(exist_ok=True)
    with (shared / "llama-cpp-presets.lock").open("a") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        except ImportError:  # not POSIX: no xdist sharing needed for correctness, each name is still made once
            pass
        for name in ("llama-mini", "gpt2-mini-gelu-new"):
            if not (root / f"{name}.done").exists():
                shutil.rmtree(root / name, ignore_errors=True)  # a worker's export that failed half-way
                export_preset(root / name, name, seed=0, progress=lambda _m: None, with_onnx=False)
                (root / f"{name}.done").touch()
    return {name: root / name for name in ("llama-mini", "gpt2-mini-gelu-new")}


def checks(report: Report, backend: str, precision: str) -> list[Any]:
    return [r for r in report.results if r.backend == backend and r.precision == precision and r.step is None]


def assert_block_taps_compared_and_passing(report: Report, fixture: Fixture, precision: str,
                                           backend: str = "llama-cpp") -> None:
    """Every block's resid_post, attn_out and mlp_out, and the logits: compared (not 'not supported') in every
    case, and passing."""
    rows = checks(report, backend, precision)
    wanted = [f"blocks.{i}.{kind}" for i in range(fixture.model.config.n_layer) for kind in BLOCK_TAPS] + ["logits"]
    for tap in wanted:
        at_tap = [r for r in rows if r.tap == tap]
        assert len(at_tap) == len(fixture.cases), (precision, tap, len(at_tap))
        assert all(r.status != NOT_SUPPORTED and r.passed is True for r in at_tap), (precision, tap, at_tap[:1])


# -- the node map against llama.cpp's graph --------------------------------------------------------------------------

def every_node(fixture: Fixture, case: Case) -> list[graph.Node]:
    """One decode of `case` with the callback keeping every node of the graph."""
    with module._silenced(), tempfile.TemporaryDirectory() as directory:
        session = module.LlamaCppSession(fixture, "f32", Path(directory))
        try:
            session.collector.wanted = lambda _name: True
            return session.decode(list(case.tokens), 0)
        finally:
            session.close()


@pytest.mark.parametrize("which", ["toy", "toy-llama"])
def test_the_node_map_is_llama_cpp_graph(which: str) -> None:
    backend = llama_cpp()
    fixture = load_fixture(TOY if which == "toy" else TOY_LLAMA)
    family, n_layer = fixture.family, fixture.model.config.n_layer
    case = max(fixture.cases, key=lambda c: len(c.tokens))
    nodes = every_node(fixture, case)
    assert len(nodes) > 20 * n_layer  # every node, not the map's few
    # each node as (name less its block, op, occurrence of that name and op, block)
    seen: dict[tuple[str, str], int] = {}
    found: dict[tuple[str, str, int, int | None], graph.Node] = {}
    for node in nodes:
        stem, _, block = node.name.rpartition("-")
        template, layer = (f"{stem}-{{i}}", int(block)) if block.isdigit() else (node.name, None)
        occurrence = seen.get((node.name, node.op), 0)
        seen[(node.name, node.op)] = occurrence + 1
        found.setdefault((template, node.op, occurrence, layer), node)
    for name, op, occurrence in graph.NODE_TAPS[family]:
        layers: list[int | None] = list(range(n_layer)) if "{i}" in name else [None]
        for layer in layers:
            assert (name, op, occurrence, layer) in found, (family, name, op, occurrence, layer)
    by_pointer = {node.pointer: node for node in nodes}
    for (name, op, occurrence), (source, _taps) in graph.SOURCE_TAPS[family].items():
        for layer in range(n_layer):
            node = found[(name, op, occurrence, layer)]
            src = by_pointer[node.sources[source]]
            assert src.name.startswith(graph.UNNAMED), (name, layer, src.name)
    if family == "gpt2":  # the unnamed source is the attention output: o-projection plus bias, of kqv_out

        def rows_of(node: graph.Node) -> graph.Node:  # the last block picks the output rows first (all of them here)
            return by_pointer[node.sources[0]] if node.op == "GET_ROWS" else node

        for layer in range(n_layer):
            mid = found[("ffn_inp-{i}", "ADD", 0, layer)]
            attn, resid = (by_pointer[p] for p in mid.sources[:2])
            bias_add = rows_of(attn)
            projection = by_pointer[bias_add.sources[0]]
            assert bias_add.op == "ADD" and projection.op == "MUL_MAT", (layer, bias_add.op, projection.op)
            assert found[("kqv_out-{i}", "CONT", 0, layer)].pointer in projection.sources, layer
            before = found[("inpL", "ADD", 0, None)] if layer == 0 else found[("l_out-{i}", "ADD", 0, layer - 1)]
            assert rows_of(resid).pointer == before.pointer, (layer, resid.name)
            assert np.array_equal(mid.data, attn.data + resid.data)  # resid_mid = attn_out + resid_pre, in float32
    mapped = graph.mapped_taps(family, n_layer)
    assert len(mapped) == len(set(mapped))
    supported = backend.supported_taps(fixture)
    assert set(mapped) == set(supported)
    taps = graph.taps_from_nodes(nodes, family, fixture.model.config, len(case.tokens))
    beyond = f"blocks.{n_layer}."  # the last block's l_out is also the resid_pre of a block there is not
    assert {tap for tap in taps if not tap.startswith(beyond)} == set(mapped)
    unsupported = [tap for tap in fixture.tap_names if tap not in supported]
    assert unsupported and all(any(kind in tap for kind in NEVER_A_NODE) for tap in unsupported), unsupported


def test_a_node_the_map_names_that_is_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """If llama.cpp renamed a node, the run stops naming the tap it no longer finds, never passes without it."""
    backend = llama_cpp()
    table = {**graph.NODE_TAPS["llama"]}
    table[("ffn_out_renamed-{i}", "MUL_MAT", 0)] = table.pop(("ffn_out-{i}", "MUL_MAT", 0))
    monkeypatch.setitem(graph.NODE_TAPS, "llama", table)
    fixture = load_fixture(TOY_LLAMA).for_backend()
    with pytest.raises(BackendFailed, match=r"no node for blocks\.0\.hook_mlp_out") as err:
        list(backend.run_cases(fixture, "fp32"))
    assert "\n" not in str(err.value)


# -- toy-llama and llama-mini pass, fp32 and the stored formats ------------------------------------------------------

def test_toy_llama_passes_in_fp32_and_every_stored_format() -> None:
    llama_cpp()
    fixture = load_fixture(TOY_LLAMA)
    report = api.run(["llama-cpp"], fixture, "fp32,f16,q8_0,q4_0,q4_k")
    assert report.verdict == Verdict.AGREE and report, [d.message for d in report.divergences]
    ran = {r.precision: r.status.value for r in report.runs if r.backend == "llama-cpp"}
    assert ran == {p: "ran" for p in ("fp32", *STORED_FORMATS)}
    for precision in ("fp32", *STORED_FORMATS):
        assert_block_taps_compared_and_passing(report, fixture, precision)
        tiers = {r.golden for r in checks(report, "llama-cpp", precision)}
        assert tiers == ({"fp32"} if precision == "fp32" else {"fp64"}), (precision, tiers)
    # decoding: checked in fp32 (a stored format has no decoding goldens), every step passing
    assert report.decoding is not None and report.decoding.available
    assert report.decoding.n_passed > 0 and report.decoding.n_failed == 0
    assert {(c.backend, c.precision) for c in report.decoding.checks} == {("llama-cpp", "fp32")}
    # each stored run: what the file held, and the format's own cost beside the runtime's error
    stored = {run.precision: run for run in report.stored if run.backend == "llama-cpp"}
    assert set(stored) == set(STORED_FORMATS)
    assert "q5_0" in stored["q4_k"].storage and "q4_k" not in stored["q4_k"].storage  # toy rows: q4_k's fallback
    assert "q8_0" in stored["q8_0"].storage and "q4_0" in stored["q4_0"].storage
    for run in stored.values():
        logits = next(t for t in run.taps if t.tap == "logits")
        assert logits.runtime is not None and logits.runtime <= run.c and logits.passed
        assert logits.format > 0  # the format changed the weights: its goldens are not the fixture's
    assert "llama-cpp" in report.builds and "thread" in report.builds["llama-cpp"]


def test_llama_mini_passes_in_fp32_and_the_stored_formats(generated: dict[str, Path]) -> None:
    fixture = load_fixture(generated["llama-mini"])
    report = api.run(["llama-cpp"], fixture, "fp32,f16,q8_0,q4_0,q4_k")
    assert report.verdict == Verdict.AGREE and report, [d.message for d in report.divergences]
    for precision in ("fp32", *STORED_FORMATS):
        assert_block_taps_compared_and_passing(report, fixture, precision)
    stored = {run.precision: run.storage for run in report.stored}
    assert set(stored["q8_0"]) == {"q8_0", "f32"}  # d 32: every matrix row holds whole q8_0 blocks
    assert set(stored["q4_0"]) == {"q4_0", "f32"}
    assert set(stored["q4_k"]) == {"q5_0", "f32"}  # no row of 256: q4_k's fallback


# -- a planted bug: one quantization block's scale doubled in the GGUF file ------------------------------------------

BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}  # ggml_half d, then 32 int8 codes (q8_0) or 16 bytes of nibbles (q4_0)
PLANTED = "blk.3.ffn_down.weight"


def doubled_scale(tensor: StoredTensor, row: int, block: int) -> StoredTensor:
    """`tensor` with block `block` of row `row` holding twice its float16 scale (the block's first two bytes)."""
    data = tensor.data.copy()  # [rows, n_blocks * block bytes] uint8
    start = block * BLOCK_BYTES[tensor.kind]
    scale = data[row, start:start + 2].view(np.float16)
    scale *= 2
    return StoredTensor(tensor.kind, tensor.shape, data)


class PlantedLlamaCpp(LlamaCppBackend):
    """llama-cpp on a GGUF file whose `PLANTED` tensor has one block's scale doubled; the goldens it is judged
    against are those of the weights parity stores (unplanted)."""

    name = "llama-cpp-planted"
    row = 0
    block = 0

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        real = gguf_file.model_tensors

        def planted(fx: Fixture, fmt: str) -> dict[str, StoredTensor]:
            tensors = real(fx, fmt)
            tensors[PLANTED] = doubled_scale(tensors[PLANTED], self.row, self.block)
            return tensors

        with pytest.MonkeyPatch.context() as patch:  # only while this backend writes its file
            patch.setattr(gguf_file, "model_tensors", planted)
            yield from super().run_cases(fixture, precision)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_doubled_block_scale_fails_at_the_mlp_output_of_its_block(fmt: Precision,
                                                                    generated: dict[str, Path]) -> None:
    fixture = load_fixture(generated["llama-mini"])
    tensor = gguf_file.model_tensors(fixture, fmt)[PLANTED]
    assert tensor.kind == fmt and tensor.shape == (32, 64)  # [d_model rows, d_mlp]: 2 blocks a row
    # the block whose doubling moves the MLP output most: |its 32 weights . the block's hook_post| over every case
    weights = dequantized(tensor).reshape(32, 2, 32)  # [row, block, 32]
    goldens = stored_goldens(fixture, fmt)
    post = np.concatenate([goldens.case(c.name)["blocks.3.mlp.hook_post"] for c in fixture.cases])  # [T, 64]
    effect = np.abs(np.einsum("rbk,tbk->rbt", weights, post.reshape(-1, 2, 32))).max(axis=-1)  # [row, block]
    row, block = (int(i) for i in np.unravel_index(np.argmax(effect), effect.shape))
    atol = goldens.tolerance("blocks.3.hook_mlp_out").atol
    assert effect[row, block] > 2 * atol  # what the planted bug adds to that output is beyond its tolerance
    backend = PlantedLlamaCpp()
    backend.row, backend.block = row, block
    report = api.run([backend], fixture, fmt)
    assert report.verdict == Verdict.DISAGREE and not report
    (first,) = [d for d in report.divergences if d.backend == backend.name]
    assert first.tap == "blocks.3.hook_mlp_out", first.message
    assert first.index is not None and first.index[-1] == row  # the output row the doubled block feeds
    place = fixture.tap_names.index("blocks.3.hook_mlp_out")
    before = [r for r in checks(report, backend.name, fmt) if fixture.tap_names.index(r.tap) < place]
    assert before and all(r.passed is not False for r in before)


# -- GPT-2: ggml's GELU table ----------------------------------------------------------------------------------------

def test_the_gpt2_toy_fails_at_hook_post_naming_ggml_gelu_table() -> None:
    llama_cpp()
    fixture = load_fixture(TOY)
    report = api.run(["llama-cpp"], fixture, "fp32", decoding=False)
    assert report.verdict == Verdict.DISAGREE
    (first,) = [d for d in report.divergences if d.backend == "llama-cpp"]
    assert first.tap == "blocks.0.mlp.hook_post", first.message
    assert first.cause.startswith(f"{GELU_GGML_TABLE}: "), first.cause
    assert "float16 table" in first.cause


def test_gpt2_with_gelu_new_passes_every_tap_before_the_first_mlp(generated: dict[str, Path]) -> None:
    fixture = load_fixture(generated["gpt2-mini-gelu-new"])
    config: Any = fixture.model.config  # a GPTConfig
    assert config.activation == "gelu_new"
    report = api.run(["llama-cpp"], fixture, "fp32")
    (first,) = [d for d in report.divergences if d.backend == "llama-cpp"]
    assert first.tap == "blocks.0.mlp.hook_post", first.message
    assert first.cause.startswith(f"{GELU_GGML_TABLE}: "), first.cause
    place = fixture.tap_names.index("blocks.0.mlp.hook_post")
    before = [r for r in checks(report, "llama-cpp", "fp32") if fixture.tap_names.index(r.tap) < place]
    compared = {r.tap for r in before if r.status != NOT_SUPPORTED}
    assert {"hook_embed", "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid", "blocks.0.mlp.hook_pre"} <= compared
    assert all(r.passed is True for r in before if r.status != NOT_SUPPORTED)


# -- bad input never reaches llama.cpp -------------------------------------------------------------------------------

@pytest.fixture
def no_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp never loaded: making a session fails the test."""
    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("llama.cpp was handed the request")

    monkeypatch.setattr(module, "LlamaCppSession", never)


def with_case(fixture: Fixture, tokens: tuple[int, ...]) -> Fixture:
    """What the backend is handed, its first case's tokens replaced (the loader refuses them in a manifest)."""
    bad = fixture.for_backend()
    first = bad.cases[0]
    bad.cases = [Case(first.name, tokens, first.kind), *bad.cases[1:]]
    return bad


@pytest.mark.parametrize(("which", "make", "needle"), [
    ("toy", lambda n_ctx, vocab: tuple(range(n_ctx + 1)), "17 tokens, expected 1 to 16"),
    ("toy-llama", lambda n_ctx, vocab: tuple(i % vocab for i in range(n_ctx + 1)), "17 tokens, expected 1 to 16"),
    ("toy-llama", lambda n_ctx, vocab: (0, vocab, 1), "token id 12 out of range [0, 12)"),
    ("toy", lambda n_ctx, vocab: (0, -1), "token id -1 out of range [0, 12)"),
    ("toy", lambda n_ctx, vocab: (), "0 tokens, expected 1 to 16"),
])
def test_a_bad_case_is_one_line_before_llama_cpp(which: str, make: Any, needle: str, no_session: None) -> None:
    fixture = load_fixture(TOY if which == "toy" else TOY_LLAMA)
    config = fixture.model.config
    bad = with_case(fixture, make(config.n_ctx, config.vocab_size))
    with pytest.raises(FixtureError) as err:
        next(LlamaCppBackend().run_cases(bad, "fp32"))
    message = str(err.value)
    assert "\n" not in message and f"case {bad.cases[0].name!r}" in message and needle in message, message


@pytest.mark.parametrize(("request_", "needle"), [
    (DecodeRequest("long", tuple(range(12)) + (0,) * 5, 1), "17 tokens"),
    (DecodeRequest("bad", (0, 12), 1), "token id 12"),
    (DecodeRequest("fed", (0, 1), 3, (2, 99, 3)), "token id 99"),
    (DecodeRequest("greedy", (0, 1, 2), 14), "beyond the context of 16"),  # 3 + 14 positions: its own tokens past 16
])
def test_a_bad_decode_request_is_one_line_before_llama_cpp(request_: DecodeRequest, needle: str,
                                                           no_session: None) -> None:
    for root in (TOY, TOY_LLAMA):
        fixture = load_fixture(root).for_backend()
        with pytest.raises(FixtureError) as err:
            LlamaCppBackend().decode(fixture, "fp32", [request_])
        message = str(err.value)
        assert "\n" not in message and repr(request_.name) in message and needle in message, message


def test_the_last_position_of_the_context_still_decodes() -> None:
    """The bound is the context, not one short of it: a prompt of 3 and 13 greedy steps uses positions 0..15."""
    llama_cpp()
    fixture = load_fixture(TOY_LLAMA).for_backend()
    out = LlamaCppBackend().decode(fixture, "fp32", [DecodeRequest("edge", (0, 1, 2), 13)])
    assert "step13/logits" in out["edge"] and np.all(np.isfinite(out["edge"]["step13/logits"]))


CLI_WITH_A_LONG_CASE = textwrap.dedent('''
    import sys
    from parity_harness._cli.main import main
    from parity_harness._fixture.fixture import Case, Fixture

    copy_for_backend = Fixture.for_backend

    def handed_a_long_case(fixture):
        bad = copy_for_backend(fixture)
        first = bad.cases[0]
        bad.cases = [Case(first.name, tuple(range(12)) + (0,) * 5, first.kind), *bad.cases[1:]]
        return bad

    Fixture.for_backend = handed_a_long_case
    sys.exit(main(sys.argv[1:]))
''')


def test_a_case_longer_than_the_context_through_the_cli_is_exit_2() -> None:
    """`parity run --backends llama-cpp` in a subprocess, the backend handed a case of 17 tokens on the GPT-2 toy
    (n_ctx 16: llama.cpp would read past its position table, GGML_ASSERT, and the process would abort)."""
    llama_cpp()
    proc = subprocess.run([sys.executable, "-c", CLI_WITH_A_LONG_CASE, "run", "-q", "--fixture", str(TOY),
                           "--backends", "llama-cpp", "--precision", "fp32"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("parity: error: ") and "Traceback" not in proc.stderr, lines
    assert "case 'grammar_0': 17 tokens, expected 1 to 16" in lines[0], lines
    assert "PASS" not in proc.stdout


def test_an_unmasked_model_is_declined_with_one_line(tmp_path: Path) -> None:
    llama_cpp()
    unmasked = tmp_path / "unmasked"
    shutil.copytree(TOY, unmasked)
    edit_manifest(unmasked, lambda m: m["config"].update(causal=False))  # declined before any golden is read
    fixture = load_fixture(unmasked)
    assert fixture.model.config.causal is False
    why = LlamaCppBackend().declines(fixture)
    assert why is not None and "\n" not in why and "causal" in why and "unmasked" in why
    assert LlamaCppBackend().declines(load_fixture(TOY)) is None
    assert LlamaCppBackend().declines(load_fixture(TOY_LLAMA)) is None
    biased: Any = SimpleNamespace(family="llama", model=SimpleNamespace(config=SimpleNamespace(causal=True, bias=True)))
    assert "biases" in (LlamaCppBackend().declines(biased) or "")
    report = api.run(["llama-cpp"], fixture, "fp32")
    assert report.verdict == Verdict.NOTHING_COMPARED and why in report.nothing_compared_reason()


# -- the conformance kit ---------------------------------------------------------------------------------------------

def test_check_backend_passes(capsys: pytest.CaptureFixture[str]) -> None:
    import parity_harness._cli.main as cli

    llama_cpp()
    capsys.readouterr()
    code = cli.main(["check-backend", "llama-cpp"])
    out, err = capsys.readouterr()
    assert code == 0, (out[-3000:], err[-2000:])
    last = out.strip().splitlines()[-1]
    passed, failed = (int(part.split()[0]) for part in last.split(","))
    assert passed > 0 and failed == 0, last
    assert "q8_0" in out and "FAIL" not in out
