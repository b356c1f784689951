"""The TypeScript backend: Node runs `ts_model/node/run.ts`, the float64 port of the reference model.

`node ts_model/node/run.ts FIXTURE_DIR OUT.safetensors --per-case` writes every tap of each case in float64
under "{case}/{tap}", one file per case (OUT.safetensors.{i}); this class starts it in a temporary
directory and reads the files back one case at a time (`run_cases`), deleting each once read.
Which Node, and the settings (`PARITY_NODE`, `PARITY_TS_DIR`, `PARITY_NODE_TIMEOUT`):
parity_harness/_backends/node/runtime.py.

The backward and the training step (GPT-2 family, fp64 only, like the forward): `grad` and `train` each start
`node ts_model/node/run-grad.ts FIXTURE_DIR OUT.safetensors --spec SPEC.json --grad|--train` once, the spec
being `fixture.training()` as JSON (so Node never reads another spec than the one the harness checked), and
read back "{case}/loss", "{case}/{name}.grad" (ts_model/model/backward.ts) or "train/step{s}/{name}".
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.node.runtime import (
    INSTALL_HINT,
    find_node,
    last_line,
    run_node,
    split_by_case,
    timeout_seconds,
    ts_script,
)
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError
from parity_harness._core.settings import count_from_env

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture
    from parity_reference.training import TrainingSpec


# Threads for the matrix products from 1 M parameters on (ts_model/node/threads.ts; default: the machine's
# available parallelism, at most 4). The numbers do not depend on it, bit for bit.
THREADS_VARIABLE = "PARITY_TS_THREADS"


class TypeScriptBackend(Backend):
    name: ClassVar[str] = "typescript"
    description: ClassVar[str] = "ts_model/model/model.ts on Node, float64 (JavaScript numbers), no dependencies"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)
    install_hint: ClassVar[str] = INSTALL_HINT
    streams: ClassVar[bool] = True  # run.ts --per-case: one file per case, read and dropped one at a time
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend
    out_of_process: ClassVar[bool] = True  # Node computes: a side lane on a small fixture (_run/lanes.py)

    def missing_dependencies(self) -> list[str]:
        try:
            find_node()
        except BackendUnavailable:
            return ["node (Node.js >= 22.18)"]
        if not ts_script("run.ts").is_file():
            return [f"{ts_script('run.ts')} (set PARITY_TS_DIR to a directory holding node/run.ts)"]
        return []

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        node = find_node()
        script = ts_script("run.ts")
        if not script.is_file():
            raise BackendUnavailable(f"{script}: not found (set PARITY_TS_DIR to a directory holding node/run.ts)")
        timeout = timeout_seconds(fixture)
        count_from_env(THREADS_VARIABLE, 1, 64)  # run.ts reads it again; a bad value is one line here (exit 2)
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            out_path = Path(tmp) / "taps.safetensors"
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(out_path), "--per-case"]
            stderr = run_node(args, tmp, timeout, script)
            from parity_harness._fixture.fixture import read_safetensors

            for i, case in enumerate(fixture.cases):
                path = out_path.with_name(f"{out_path.name}.{i}")
                if not path.is_file():
                    raise BackendFailed(
                        f"typescript: {script.name} exited 0 but wrote no output for case {case.name!r} "
                        f"({last_line(stderr)})"
                    )
                try:
                    tensors = read_safetensors(path)
                except FixtureError as exc:
                    raise BackendFailed(f"typescript: unreadable output: {exc}") from None
                path.unlink()
                yield case.name, split_by_case(fixture, tensors, cases=[case])[case.name]

    def supports_decoding(self, fixture: Fixture) -> bool:
        """With ts_model/node/run-decode.ts (model.ts's `decode`, float64)."""
        return ts_script("run-decode.ts").is_file()

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        """`node run-decode.ts FIXTURE REQUESTS.json OUT.safetensors`, read back: {name: {"step{k}/{tap}": array}}."""
        import json

        from parity_harness._fixture.decoding import requests_for
        from parity_harness._fixture.fixture import read_safetensors

        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        reqs = requests_for(fixture, requests)
        node, script, timeout = find_node(), ts_script("run-decode.ts"), timeout_seconds()
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            req_path, out_path = Path(tmp) / "requests.json", Path(tmp) / "decode.safetensors"
            req_path.write_text(json.dumps([{"name": r.name, "prompt": list(r.prompt), "steps": r.steps,
                                             "feed": list(r.feed) if r.feed is not None else None} for r in reqs]))
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(req_path), str(out_path)]
            stderr = run_node(args, tmp, timeout, script)
            try:
                tensors = read_safetensors(out_path)
            except FixtureError as exc:
                raise BackendFailed(f"typescript: unreadable decoding output ({last_line(stderr)}): {exc}") from None
        out: DecodeOutput = {r.name: {} for r in reqs}
        for key, value in tensors.items():
            name, _, rest = key.partition("/")
            if name in out:
                out[name][rest] = value
        return out

    def supports_grad(self, fixture: Fixture) -> bool:
        """With ts_model/node/run-grad.ts (backward.ts, by hand, float64): the GPT-2 family, the one model.ts is."""
        return fixture.family == "gpt2" and ts_script("run-grad.ts").is_file()

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        """Each training case's loss and every gradient: {case: {"loss": [], "{name}.grad": array}}, float64."""
        spec = self._training_spec(fixture, precision)
        out: dict[str, dict[str, np.ndarray]] = {name: {} for name in spec.cases}
        for key, value in self._run_grad(fixture, spec, "--grad").items():
            case, _, name = key.partition("/")
            if case not in out:
                raise BackendFailed(f"typescript: run-grad.ts wrote {key!r}, not a key of a training case")
            out[case][name] = value
        for case, grads in out.items():
            missing = [n for n in ("loss", *fixture.grad_names()) if n not in grads]
            if missing:
                raise BackendFailed(f"typescript: run-grad.ts wrote no {missing[0]!r} for case {case!r}")
        return out

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        """The training steps: {"step{s}/loss": [], "step{s}/grad_norm": [], "step{s}/{param}": array}, float64."""
        from parity_reference.training import train_names

        spec = self._training_spec(fixture, precision)
        out: dict[str, np.ndarray] = {}
        for key, value in self._run_grad(fixture, spec, "--train").items():
            if not key.startswith("train/"):
                raise BackendFailed(f"typescript: run-grad.ts wrote {key!r}, not a training step's key")
            out[key.removeprefix("train/")] = value
        missing = [k for k in train_names(spec, list(fixture.model.param_shapes())) if k not in out]
        if missing:
            raise BackendFailed(f"typescript: run-grad.ts wrote no {missing[0]!r}")
        return out

    @staticmethod
    def _training_spec(fixture: Fixture, precision: Precision) -> TrainingSpec:
        if precision != "fp64":
            raise BackendFailed(f"typescript computes in float64 only, not {precision}")
        spec = fixture.training()
        if spec is None:
            raise FixtureError(f"{fixture.manifest_path}: the fixture has no training section (no gradient goldens)")
        return spec

    @staticmethod
    def _run_grad(fixture: Fixture, spec: TrainingSpec, what: str) -> dict[str, np.ndarray]:
        """`node run-grad.ts FIXTURE OUT.safetensors --spec SPEC.json WHAT` once, its output read back."""
        import json

        from parity_harness._fixture.fixture import read_safetensors

        node, script = find_node(), ts_script("run-grad.ts")
        if not script.is_file():
            raise BackendUnavailable(f"{script}: not found (set PARITY_TS_DIR to a directory holding node/run-grad.ts)")
        with tempfile.TemporaryDirectory(prefix="parity-ts-") as tmp:
            spec_path, out_path = Path(tmp) / "training.json", Path(tmp) / "grad.safetensors"
            spec_path.write_text(json.dumps(spec.to_dict()))
            args = [node, str(script.resolve()), str(fixture.root.resolve()), str(out_path), "--spec", str(spec_path),
                    what]
            stderr = run_node(args, tmp, timeout_seconds(fixture), script)
            try:
                return read_safetensors(out_path)
            except FixtureError as exc:
                raise BackendFailed(f"typescript: unreadable run-grad.ts output ({last_line(stderr)}): {exc}") from None
