"""The manifest's schema: the committed fixture conforms, every field error is one line naming the field,
and docs/fixture-format.md's field reference is the one generated from the schema."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from parity_harness._fixture.schema import manifest_digest, manifest_schema, schema_markdown, validate_manifest
from tests.conftest import REPO

DOC = REPO / "docs" / "fixture-format.md"


@pytest.fixture(scope="module")
def manifest(toy_dir: Path) -> dict[str, Any]:
    return json.loads((toy_dir / "manifest.json").read_text())  # type: ignore[no-any-return]


def test_the_committed_fixture_conforms_and_is_sealed(manifest: dict[str, Any]) -> None:
    assert validate_manifest(manifest) is None
    assert manifest["manifest_sha256"] == manifest_digest(manifest)


def test_the_schema_ships_with_the_package() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert "manifest.schema.json" in pyproject and '"jsonschema' in pyproject
    assert manifest_schema()["$schema"].endswith("2020-12/schema")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("config", "n_ctx"), "16", 'config.n_ctx: "16" must be of type integer'),
        (("config", "n_head"), 2.0, "config.n_head: 2.0 must be of type integer"),
        (("config", "causal"), 0, "config.causal: 0 must be of type boolean"),
        (("config", "positions"), "rotary", 'config.positions: "rotary" must be one of "sinusoidal", "learned"'),
        (("format_version",), True, "format_version: true must be of type integer"),
        (("cases", 0, "tokens", 1), True, "cases[0].tokens[1]: true must be of type integer"),
        (("tolerances", "fp32", "rtol"), None, "tolerances.fp32.rtol: null must be of type number"),
        (("taps", 3, "shape"), "T", 'taps[3].shape: "T" must be of type array'),
        (("vocab",), [], "vocab: [] must not be empty"),
    ],
)
def test_each_field_error_is_one_line_naming_the_field(
    manifest: dict[str, Any], path: tuple[Any, ...], value: object, message: str
) -> None:
    broken = copy.deepcopy(manifest)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert validate_manifest(broken) == message


def test_the_docs_field_reference_is_generated_from_the_schema() -> None:
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- generated from harness/parity_harness/_fixture/manifest.schema.json: begin -->\n(.*)\n"
                      r"<!-- generated from harness/parity_harness/_fixture/manifest.schema.json: end -->", text, re.S)
    assert block is not None, "the generated block is missing from docs/fixture-format.md"
    assert block.group(1) == schema_markdown(), "regenerate it: see docs/fixture-format.md, 'The schema'"
    for key in manifest_schema()["required"]:
        assert f'"{key}"' in text, key  # the example manifest shows every required key
