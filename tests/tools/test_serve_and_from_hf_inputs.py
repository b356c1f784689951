"""Hostile `parity serve` requests and hostile `--from-hf` checkpoints (issue 22, items 4 and 5).

`serve` cases: a foreign Host (DNS rebinding) gets 421 and nothing of the fixture; a symlink
re-pointed after start changes nothing served (the bytes are the start-time verified ones); a
symlink out of the fixture is refused at start, one line; traversal forms are 404. Servers bind
127.0.0.1, every request has a timeout, and every server is shut down by the test that made it.

`hf` cases: each checkpoint parity cannot represent faithfully is exit 2, one `parity: error:`
line naming the file and the field or tensor, no traceback, no fixture directory left behind and
nothing outside the test's temporary directory changed; bf16 and fp16 checkpoints made by
save_pretrained are read exactly and agree on every backend. The case ids start with their class.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import load_fixture
from parity_harness._tools.serve import make_server, routes
from tests.helpers import BUILTIN_PRECISIONS, REPO, assert_exit_2_one_line, run_cli
from tests.helpers import gpt2_checkpoint as _checkpoint

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

TIMEOUT = 60  # seconds, for every request a test makes: a hang guard, generous for a loaded machine


# -- serve -------------------------------------------------------------------------------------

def _page(tmp: Path) -> Path:
    page = tmp / "page"
    page.mkdir()
    for name in ("index.html", "main.js", "style.css"):
        (page / name).write_text(f"page {name}")
    return page


@contextmanager
def served(page: Path, fixture: Path) -> Iterator[int]:
    """A server of `fixture` on 127.0.0.1 in a thread; its port. Shut down on leaving the block."""
    server = make_server(routes(page, fixture), 0)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=TIMEOUT)


def get(port: int, path: str, host: str | None = "default", extra: list[tuple[str, str]] | None = None,
        ) -> tuple[int, bytes]:
    """GET `path` with the Host header `host` ("default": 127.0.0.1:PORT; None: no Host at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", f"127.0.0.1:{port}" if host == "default" else host.replace("PORT", str(port)))
        for name, value in extra or []:
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FOREIGN_HOSTS = [
    ("serve-host-rebinding-name", "attacker.example:PORT"),
    ("serve-host-rebinding-no-port", "attacker.example"),
    ("serve-host-loopback-subdomain", "127.0.0.1.nip.io:PORT"),
    ("serve-host-localhost-suffix", "localhost.attacker.example:PORT"),
    ("serve-host-wrong-port", "127.0.0.1:1"),
    ("serve-host-no-port", "127.0.0.1"),
    ("serve-host-localhost-dot", "localhost.:PORT"),
    ("serve-host-empty", ""),
    ("serve-host-missing", None),
]


@pytest.mark.parametrize(("host",), [pytest.param(h, id=i) for i, h in FOREIGN_HOSTS])
def test_a_foreign_host_gets_421_and_nothing_of_the_fixture(host: str | None, toy_dir: Path,
                                                            tmp_path: Path) -> None:
    secret = (toy_dir / "manifest.json").read_bytes()
    with served(_page(tmp_path), toy_dir) as port:
        for path in ("/fixture/manifest.json", "/fixture/weights.safetensors", "/"):
            status, body = get(port, path, host)
            assert status == 421, (host, path, status)
            assert b"parity-fixture" not in body and secret[:64] not in body and b"page " not in body


def test_a_second_host_header_is_refused(toy_dir: Path, tmp_path: Path) -> None:
    with served(_page(tmp_path), toy_dir) as port:
        status, body = get(port, "/fixture/manifest.json", extra=[("Host", "attacker.example")])
        assert status == 421 and b"parity-fixture" not in body


def test_its_own_origin_gets_the_verified_bytes(toy_dir: Path, tmp_path: Path) -> None:
    """The control: 127.0.0.1:PORT and localhost:PORT (any case) get each file, byte for byte."""
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    with served(_page(tmp_path), toy_dir) as port:
        for host in ("127.0.0.1:PORT", "localhost:PORT", "LocalHost:PORT"):
            status, body = get(port, "/fixture/manifest.json", host)
            assert status == 200 and body == (toy_dir / "manifest.json").read_bytes()
        for name, digest in manifest["sha256"].items():
            status, body = get(port, f"/fixture/{name}")
            assert status == 200 and _sha(body) == digest, name
        assert get(port, "/") == (200, b"page index.html")


def test_the_parity_serve_command_answers_only_its_own_origin(toy_dir: Path) -> None:
    """`parity serve --port 0` as a user runs it (the page built with esbuild), then Ctrl-C."""
    from parity_harness._backends.browser import driver as browser

    if browser.missing(need_browser=False):
        pytest.skip(f"parity serve needs {browser.missing(need_browser=False)}")
    proc = subprocess.Popen([sys.executable, "-m", "parity_harness", "serve", "--fixture", str(toy_dir), "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()  # "parity: serving the page for ... at http://127.0.0.1:PORT/ ..."
        assert " at http://127.0.0.1:" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split(" at http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert get(port, "/fixture/manifest.json", "attacker.example:PORT")[0] == 421
        assert get(port, "/fixture/manifest.json") == (200, (toy_dir / "manifest.json").read_bytes())
        assert get(port, "/")[0] == 200 and get(port, "/fixture/../pyproject.toml")[0] == 404
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 0 and err.strip() == "parity: stopped", err


@pytest.fixture
def linked_fixture(fixture_copy: Path) -> Path:
    """The toy with weights.safetensors a symlink to a file inside the fixture (allowed)."""
    weights = fixture_copy / "weights.safetensors"
    weights.rename(fixture_copy / ".weights.real")
    weights.symlink_to(".weights.real")
    load_fixture(fixture_copy)  # still a valid fixture
    return fixture_copy


def test_serve_symlink_repointed_after_start_is_not_followed(linked_fixture: Path, tmp_path: Path) -> None:
    digest = json.loads((linked_fixture / "manifest.json").read_text())["sha256"]["weights.safetensors"]
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    weights = linked_fixture / "weights.safetensors"
    with served(_page(tmp_path), linked_fixture) as port:
        assert _sha(get(port, "/fixture/weights.safetensors")[1]) == digest
        repointed = linked_fixture / ".repointed"
        repointed.symlink_to(secret)
        os.replace(repointed, weights)  # the link now leads out of the fixture, to the secret
        status, body = get(port, "/fixture/weights.safetensors")
        assert status == 200 and _sha(body) == digest and b"root:x" not in body
        (linked_fixture / ".weights.real").write_bytes(b"changed in place")  # and the old target rewritten
        weights.unlink()
        status, body = get(port, "/fixture/weights.safetensors")
        assert status == 200 and _sha(body) == digest


def test_serve_manifest_rewritten_after_start_is_not_served(fixture_copy: Path, tmp_path: Path) -> None:
    original = (fixture_copy / "manifest.json").read_bytes()
    with served(_page(tmp_path), fixture_copy) as port:
        (fixture_copy / "manifest.json").write_text('{"tolerances": "anything"}')
        assert get(port, "/fixture/manifest.json") == (200, original)


def _link_out(name: str) -> Callable[[Path, Path], None]:
    """Replace fixture file `name` by a symlink to an identical copy outside the fixture (hash still right)."""
    def breaker(root: Path, outside: Path) -> None:
        copy = outside / f"outside-{name}"
        shutil.copyfile(root / name, copy)
        (root / name).unlink()
        (root / name).symlink_to(copy)
    return breaker


@pytest.mark.parametrize("name", [
    pytest.param("golden.fp32.safetensors", id="serve-symlink-out-golden"),
    pytest.param("manifest.json", id="serve-symlink-out-manifest"),
    pytest.param("model.onnx", id="serve-symlink-out-onnx"),
])
def test_serve_refuses_at_start_a_symlink_out_of_the_fixture(name: str, fixture_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _link_out(name)(fixture_copy, outside)
    # The hashes match: only the link is wrong. A data file the manifest lists is refused by every
    # command that loads the fixture (parity_harness/_fixture/fixture.py, fixture_file); the manifest itself by serve.
    proc = run_cli("serve", "--fixture", str(fixture_copy), "--port", "0", timeout=120)
    assert_exit_2_one_line(proc, name, "outside the fixture directory")
    with pytest.raises(FixtureError, match="outside the fixture directory"):
        routes(_page(tmp_path), fixture_copy)


TRAVERSAL = [
    "/fixture/../pyproject.toml", "/fixture/%2e%2e/pyproject.toml", "/fixture/%2E%2E/%2E%2E/etc/passwd",
    "/..%2f..%2fetc/passwd", "/fixture%2fmanifest.json", "/fixture/..%2fmanifest.json",
    "/fixture/%2e%2e%2fmanifest.json", "/fixture/./manifest.json", "/fixture//manifest.json",
    "//fixture/manifest.json", "//x/index.html", "/etc/passwd", "/fixture/" + "/etc/passwd",
    "http://127.0.0.1/fixture/manifest.json", "/FIXTURE/manifest.json", "/fixture/manifest.json/",
    "/fixture/manifest.json%00", "/fixture/", "/fixture", "/fixture/notes.txt", "/fixture/.weights.real",
]


def test_serve_traversal_forms_get_404(linked_fixture: Path, tmp_path: Path) -> None:
    (linked_fixture / "notes.txt").write_text("in the fixture directory, not in the manifest")
    with served(_page(tmp_path), linked_fixture) as port:
        assert get(port, "/fixture/manifest.json")[0] == 200  # the control
        for path in TRAVERSAL:
            status, body = get(port, path)
            assert status == 404 and b"parity-fixture" not in body, path


# -- from-hf -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 'gelu' checkpoint from transformers' save_pretrained, once per session (read-only)."""
    with pytest.MonkeyPatch.context() as mp:
        return _checkpoint(tmp_path_factory.mktemp("hf") / "ckpt", "gelu", mp)


def _config(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    def breaker(ckpt: Path) -> None:
        config = json.loads((ckpt / "config.json").read_text())
        change(config)
        (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    return breaker


def _config_text(old: str, new: str) -> Callable[[Path], None]:
    """A text edit of config.json, for what json.dumps does not write (NaN, a repeated key)."""
    def breaker(ckpt: Path) -> None:
        path = ckpt / "config.json"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return breaker


def _tensors(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    """Rewrite model.safetensors (torch tensors, so any dtype) after `change`."""
    def breaker(ckpt: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(ckpt / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    return breaker


def _cast(key: str, dtype: str, offset: float = 0.0) -> Callable[[dict[str, Any]], None]:
    def change(tensors: dict[str, Any]) -> None:
        import torch

        tensors[key] = (tensors[key].to(torch.float64) + offset).to(getattr(torch, dtype))
    return change


def _duplicate(tensors: dict[str, Any]) -> None:
    tensors["wte.weight"] = tensors["transformer.wte.weight"] * 2  # the "wrong one" that once won


FC = "transformer.h.0.mlp.c_fc.weight"
HF_REFUSED: list[tuple[str, Callable[[Path], None], tuple[str, ...], tuple[str, ...]]] = [
    ("hf-config-nan", _config_text('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": NaN'),
     ("config.json", "NaN"), ()),
    ("hf-config-infinity", _config_text('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": Infinity'),
     ("config.json", "Infinity"), ()),
    ("hf-config-overflow", _config_text('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": 1e999'),
     ("config.json", "1e999", "infinity"), ()),
    ("hf-config-repeated-key", _config_text('"n_head": 2,', '"n_head": 2, "n_head": 4,'),
     ("config.json", "duplicate key 'n_head'"), ()),
    ("hf-config-n-head-2.9", _config(lambda c: c.update(n_head=2.9)),
     ("config.json", "n_head must be a positive integer, got 2.9"), ()),
    ("hf-config-n-layer-true", _config(lambda c: c.update(n_layer=True)),
     ("config.json", "n_layer must be a positive integer, got true"), ()),
    ("hf-config-n-embd-string", _config(lambda c: c.update(n_embd="16")),
     ("config.json", "n_embd must be a positive integer"), ()),
    ("hf-config-n-inner-float", _config(lambda c: c.update(n_inner=64.0)),
     ("config.json", "n_inner must be a positive integer, got 64.0"), ()),
    ("hf-config-eps-bool", _config(lambda c: c.update(layer_norm_epsilon=True)),
     ("config.json", "layer_norm_epsilon must be a positive number"), ()),
    ("hf-config-model-type", _config(lambda c: c.update(model_type="gpt_neox")),
     ("config.json", "model_type \"gpt_neox\" is not \"gpt2\""), ()),
    ("hf-config-no-model-type", _config(lambda c: c.pop("model_type")),
     ("config.json", "model_type null"), ()),
    ("hf-config-architecture", _config(lambda c: c.update(architectures=["GPT2DoubleHeadsModel"])),
     ("config.json", "architectures", "GPT2DoubleHeadsModel"), ()),
    ("hf-config-cross-attention", _config(lambda c: c.update(add_cross_attention=True)),
     ("config.json", "add_cross_attention is true"), ()),
    ("hf-config-scale-attn-string", _config(lambda c: c.update(scale_attn_weights="yes")),
     ("config.json", "scale_attn_weights must be true or false"), ()),
    ("hf-act-relu-exact-gelu", _config(lambda c: c.update(activation_function="relu")),
     ("config.json", "activation_function 'relu'", "--exact-gelu replaces only"), ("--exact-gelu",)),
    ("hf-act-relu", _config(lambda c: c.update(activation_function="relu")),
     ("config.json", "activation_function 'relu'"), ()),
    ("hf-act-quick-gelu-exact-gelu", _config(lambda c: c.update(activation_function="quick_gelu")),
     ("config.json", "'quick_gelu'"), ("--exact-gelu",)),
    ("hf-act-unknown", _config(lambda c: c.update(activation_function="swiglu_v9")),
     ("config.json", "'swiglu_v9'"), ("--exact-gelu",)),
    ("hf-act-not-a-string", _config(lambda c: c.update(activation_function=["gelu"])),
     ("config.json", "activation_function must be a string"), ()),
    ("hf-weights-duplicate-keys", _tensors(_duplicate),
     ("model.safetensors", "'transformer.wte.weight' and 'wte.weight'", "refused rather than choosing"), ()),
    ("hf-weights-int8", _tensors(_cast(FC, "int8")), ("model.safetensors", repr(FC), "is I8"), ()),
    ("hf-weights-int32", _tensors(_cast(FC, "int32")), ("model.safetensors", repr(FC), "is I32"), ()),
    ("hf-weights-bool", _tensors(_cast(FC, "bool")), ("model.safetensors", repr(FC), "is BOOL"), ()),
    ("hf-weights-f8", _tensors(_cast(FC, "float8_e4m3fn")), ("model.safetensors", repr(FC), "is F8_E4M3"), ()),
    ("hf-weights-f64-inexact", _tensors(_cast(FC, "float64", offset=1e-12)),
     ("model.safetensors", repr(FC), "F64 with values float32 cannot hold"), ()),
    ("hf-weights-untied-no-lm-head", _config(lambda c: c.update(tie_word_embeddings=False)),
     ("model.safetensors", "tie_word_embeddings false", "no lm_head.weight"), ()),
]


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every file under `roots` (recursively) -> its sha256: what "nothing changed" compares."""
    return {str(p): _sha(p.read_bytes()) for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def _repo_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize(("breaker", "needles", "flags"),
                         [pytest.param(b, n, f, id=i) for i, b, n, f in HF_REFUSED])
def test_from_hf_refuses_what_it_cannot_represent(breaker: Callable[[Path], None], needles: tuple[str, ...],
                                                  flags: tuple[str, ...], base_checkpoint: Path,
                                                  tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, ckpt)
    breaker(ckpt)
    before, repo_before = _snapshot(tmp_path), _repo_status()
    target = tmp_path / "out" / "fixture"
    proc = run_cli("export", "--from-hf", str(ckpt), "--fixture", str(target), *flags, timeout=300)
    assert_exit_2_one_line(proc, *needles)
    assert "internal error" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing left behind: a re-run is not blocked
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert _repo_status() == repo_before


def _exported(ckpt: Path, fixture: Path, *flags: str) -> None:
    proc = run_cli("export", "--from-hf", str(ckpt), "--fixture", str(fixture), *flags, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parity: error" not in proc.stderr and "Traceback" not in proc.stderr


def _assert_exact(ckpt: Path, fixture: Path, dtype: str) -> None:
    """The fixture's float32 weights are the checkpoint's values widened, bit for bit."""
    import torch
    from safetensors.torch import load_file

    source = load_file(str(ckpt / "model.safetensors"))
    weights = load_fixture(fixture).weights()
    assert {str(t.dtype) for t in source.values()} == {f"torch.{dtype}"}
    for key, tensor in source.items():
        name = key.removeprefix("transformer.")
        assert name in weights, name
        assert np.array_equal(weights[name], tensor.to(torch.float32).numpy()), name
        if dtype == "bfloat16":  # independently of torch: a bf16 is the top half of a float32's bits
            bits = tensor.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
            assert np.array_equal(weights[name].view(np.uint32), bits), name
        else:  # float16 -> float32 -> float16 is the identity, and numpy widens the same way
            assert np.array_equal(weights[name], tensor.numpy().astype(np.float32)), name


def test_hf_bf16_checkpoint_exports_exactly_and_passes_every_backend(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance test: bf16 from save_pretrained, both ONNX graphs, `parity run` on every built-in backend."""
    ckpt = _checkpoint(tmp_path / "ckpt", "gelu", monkeypatch, dtype="bfloat16")
    fixture = tmp_path / "fixture"
    _exported(ckpt, fixture)
    _assert_exact(ckpt, fixture, "bfloat16")
    assert load_fixture(fixture).manifest["provenance"]["source_dtype"] == "BF16"
    out = tmp_path / "report.json"
    proc = run_cli("run", "--fixture", str(fixture), "--backends", ",".join(sorted(BUILTIN_PRECISIONS)),
                   "--json", str(out), "-q", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    assert ran == {(b, p) for b, ps in BUILTIN_PRECISIONS.items() for p in ps}
    assert report["passed"] is True and report["counts"]["failed"] == 0


def test_hf_fp16_checkpoint_exports_exactly_and_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from parity_harness._authoring.hf_import import export_from_hf
    from parity_harness._backends.registry import load_backend
    from parity_harness._run.runner import run_parity

    ckpt = _checkpoint(tmp_path / "ckpt", "gelu_new", monkeypatch, dtype="float16")
    fixture = tmp_path / "fixture"
    export_from_hf(ckpt, fixture, exact_gelu=True, progress=lambda _m: None, with_onnx=False)
    _assert_exact(ckpt, fixture, "float16")
    loaded = load_fixture(fixture)
    assert loaded.manifest["provenance"]["source_dtype"] == "F16"
    backends = [load_backend(n) for n in ("pytorch", "numpy", "hf-transformers")]
    assert all(not b.missing() for b in backends), [b.missing() for b in backends]
    report = run_parity(loaded, backends, progress=None)
    assert report.passed, [r for r in report.results if r.passed is False][:3]


def test_hf_mixed_dtypes_are_recorded_each_with_its_count(base_checkpoint: Path, tmp_path: Path) -> None:
    from parity_harness._authoring.hf_import import read_hf_config, read_hf_weights

    ckpt = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, ckpt)
    _tensors(_cast(FC, "bfloat16"))(ckpt)
    _tensors(_cast("transformer.h.1.mlp.c_fc.weight", "float64"))(ckpt)  # float64 holding float32 values: exact
    hf = read_hf_config(ckpt / "config.json")
    _weights, dtype = read_hf_weights(ckpt / "model.safetensors", hf.config, hf.tied)
    assert dtype == "BF16 (1 tensor), F32 (26 tensors), F64 (1 tensor)"


def test_hf_failed_export_leaves_nothing_behind(base_checkpoint: Path, tmp_path: Path) -> None:
    """A failure after the goldens are written (here: the ONNX export step raises) leaves no directory."""
    from parity_harness._authoring.hf_import import export_from_hf

    target = tmp_path / "new" / "deeper" / "fixture"
    seen: list[str] = []

    def progress(message: str) -> None:
        seen.append(message)
        if "ONNX graph" in message:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        export_from_hf(base_checkpoint, target, progress=progress)
    assert any("golden fp64" in m for m in seen)  # real work was done before the failure
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # not the fixture, nor its parents, nor a temp dir
    export_from_hf(base_checkpoint, target, progress=lambda _m: None, with_onnx=False)  # the re-run is not blocked
    assert load_fixture(target).manifest["provenance"]["source_dtype"] == "F32"
    assert sorted(p.name for p in target.parent.iterdir()) == ["fixture"]
    assert {oct(p.stat().st_mode & 0o777) for p in target.iterdir()} == {"0o644"}


def test_hf_interrupted_export_leaves_nothing_behind(base_checkpoint: Path, tmp_path: Path) -> None:
    """Ctrl-C in the middle of a real `parity export --from-hf`: exit 130, one line, no fixture, no temp dir."""
    target = tmp_path / "fixture"
    proc = subprocess.Popen([sys.executable, "-m", "parity_harness", "export", "--from-hf", str(base_checkpoint),
                             "--fixture", str(target)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "golden fp64" in line:  # the fp32 goldens are computed: work under way
                proc.send_signal(signal.SIGINT)
                break
        _out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 130, [*lines, rest]
    assert rest.strip().splitlines()[-1] == "parity: interrupted" and "Traceback" not in rest
    assert list(tmp_path.iterdir()) == []
