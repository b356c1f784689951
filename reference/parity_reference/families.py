"""Model families as data: every tap's name, shape, axes, rows axis, bounds and layer, read from one table.

Pure Python (no torch, no NumPy). Each family is one JSON file, `parity_reference/families/{name}.json`,
so that Python and TypeScript read the same facts instead of re-deriving them from a tap's name:

- `family`, `description`, `config` (the dotted name of its config class);
- `code`: the family's code by role, as dotted module names (`CODE_ROLES`): `torch` and `numpy` (the reference
  forward in each, with `run_with_taps`/`forward`, `decode_step` and `decode`), `params` (the module whose
  `param_shapes(config)` names the weights), and the harness's own parts of the family: `authoring` (truth,
  ONNX constants, checkpoint import, presets), `causes` (its known porting bugs' patterns), `mutants` (its
  selftest mutants) and `gguf` (its parameters' GGUF names and layout, `layout(config, names)`, for the stored
  weight formats and llama.cpp). This table is the family registry: a new family is a new table and the modules it
  names;
  nothing else lists the families;
- `decoding`: the taps the incremental decoding cache holds (`cache_keys`, `cache_values`, relative to
  "blocks.{i}.") and the config field counting the cache's heads (`cache_heads`);
- `indices`: what a placeholder in a tap's name counts over: `{"i": "n_layer", "k": "n_layer + 1"}`;
- `bounds`: the bound kinds the family's taps use, each with a sentence saying why it holds;
- `taps`: every tap in dataflow order (the order "the first diverging tap" means), each with
  `name` (a pattern: `blocks.{i}.attn.hook_q`; consecutive taps with the same placeholder repeat
  together, block by block), `shape` (symbols: T, d_model, n_head, n_kv_heads, d_head, d_mlp, vocab_size,
  or an integer), `axes` (position, key_position, head, dim, neuron, token, scale), `rows` (the axis a
  fixture's `rows` cuts, by name, or null), `bounds` (a kind of `bounds`, or null), `layer` ("i" for a
  per-block tap, else null) and `sublayer` (the part of the model `run_layer` returns it with: "attn",
  "mlp", "unembed", or null).

    family = load_family("llama")
    family.tap_names(config)                       # every tap, in dataflow order
    family.shape_template(config, "blocks.0.attn.hook_rot_k")   # ["T", 2, 4]
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parity_reference.config import GPTConfig
    from parity_reference.llama_config import LlamaConfig

    ModelConfig = GPTConfig | LlamaConfig  # every family's config class, for the type checker (the tables' `config`)

SYMBOLS = ("T", "d_model", "n_head", "n_kv_heads", "d_head", "d_mlp", "vocab_size")
AXES = ("position", "key_position", "head", "dim", "neuron", "token", "scale")
SUBLAYERS = ("attn", "mlp", "unembed")
_TAP_KEYS = ("name", "shape", "axes", "rows", "bounds", "layer", "sublayer")
CODE_ROLES = ("torch", "numpy", "params", "authoring", "causes", "mutants", "gguf")
_DECODING_KEYS = ("cache_keys", "cache_values", "cache_heads")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_PLACEHOLDER = re.compile(r"\{([a-z])\}")
_COUNT = re.compile(r"([a-z_]+)(?: \+ (\d+))?")


class FamilyError(ValueError):
    """A family that does not exist, or whose table is malformed."""


@dataclass(frozen=True)
class TapSpec:
    """One row of a family's table: a tap pattern and its facts."""

    name: str  # a pattern: "blocks.{i}.attn.hook_q", "logit_lens.{k}", "logits"
    shape: tuple[int | str, ...]
    axes: tuple[str, ...]
    rows: str | None
    bounds: str | None
    layer: str | None
    sublayer: str | None

    @property
    def index(self) -> str | None:
        """The placeholder the pattern repeats over ("i", "k"), or None for a single tap."""
        found = _PLACEHOLDER.search(self.name)
        return found.group(1) if found else None


def _count(config: object, expr: str) -> int:
    """How many values a placeholder takes: "n_layer" or "n_layer + 1", read from the config."""
    match = _COUNT.fullmatch(expr)
    assert match is not None  # checked when the table was loaded
    return _symbol(config, match.group(1)) + int(match.group(2) or 0)


def _symbol(config: object, name: str) -> int:
    value = getattr(config, name, None)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FamilyError(f"the config has no integer {name!r} ({type(config).__name__})")
    return value


@dataclass(frozen=True)
class Family:
    """A model family's tap table, with the questions the harness asks of it."""

    name: str
    description: str
    config: str
    indices: dict[str, str]
    bounds: dict[str, str]
    taps: tuple[TapSpec, ...]
    code: dict[str, str] = field(default_factory=dict)  # role -> dotted module name (CODE_ROLES)
    decoding: dict[str, str] = field(default_factory=dict)  # cache_keys, cache_values, cache_heads
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_patterns", tuple(_pattern(t.name) for t in self.taps))

    def _match(self, tap: str) -> tuple[TapSpec, re.Match[str]]:
        for spec, pattern in zip(self.taps, self._patterns, strict=True):
            match = pattern.fullmatch(tap)
            if match is not None:
                return spec, match
        raise FamilyError(f"tap {tap!r} is not a tap of the {self.name} family")

    def tap_names(self, config: object) -> list[str]:
        """Every tap name for `config`, in dataflow order: a run of taps with one placeholder repeats together."""
        names: list[str] = []
        start = 0
        while start < len(self.taps):
            var = self.taps[start].index
            end = start + 1
            while end < len(self.taps) and self.taps[end].index == var:
                end += 1
            group = self.taps[start:end]
            if var is None:
                names += [t.name for t in group]
            else:
                for n in range(_count(config, self.indices[var])):
                    names += [t.name.replace("{" + var + "}", str(n)) for t in group]
            start = end
        return names

    def spec(self, tap: str) -> TapSpec:
        """The table row a concrete tap name belongs to; FamilyError if it has none."""
        return self._match(tap)[0]

    def shape_template(self, config: object, tap: str) -> list[int | str]:
        """The tap's shape with "T" standing for the sequence length, every other symbol resolved from `config`."""
        return [s if isinstance(s, int) or s == "T" else _symbol(config, s) for s in self.spec(tap).shape]

    def axis_names(self, config: object, tap: str) -> list[str]:
        """The name of each axis of the tap (the config is accepted for symmetry; names do not depend on it)."""
        return list(self.spec(tap).axes)

    def rows_axis(self, tap: str) -> int | None:
        """The index of the axis a fixture's `rows` cuts (the position axis), or None when rows cannot cut it."""
        spec = self.spec(tap)
        return None if spec.rows is None else spec.axes.index(spec.rows)

    def layer_of(self, tap: str) -> int | None:
        """The block a per-block tap belongs to ("blocks.3.attn.hook_z" -> 3), or None."""
        spec, match = self._match(tap)
        return None if spec.layer is None else int(match.group(spec.layer))

    def bounds_of(self, tap: str) -> str | None:
        """The tap's bound kind ("probability", "layernorm", "rmsnorm") or None when it is unbounded."""
        return self.spec(tap).bounds

    def value_range(self, config: object, tap: str) -> tuple[float, float] | None:
        """The range the tap's values lie in whatever the weights and tokens (its bound kind, made numeric)."""
        kind = self.bounds_of(tap)
        if kind is None:
            return None
        if kind == "probability":
            return (0.0, 1.0)
        d = _symbol(config, "d_model")
        bound = (max(d - 1, 0) if kind == "layernorm" else d) ** 0.5
        return (-bound, bound)

    def module(self, role: str) -> ModuleType:
        """The family's module for one role of `CODE_ROLES` (imported when first asked for)."""
        if role not in self.code:
            raise FamilyError(f"the {self.name} family has no {role!r} module (its table's code: "
                              f"{', '.join(sorted(self.code))})")
        return importlib.import_module(self.code[role])

    def sublayer_taps(self, sublayer: str) -> tuple[str, ...]:
        """The taps `run_layer` returns for one part, relative to "blocks.{i}." for "attn" and "mlp"."""
        return tuple(t.name.removeprefix("blocks.{i}.") for t in self.taps if t.sublayer == sublayer)


def _pattern(name: str) -> re.Pattern[str]:
    """A tap pattern as a regular expression: each placeholder a named group of a decimal index."""
    parts = _PLACEHOLDER.split(name)  # literal, var, literal, ...
    return re.compile("".join(re.escape(p) if n % 2 == 0 else rf"(?P<{p}>0|[1-9][0-9]*)" for n, p in enumerate(parts)))


def _bad(name: str, what: str) -> FamilyError:
    return FamilyError(f"family {name!r}: {what}")


def _tap_spec(name: str, row: Any, n: int, indices: dict[str, str], bounds: dict[str, str]) -> TapSpec:
    """One checked row of the table."""
    if not isinstance(row, dict) or sorted(row) != sorted(_TAP_KEYS):
        raise _bad(name, f"taps[{n}] must have exactly the keys {', '.join(_TAP_KEYS)}")
    tap = row["name"]
    if not isinstance(tap, str) or not tap:
        raise _bad(name, f"taps[{n}].name must be a non-empty string")
    vars_ = _PLACEHOLDER.findall(tap)
    if len(vars_) > 1 or any(v not in indices for v in vars_):
        raise _bad(name, f"tap {tap!r} must have at most one placeholder among {sorted(indices)}")
    shape, axes = row["shape"], row["axes"]
    if not isinstance(shape, list) or not all(
        (isinstance(s, int) and not isinstance(s, bool) and s >= 1) or s in SYMBOLS for s in shape
    ):
        raise _bad(name, f"tap {tap!r}: shape entries must be symbols ({', '.join(SYMBOLS)}) or positive integers")
    if not isinstance(axes, list) or len(axes) != len(shape) or not all(a in AXES for a in axes):
        raise _bad(name, f"tap {tap!r}: axes must name each of the {len(shape)} axes ({', '.join(AXES)})")
    if len(set(axes)) != len(axes):
        raise _bad(name, f"tap {tap!r}: an axis name appears twice")
    if row["rows"] is not None and row["rows"] not in axes:
        raise _bad(name, f"tap {tap!r}: rows must be one of its axes or null")
    if row["bounds"] is not None and row["bounds"] not in bounds:
        raise _bad(name, f"tap {tap!r}: bounds must be one of {sorted(bounds)} or null")
    if row["layer"] is not None and (row["layer"] not in vars_ or row["layer"] != "i"):
        raise _bad(name, f"tap {tap!r}: layer must be \"i\" (and the name must use {{i}}) or null")
    if row["layer"] is None and "i" in vars_:
        raise _bad(name, f"tap {tap!r}: a per-block tap must have layer \"i\"")
    if row["sublayer"] is not None and row["sublayer"] not in SUBLAYERS:
        raise _bad(name, f"tap {tap!r}: sublayer must be one of {', '.join(SUBLAYERS)} or null")
    return TapSpec(tap, tuple(shape), tuple(axes), row["rows"], row["bounds"], row["layer"], row["sublayer"])


def parse_family(name: str, data: Any) -> Family:
    """A family from its parsed JSON table; FamilyError (one line) on anything malformed."""
    keys = ("family", "description", "config", "code", "decoding", "indices", "bounds", "taps")
    if not isinstance(data, dict) or sorted(data) != sorted(keys):
        raise _bad(name, f"the table must have exactly the keys {', '.join(keys)}")
    if data["family"] != name:
        raise _bad(name, f"the table says it is family {data['family']!r}")
    for key in ("description", "config"):
        if not isinstance(data[key], str):
            raise _bad(name, f"{key} must be a string")
    indices, bounds = data["indices"], data["bounds"]
    if not isinstance(indices, dict) or not all(
        isinstance(k, str) and len(k) == 1 and isinstance(v, str) and _COUNT.fullmatch(v) for k, v in indices.items()
    ):
        raise _bad(name, 'indices must map a letter to a count such as "n_layer" or "n_layer + 1"')
    if not isinstance(bounds, dict) or not all(k in ("probability", "layernorm", "rmsnorm") for k in bounds):
        raise _bad(name, "bounds may name only probability, layernorm and rmsnorm")
    rows = data["taps"]
    if not isinstance(rows, list) or not rows:
        raise _bad(name, "taps must be a non-empty list")
    taps = tuple(_tap_spec(name, row, n, indices, bounds) for n, row in enumerate(rows))
    if len({t.name for t in taps}) != len(taps):
        raise _bad(name, "a tap is listed twice")
    seen: list[str | None] = []
    for t in taps:
        if not seen or seen[-1] != t.index:
            if t.index is not None and t.index in seen:
                raise _bad(name, f"the taps over {{{t.index}}} must be listed together (see {t.name!r})")
            seen.append(t.index)
    code, decoding = data["code"], data["decoding"]
    if not isinstance(code, dict) or sorted(code) != sorted(CODE_ROLES) or not all(
        isinstance(v, str) and _MODULE.fullmatch(v) for v in code.values()
    ):
        raise _bad(name, f"code must map exactly the roles {', '.join(CODE_ROLES)} to dotted module names")
    if not isinstance(decoding, dict) or sorted(decoding) != sorted(_DECODING_KEYS) or not all(
        isinstance(v, str) for v in decoding.values()
    ):
        raise _bad(name, f"decoding must map exactly {', '.join(_DECODING_KEYS)} to strings")
    return Family(name, data["description"], data["config"], dict(indices), dict(bounds), taps, dict(code),
                  dict(decoding))


def family_names() -> list[str]:
    """The families shipped with parity_reference, by name."""
    folder = resources.files("parity_reference").joinpath("families")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


@cache
def load_family(name: str) -> Family:
    """The family `name` (parity_reference/families/{name}.json), read and checked once."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name not in family_names():
        raise FamilyError(f"unknown model family {name!r} (known: {', '.join(family_names())})")
    text = resources.files("parity_reference").joinpath("families", f"{name}.json").read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(name, f"not valid JSON ({exc})") from None
    return parse_family(name, data)


def family_of(config: object) -> Family:
    """The family whose table names `config`'s class as its config (a GPTConfig is gpt2's); FamilyError if none."""
    dotted = f"{type(config).__module__}.{type(config).__qualname__}"
    for name in family_names():
        family = load_family(name)
        if family.config == dotted:
            return family
    raise FamilyError(f"no model family has the config class {dotted}")


def typescript_module(name: str) -> str:
    """The family's table as a TypeScript module (ts_model/model/family-{name}.ts): the same data, for the model
    that runs in Node and the browser. Generated, never edited: tests/families/test_families.py keeps the file equal."""
    data = json.loads(resources.files("parity_reference").joinpath("families", f"{name}.json").read_text("utf-8"))
    load_family(name)  # checked first
    const = name.upper().replace("-", "_") + "_FAMILY"
    taps = ",\n".join("    " + json.dumps(t) for t in data["taps"])  # one tap per line
    body = (f'{{\n  "family": {json.dumps(data["family"])},\n  "indices": {json.dumps(data["indices"])},\n'
            f'  "taps": [\n{taps},\n  ],\n}}')
    return (f"// The {name} family's tap table, generated from reference/parity_reference/families/{name}.json by\n"
            f"// `python -m parity_reference.families --typescript {name} > ts_model/model/family-{name}.ts`.\n"
            "// Do not edit: tests/families/test_families.py checks this file equals what the table generates.\n\n"
            'import type { FamilyTable } from "./families.ts";\n\n'
            f"export const {const}: FamilyTable = {body};\n")


if __name__ == "__main__":  # python -m parity_reference.families --typescript NAME
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "--typescript":
        sys.exit("usage: python -m parity_reference.families --typescript NAME")
    sys.stdout.write(typescript_module(sys.argv[2]))
