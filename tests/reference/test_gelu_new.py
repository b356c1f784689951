"""GPT-2's own activation, `gelu_new` (the tanh GELU), in the GPT-2 family's config and every implementation of it.

- the torch reference, the NumPy reference, the mpmath truth and the TypeScript model compute transformers'
  `NewGELUActivation` in float64 to round-off on a grid of x, and not the exact GELU;
- `GPTConfig.activation` defaults to "gelu", which the manifest form leaves out (every committed GPT-2 fixture's
  config has no `activation` key and reads back to the same object); "gelu_new" is written; anything else is
  refused by the config and by the manifest's schema.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from parity_harness._backends.node.runtime import find_node
from parity_harness._core.errors import BackendUnavailable
from parity_harness._fixture.fixture import load_fixture
from parity_harness._fixture.schema import validate_manifest
from parity_reference import numpy_model
from parity_reference.config import TOY, GPTConfig
from tests.helpers import REPO

EPS64 = float(np.finfo(np.float64).eps)
# A grid through GELU's curved middle, its tails, tiny values and both signs.
GRID = np.concatenate([np.linspace(-12.0, 12.0, 2401), [-40.0, -25.5, -1e-8, 0.0, 1e-8, 3e-3, 25.5, 40.0]])


def _transformers_gelu_new(x: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    with torch.no_grad():
        out: np.ndarray = activations.NewGELUActivation()(torch.tensor(x, dtype=torch.float64)).numpy()
    return out


def _assert_round_off(got: np.ndarray, want: np.ndarray, who: str) -> None:
    """Within a few float64 units of the value's size: round-off, nothing an approximation would give."""
    err = np.abs(got - want)
    bound = 4 * EPS64 * np.maximum(np.abs(want), 1.0)
    worst = int(np.argmax(err / bound))
    assert np.all(err <= bound), f"{who}: x = {GRID[worst]!r}: {got[worst]!r} vs transformers' {want[worst]!r}"


def _exact_gelu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = numpy_model.gelu(x)
    return out


def test_the_grid_tells_gelu_new_from_the_exact_gelu() -> None:
    """The comparisons below can fail: the exact GELU is far from transformers' gelu_new on the same grid."""
    want = _transformers_gelu_new(GRID)
    assert np.abs(_exact_gelu(GRID) - want).max() > 1e-4


def test_torch_reference_gelu_new_is_transformers_new_gelu() -> None:
    torch = pytest.importorskip("torch")
    from parity_reference import model

    got = model.gelu_new(torch.tensor(GRID, dtype=torch.float64)).numpy()
    _assert_round_off(got, _transformers_gelu_new(GRID), "parity_reference.model.gelu_new")


def test_numpy_reference_gelu_new_is_transformers_new_gelu() -> None:
    got = numpy_model.gelu_new(GRID)
    assert got.dtype == np.float64 and numpy_model.gelu_new(GRID.astype(np.float32)).dtype == np.float32
    _assert_round_off(got, _transformers_gelu_new(GRID), "parity_reference.numpy_model.gelu_new")


def test_mpmath_truth_gelu_new_is_transformers_new_gelu() -> None:
    mpmath = pytest.importorskip("mpmath")
    from parity_harness._authoring.truth import DIGITS, _gelu

    mp = mpmath.mp.clone()
    mp.dps = DIGITS
    got = np.array([float(_gelu(mp.mpf(float(v)), "gelu_new", mp)) for v in GRID])
    _assert_round_off(got, _transformers_gelu_new(GRID), "truth._gelu('gelu_new')")
    exact = np.array([float(_gelu(mp.mpf(float(v)), "gelu", mp)) for v in GRID])
    _assert_round_off(exact, _exact_gelu(GRID), "truth._gelu('gelu')")  # the exact one is still the exact one


def test_typescript_gelu_new_is_transformers_new_gelu() -> None:
    try:
        node = find_node()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    script = (
        'import { geluNew } from "./ts_model/model/model.ts";\n'
        'let text = ""; for await (const chunk of process.stdin) text += chunk;\n'
        "const x = JSON.parse(text);\n"
        "const y = geluNew({ shape: [x.length], data: Float64Array.from(x) });\n"
        "console.log(JSON.stringify(Array.from(y.data)));\n"
    )
    proc = subprocess.run([node, "--input-type=module", "-e", script], cwd=REPO, input=json.dumps(GRID.tolist()),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = np.array(json.loads(proc.stdout), dtype=np.float64)  # JSON keeps a float64 exactly (shortest repr)
    _assert_round_off(got, _transformers_gelu_new(GRID), "model.ts geluNew")


def test_config_activation_defaults_to_gelu_and_is_left_out_of_the_manifest() -> None:
    assert TOY.activation == "gelu" and "activation" not in TOY.to_dict()
    tanh = GPTConfig(activation="gelu_new")
    assert tanh.to_dict()["activation"] == "gelu_new"
    assert GPTConfig.from_dict(tanh.to_dict()) == tanh
    assert GPTConfig.from_dict(TOY.to_dict()) == TOY  # absent: the exact GELU
    assert GPTConfig.from_dict({**TOY.to_dict(), "activation": "gelu"}) == TOY  # present and "gelu": the same
    with pytest.raises(ValueError, match="activation must be 'gelu' or 'gelu_new', got 'relu'"):
        GPTConfig(activation="relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown config keys: act_fn"):
        GPTConfig.from_dict({**TOY.to_dict(), "act_fn": "gelu_new"})


@pytest.mark.parametrize("name", ["toy", "toy-stress"])
def test_committed_gpt2_fixtures_have_no_activation_key(name: str) -> None:
    """Their manifests, seals and ids are as before: the config object reads back to exactly what is committed."""
    root = REPO / "fixtures" / name
    raw = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    assert "activation" not in raw["config"]
    fixture = load_fixture(root)  # checks the seal and every file's hash
    assert fixture.config.activation == "gelu"
    assert fixture.config.to_dict() == raw["config"]


def test_the_schema_takes_gelu_new_and_refuses_another_activation() -> None:
    raw = json.loads((REPO / "fixtures" / "toy" / "manifest.json").read_text(encoding="utf-8"))
    raw["config"]["activation"] = "gelu_new"
    assert validate_manifest(raw) is None
    raw["config"]["activation"] = "relu"
    problem = validate_manifest(raw)
    assert problem is not None and problem.startswith("config.activation"), problem
