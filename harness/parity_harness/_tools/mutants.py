"""The mutant catalog: realistic porting bugs, each a small exact-string patch of an implementation.

Each model family lists its own mutants in the module its table names for the role "mutants"
(parity_reference/families/*.json: `parity_harness._tools.gpt2_mutants`, `parity_harness._tools.llama_mutants`);
this module holds what they share (`Mutant`, the anchor and comment rules) and assembles `CATALOG` from every family's
`MUTANTS`: the toy's family (GPT-2) first, then the others in table order. A family's mutants module names `MUTANTS`,
`TITLE` (how the selftest names the family: "Llama") and `FIXTURE` (the committed fixture its own mutants are caught
on, the toy's sibling directory: "toy-llama"); a new family adds its module, and no line here.

A mutant patches a temporary copy of one file: `ts_model/model/model.ts` (target "typescript", run by
the typescript backend through `PARITY_TS_DIR`), the family's torch reference (`parity_reference/model.py`,
`llama_model.py`: target "reference", loaded as a module and run like the pytorch backend in float32 and float64),
or its NumPy reference (`llama_numpy.py`: target "numpy", loaded as a module and run by the numpy backend's own code
in float32 and float64). Each patch is an
(anchor, replacement) pair whose anchor must occur exactly once in the file, and in its code: a
missing or repeated anchor, or one that touches a comment (or a Python docstring), raises
`MutantAnchorError`, so the catalog cannot rot silently when the models change, nor patch a comment
that can change while the code stays the same.

For every mutant the catalog states the first tap (dataflow order, docs/spec.md, section 2) where
it should show (for a decoding mutant: the first decoding step and its first decoding tap), and
whether only the fp64 tier (float64 result vs the float64 golden at ~1e-12)
should catch it: such a bug stays under the fp32 tolerance (1e-5) in every fp32-tolerance
comparison. `parity_harness._tools.selftest` runs them all and checks both claims against the fixture.

It also states which fixture catches it (`caught_on`): "toy" for the porting bugs the toy
catches, "stress" for the numerical-stability bugs (a softmax without the max, a one-pass
variance, an additive mask, an erf series that overflows) that compute the toy's numbers exactly
and break only on the stress fixture's extreme magnitudes (parity_harness/_authoring/stress.py): the selftest checks
that each is invisible on the toy, in every tier, and caught on the stress fixture at its tap.
"probe" marks the reduced-precision bugs (`REDUCED`): a half fast path (`if x.dtype in (float16,
bfloat16)`, as real code has) that accumulates in fp16 or computes in bf16, so its fp32 and fp64 runs
compute the unpatched numbers; the selftest runs each in its `precision` (fp16) on the probe fixture
(`parity export --preset fp16-probe`, where the bug matters), where it must be caught at its tap, and
in fp32 and fp64 there, where every comparison must pass. The fp16 KV cache of an fp32 model changes
decoding only: a decoding mutant of the toy, caught by the fp32 and fp64 decoding check.
"fp16-stress" marks the same kind on the fp16-stress fixture (`parity export --preset fp16-stress`,
parity_harness/_authoring/fp16_stress.py), run the same way there: each caught in its `precision` (fp16 or bf16) at its
tap, as overflow or accumulation in that precision, and passing every fp32 and fp64 comparison of the same code.

"family" marks a porting bug of another family than the toy's (`family`: the Llama family's, "llama-...", in
llama_model.py and its NumPy twins "llama-np-..." in llama_numpy.py): the selftest runs it on its family's own toy
fixture (the family module's `FIXTURE`, fixtures/toy-llama) in float32 and float64, where it must be caught at its
tap with a likely cause that names it (parity_harness/_compare/diagnose.py, the family's `causes` module).

"grad" and "grad-stress" mark the backward mutants (`backward_mutants`, parity_harness/_tools/grad_mutants.py):
patches of the hand-written NumPy backward (parity_reference/numpy_backward.py, target "numpy") that the gradient
check (`parity run --grad`) must catch at their gradient or training step, with a cause named from the numbers, on
the toy ("grad") or on toy-stress ("grad-stress"), while the forward checks alone pass. They are not in `CATALOG`
(whose numbers they leave as they were); `by_name` selects from both.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import parity_reference
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import Precision
from parity_harness._core.resources import ts_model_dir
from parity_reference.families import family_names, load_family

Target = Literal["typescript", "reference", "numpy"]  # who runs the patched copy: typescript, pytorch's or numpy's code
# The fixture that must catch the mutant: "family" is its family's own toy fixture (its mutants module's FIXTURE);
# "grad" / "grad-stress": a backward mutant (_tools/grad_mutants.py), judged by the gradient check on toy / toy-stress
CaughtOn = Literal["toy", "stress", "probe", "fp16-stress", "family", "grad", "grad-stress"]
TOY_FAMILY = "gpt2"  # the family of the toy, toy-stress and fp16-probe fixtures: its mutants come first

_REFERENCE_DIR = Path(parity_reference.__file__).parent
TARGET_DIRS: dict[Target, Path] = {"typescript": ts_model_dir(), "reference": _REFERENCE_DIR, "numpy": _REFERENCE_DIR}


class MutantAnchorError(ParityError):
    """A mutant's anchor text is missing from (or repeated in) the file it patches: fix the catalog."""


@dataclass(frozen=True)
class Mutant:
    """One porting bug: where it goes, how it is made, and where and by which tier it should be caught."""

    name: str  # "ts-..." patches ts_model/, "py-..." reference/model.py, "llama-..." the Llama references
    target: Target
    file: str  # the patched file, relative to the target's directory
    patches: tuple[tuple[str, str], ...]  # (anchor, replacement): each anchor must match exactly once
    description: str  # one line: the bug
    expected_tap: str  # the first tap, in dataflow order, where it must show
    fp64_only: bool  # True: under 1e-5 everywhere, only the fp64 tier (1e-12) can see it
    # A decoding mutant (the forward pass is untouched): the first decoding step where it must show
    # (0 is the prefill), and `expected_tap` is a decoding tap (blocks.{i}.attn.cache_k|cache_v, logits).
    expected_step: int | None = None
    caught_on: CaughtOn = "toy"  # "stress": a stability bug, invisible on the toy, caught on the stress fixture
    # "probe": a reduced-precision bug, caught in `precision` on the probe fixture, invisible there in fp32 and fp64
    # "family": caught on its family's own toy fixture (the family's mutants module's FIXTURE)
    precision: Precision | None = None
    family: str = TOY_FAMILY  # the model family whose implementation it patches (its table lists its module)

    def apply(self, text: str) -> str:
        """The patched text; MutantAnchorError if an anchor is not found exactly once."""
        for anchor, replacement in self.patches:
            count = text.count(anchor)
            if count != 1:
                where = "not found" if count == 0 else f"found {count} times"
                raise MutantAnchorError(
                    f"mutant {self.name!r}: anchor {anchor.strip()[:70]!r} {where} in {self.target}/{self.file} "
                    "(expected exactly once): update parity_harness/_tools/mutants.py to the current source"
                )
            at = text.index(anchor)
            if any(start < at + len(anchor) and at < end for start, end in comment_spans(text, self.target)):
                raise MutantAnchorError(
                    f"mutant {self.name!r}: anchor {anchor.strip()[:70]!r} touches a comment in "
                    f"{self.target}/{self.file}: anchor on code only (a comment can change while the code does not)"
                )
            text = text.replace(anchor, replacement)
        return text

    def patch_file(self, root: Path) -> None:
        """Patch `root / self.file` in place (root is a temporary copy of the target directory)."""
        path = root / self.file
        path.write_text(self.apply(path.read_text(encoding="utf-8")), encoding="utf-8")


def comment_spans(text: str, target: Target) -> list[tuple[int, int]]:
    """[start, end) offsets of the comments of a source text (TypeScript, or Python with its docstrings)."""
    return _ts_comment_spans(text) if target == "typescript" else _python_comment_spans(text)


def _python_comment_spans(text: str) -> list[tuple[int, int]]:
    """Comments (tokenize) and docstrings (ast); MutantAnchorError if the text is not Python."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int) -> int:
        return starts[row - 1] + col

    def ast_offset(row: int, byte_col: int) -> int:  # ast counts UTF-8 bytes into the line, tokenize characters
        line = text[starts[row - 1]:starts[row]]
        return offset(row, len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore")))

    try:
        spans = [(offset(*tok.start), offset(*tok.end)) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                 if tok.type == tokenize.COMMENT]
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError) as exc:
        raise MutantAnchorError(f"the patched reference source is not Python ({exc})") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                    and first.end_lineno is not None and first.end_col_offset is not None):
                spans.append((ast_offset(first.lineno, first.col_offset),
                              ast_offset(first.end_lineno, first.end_col_offset)))
    return spans


_TS_REGEX_AFTER = set("(,=:[!&|?{};+-*%<>~^") | {""}  # a `/` after one of these starts a regular expression


def _ts_comment_spans(text: str) -> list[tuple[int, int]]:
    """`//` and `/* */` comments, skipping strings, template literals (with `${}`) and regular expressions."""
    spans: list[tuple[int, int]] = []
    braces: list[int] = []  # for each open `${` of a template literal: the depth of `{` inside it
    i, n, prev = 0, len(text), ""
    while i < n:
        c, nxt = text[i], text[i + 1:i + 2]
        if c == "/" and nxt == "/":
            end = text.find("\n", i)
            end = n if end < 0 else end
            spans.append((i, end))
            i = end
            continue
        if c == "/" and nxt == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            spans.append((i, end))
            i = end
            continue
        if c in "'\"" or (c == "/" and prev in _TS_REGEX_AFTER) or (c == "}" and braces and braces[-1] == 0):
            if c == "}":
                braces.pop()
                c = "`"  # back inside the template literal
            i = _ts_skip_literal(text, i + 1, c, braces)
            prev = "x"
            continue
        if c == "`":
            i = _ts_skip_literal(text, i + 1, c, braces)
            prev = "x"
            continue
        if braces and c == "{":
            braces[-1] += 1
        elif braces and c == "}":
            braces[-1] -= 1
        if not c.isspace():
            prev = c
        i += 1
    return spans


def _ts_skip_literal(text: str, i: int, quote: str, braces: list[int]) -> int:
    """The offset after a string, regular expression or template literal (or its next `${`) opened before i."""
    in_class = False  # inside [...] of a regular expression, where `/` does not end it
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if quote == "`" and text.startswith("${", i):
            braces.append(0)
            return i + 2
        if quote == "/" and c in "[]":
            in_class = c == "["
        elif c == quote and not in_class:
            return i + 1
        elif c == "\n" and quote != "`":
            return i  # an unterminated string or a division: stop at the end of the line
        i += 1
    return i


@dataclass(frozen=True)
class FamilyMutants:
    """One family's mutants, read from the module its table names for the role "mutants"."""

    family: str
    title: str  # how the selftest names them: "Llama" ("Llama mutants caught at their tap ...")
    fixture: str  # the committed fixture its "family" mutants are caught on, the toy's sibling directory
    mutants: tuple[Mutant, ...]


@cache
def family_mutants(family: str) -> FamilyMutants:
    """The family's mutants module (`code.mutants` in its table), checked: ParityError if it lists another's."""
    module = load_family(family).module("mutants")
    title, fixture, mutants = (getattr(module, key, None) for key in ("TITLE", "FIXTURE", "MUTANTS"))
    if not (isinstance(title, str) and isinstance(fixture, str) and isinstance(mutants, tuple)
            and all(isinstance(m, Mutant) for m in mutants)):
        raise ParityError(f"{module.__name__}: a family's mutants module names TITLE and FIXTURE (strings) and "
                          "MUTANTS (a tuple of Mutant)")
    stray = [m.name for m in mutants if m.family != family]
    if stray:
        raise ParityError(f"{module.__name__}: mutant {stray[0]!r} is not of the {family} family")
    return FamilyMutants(family, title, fixture, mutants)


def catalog_families() -> list[str]:
    """Every family, in catalog order: the toy's first, then the others in table order."""
    return sorted(family_names(), key=lambda name: name != TOY_FAMILY)


def _catalog() -> tuple[Mutant, ...]:
    """`CATALOG`: every family's mutants, assembled when first asked for (each family's module imports this one)."""
    found = globals().get("CATALOG")
    if found is None:
        found = tuple(m for family in catalog_families() for m in family_mutants(family).mutants)
        globals()["CATALOG"] = found
    return tuple(found)


CATALOG: tuple[Mutant, ...]  # every family's mutants in catalog order: bound by `_catalog` on first use


def __getattr__(name: str) -> object:  # `CATALOG`, made on first use (PEP 562)
    if name == "CATALOG":
        return _catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backward_mutants() -> tuple[Mutant, ...]:
    """The backward mutants (parity_harness/_tools/grad_mutants.py), kept apart from `CATALOG`: the gradient check
    judges them, the selftest reports them in their own section. Read by name, as each family's mutants are (its
    table's `code.mutants`): that module builds on this one's `Mutant`."""
    import importlib

    mutants: tuple[Mutant, ...] = importlib.import_module("parity_harness._tools.grad_mutants").MUTANTS
    return mutants


def by_name(names: list[str] | None) -> list[Mutant]:
    """The catalog then the backward mutants, or the named ones in that order; ParityError (exit 2) for an unknown
    name."""
    catalog = (*_catalog(), *backward_mutants())
    if names is None:
        return list(catalog)
    known = {m.name for m in catalog}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParityError(f"unknown mutant {unknown[0]!r} (known: {', '.join(m.name for m in catalog)})")
    return [m for m in catalog if m.name in names]
