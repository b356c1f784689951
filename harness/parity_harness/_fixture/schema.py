"""The manifest's schema (parity_harness/_fixture/manifest.schema.json, shipped with the package) and its one validator.

`validate_manifest(obj)` checks types, ranges and structure against the JSON Schema with the
`jsonschema` library and returns the first problem as one line naming the field, e.g.
`config.n_ctx: "16" must be of type integer`, or None. Integers are strict: `1.0` and `true` are
not integers here (JSON Schema would accept `1.0`). The seal, `manifest_digest`, is the sha256 of
the manifest's canonical JSON without its `manifest_sha256` key.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

from parity_reference.families import family_names

SEAL_KEY = "manifest_sha256"


@functools.cache
def manifest_schema() -> dict[str, Any]:
    """The JSON Schema of manifest.json (package data)."""
    text = resources.files("parity_harness._fixture").joinpath("manifest.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator, validators

    def strict_int(_checker: object, instance: object) -> bool:
        return type(instance) is int  # not bool, not 1.0

    def strict_number(_checker: object, instance: object) -> bool:
        return type(instance) in (int, float)  # not bool

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": strict_int, "number": strict_number})
    cls = validators.extend(Draft202012Validator, type_checker=checker)
    return cls(manifest_schema())


def field_path(parts: Iterable[object]) -> str:
    """`config.n_ctx`, `cases[0].tokens[2]`, `tolerances.fp32.overrides["blocks.0.hook_q"]`."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and p.isidentifier():
            out += f".{p}" if out else p
        else:
            out += f"[{json.dumps(p)}]"
    return out or "(the manifest)"


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(error: Any) -> str:
    kw, expected = error.validator, error.validator_value
    if kw == "type":
        return f"must be of type {expected}" if isinstance(expected, str) else f"must be one of types {expected}"
    if kw in ("const", "enum"):
        if kw == "const":
            return f"must be {_show(expected)}"
        return "must be one of " + ", ".join(_show(v) for v in expected)
    if kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[kw]
        return f"must be {sign} {expected}"
    if kw in ("minItems", "minProperties"):
        return "must not be empty" if expected == 1 else f"needs at least {expected} entries"
    if kw in ("minLength", "maxLength"):
        return f"length must be {'>=' if kw == 'minLength' else '<='} {expected}"
    if kw == "pattern":
        return "must be a plain name (no '/' or '\\', not '.' or '..')" if "/" in expected else f"must match {expected}"
    return str(error.message).splitlines()[0]


def describe(error: Any) -> str:
    """One line for a jsonschema ValidationError, naming the field."""
    where = field_path(error.absolute_path)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"{where}: missing key {', '.join(repr(k) for k in missing)}"
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return f"{where}: unknown key {', '.join(repr(k) for k in extra)}"
    if error.validator == "propertyNames":
        return f"{where}: key {_show(error.instance)} is not a plain file name"
    if error.validator == "anyOf":
        return f"{where}: {_show(error.instance)} must be a positive integer or \"T\""
    return f"{where}: {_show(error.instance)} {_reason(error)}"


def validate_manifest(manifest: object) -> str | None:
    """The first schema violation as one line naming the field, or None when the manifest conforms."""
    try:
        errors = sorted(_validator().iter_errors(manifest), key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        return "nested too deeply to validate"
    if not errors:
        return None
    # The shallowest error first: a missing or mistyped object explains the errors below it.
    errors.sort(key=lambda e: len(e.absolute_path))
    return describe(errors[0])


def canonical_json(manifest: dict[str, Any]) -> bytes:
    """The manifest without its seal, as sorted, compact, ASCII JSON: what the seal hashes."""
    body = {k: v for k, v in manifest.items() if k != SEAL_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The seal: sha256 (hex) of `canonical_json(manifest)`."""
    return hashlib.sha256(canonical_json(manifest)).hexdigest()


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        merged = {**manifest_schema()["$defs"][ref.removeprefix("#/$defs/")], **node}
        merged.pop("$ref")
        return merged
    return node


def _constraint(node: dict[str, Any]) -> str:
    """'integer, 1 to 65536', 'number >= 0', 'one of "sinusoidal", "learned"', ..."""
    parts: list[str] = []
    if "const" in node:
        parts.append(f"always {json.dumps(node['const'])}")
    elif "enum" in node:
        parts.append("one of " + ", ".join(json.dumps(v) for v in node["enum"]))
    kind = node.get("type")
    if kind and "const" not in node:
        parts.append(str(kind))
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is not None and hi is not None:
        parts[-1:] = [f"{parts[-1]}, {lo} to {hi}" if parts else f"{lo} to {hi}"]
    elif lo is not None:
        parts.append(f">= {lo}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {node['exclusiveMinimum']}" + (f", <= {hi}" if hi is not None else ""))
    if node.get("minItems"):
        parts.append("not empty")
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    return ", ".join(parts)


def schema_markdown() -> str:
    """The field reference of docs/fixture-format.md, generated from the schema (a test keeps them equal)."""
    rows: list[tuple[str, str, str]] = []

    def walk(node: dict[str, Any], path: str, required: bool) -> None:
        node = _resolve(node)
        desc = str(node.get("description", ""))
        req = "" if required else " (optional)"
        rows.append((path, _constraint(node) + req, desc))
        props = node.get("properties", {})
        needed = set(node.get("required", []))
        if path.startswith("tolerances.") and path.count(".") == 1:
            return  # the two tiers share one definition, listed once under tolerances.<tier>
        for key, child in props.items():
            walk(child, f"{path}.{key}" if path else key, key in needed)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            walk(extra, f"{path}.<key>", True)
        items = node.get("items")
        if isinstance(items, dict) and "properties" in _resolve(items):
            walk(items, f"{path}[]", True)

    schema = manifest_schema()
    for key, child in schema["properties"].items():
        walk(child, key, key in schema["required"])
        if key == "config":  # one config per family, chosen by "family" (the schema's allOf)
            for family in family_names():
                config = _resolve({"$ref": f"#/$defs/{family}_config"})
                for name, field in config["properties"].items():
                    before = len(rows)
                    walk(field, f"config.{name}", name in config["required"])
                    path, constraint, desc = rows[before]
                    rows[before] = (f"{path} ({family})", constraint, desc)
    tier = _resolve({"$ref": "#/$defs/tier"})
    for key, child in tier["properties"].items():
        walk(child, f"tolerances.<tier>.{key}", key in tier["required"])
    lines = ["| field | type and range | what it is |", "|---|---|---|"]
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines += [f"| `{p}` | {cell(c)} | {cell(d)} |" for p, c, d in rows]
    return "\n".join(lines)
