"""The mutant catalog: realistic porting bugs, each a small exact-string patch of an implementation.

A mutant patches a temporary copy of one file: `ts_model/model/model.ts` (target "typescript", run by
the typescript backend through `PARITY_TS_DIR`), `parity_reference/model.py` or `llama_model.py` (target
"reference", loaded as a module and run like the pytorch backend in float32 and float64), or
`parity_reference/llama_numpy.py` (target "numpy", loaded as a module and run by the numpy backend's own code in
float32 and float64). Each patch is an
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

"llama" marks the Llama family's porting bugs (`LLAMA`, "llama-..."): patches of
`parity_reference/llama_model.py`, run on the Llama toy fixture (fixtures/toy-llama) in float32 and float64,
each caught at its tap with a likely cause that names it (parity_harness/_compare/diagnose.py). The NumPy Llama,
`parity_reference/llama_numpy.py`, is a second implementation a port can get wrong the same way: each bug has a
twin there (`LLAMA_NUMPY`, "llama-np-..."), made from its torch twin (the same description, tap and fixture, the
NumPy spelling of the patch), which must be caught at the same tap with the same likely cause.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import parity_reference
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import Precision
from parity_harness._core.resources import ts_model_dir

Target = Literal["typescript", "reference", "numpy"]  # who runs the patched copy: typescript, pytorch's or numpy's code
CaughtOn = Literal["toy", "stress", "probe", "llama"]  # the fixture that must catch the mutant

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
    precision: Precision | None = None

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


def _ts(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str, fp64_only: bool = False,
        step: int | None = None, caught_on: CaughtOn = "toy") -> Mutant:
    return Mutant(name, "typescript", "model/model.ts", patches, description, tap, fp64_only, step, caught_on)


def _py(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str, fp64_only: bool = False,
        step: int | None = None, caught_on: CaughtOn = "toy", precision: Precision | None = None) -> Mutant:
    return Mutant(name, "reference", "model.py", patches, description, tap, fp64_only, step, caught_on, precision)


def _llama(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str) -> Mutant:
    return Mutant(name, "reference", "llama_model.py", patches, description, tap, False, None, "llama")


def _llama_numpy(twin: Mutant, patches: tuple[tuple[str, str], ...], description: str | None = None) -> Mutant:
    """The same bug in parity_reference/llama_numpy.py: the torch twin's tap, fixture and (unless given) description."""
    name = twin.name.replace("llama-", "llama-np-", 1)
    return Mutant(name, "numpy", "llama_numpy.py", patches, description or twin.description, twin.expected_tap,
                  twin.fp64_only, twin.expected_step, twin.caught_on)


_TS_MASK = "scores.data[(h * T + i) * T + j] = config.causal && j > i ? -Infinity : dot / rootDh;"
_TS_GELU = "out.data[i] = 0.5 * v * (1.0 + erf(v / Math.SQRT2));"
_TS_ANGLE = "const angle = pos * invFreq[i];"
# The erf polynomial ports often use (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7), written once:
# erf(a) ~ 1 - poly(t) * exp(-a^2) with t = 1 / (1 + P * a); the same text is TypeScript and Python.
_AS_P = "0.3275911"
_AS_POLY = "((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t"
_TS_IMPORTS = 'import { erf } from "./erf.ts";'  # where a mutant adds a function (declarations are hoisted)
_TS_ERF_AS = f'''{_TS_IMPORTS}

/** Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 (the mutant's erf). */
function erfAS(x: number): number {{
  const a = Math.abs(x);
  const t = 1 / (1 + {_AS_P} * a);
  const poly = {_AS_POLY};
  return Math.sign(x) * (1 - poly * Math.exp(-a * a));
}}'''
_PY_ERF_AS = f'''    u = (x / math.sqrt(2.0)).abs()  # Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7
    t = 1.0 / (1.0 + {_AS_P} * u)
    poly = {_AS_POLY}
    return 0.5 * x * (1.0 + torch.sign(x) * (1.0 - poly * torch.exp(-u * u)))'''
_PY_UNTIED = '''def _untied_lm_head(wte: Tensor) -> Tensor:
    """A separate output layer, freshly initialized because the checkpoint has no lm_head.weight."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(wte.shape, generator=gen, dtype=torch.float64) * 0.02).to(wte.dtype)


def unembed('''

# -- the stability bugs: exact on the toy, broken by the stress fixture's magnitudes ----------------
_TS_SOFTMAX_EXP = "const e = Math.exp(x.data[row + j] - max);"
_TS_PATTERN = "const pattern = softmax(scores);"
_TS_ADDITIVE_MASK = """// An additive mask inside the softmax: masked cells get dot / rootDh - 1e4 (the tap keeps -inf).
  const maskedScores: Tensor = { shape: scores.shape, data: scores.data.slice() }; // (H, T, T)
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let j = i + 1; config.causal && j < T; j++) {
        let dot = 0;
        for (let e = 0; e < dh; e++) dot += q.data[(i * H + h) * dh + e] * k.data[(j * H + h) * dh + e];
        maskedScores.data[(h * T + i) * T + j] = dot / rootDh - 1e4;
      }
    }
  }
  const pattern = softmax(maskedScores);"""
_TS_ERF_SERIES = _TS_IMPORTS + """

/** erf by its series of positive terms, Abramowitz & Stegun 7.1.6 (the mutant's erf):
 *  erf z = 2/sqrt(pi) e^{-z^2} sum_n 2^n z^{2n+1} / (1 3 5 ... (2n+1)); the sum overflows past z^2 = 709.8. */
function erfSeries(z: number): number {
  let term = z;
  let sum = z;
  for (let n = 1; Math.abs(term) > 1e-17 * Math.abs(sum); n++) {
    term *= (2 * z * z) / (2 * n + 1);
    sum += term;
  }
  return (2 / Math.sqrt(Math.PI)) * Math.exp(-z * z) * sum;
}"""
_PY_PATTERN = "pattern = torch.softmax(scores, dim=-1)"
_PY_LN_VAR = "var = (centered * centered).mean(dim=-1, keepdim=True)"
_PY_ERF_SERIES = """    z = (x / math.sqrt(2.0)).double()  # erf by its series of positive terms (A&S 7.1.6), in float64
    term, total, n = z, z, 0
    while bool((term.abs() > 1e-17 * total.abs()).any()):  # inf and NaN compare false: the loop ends
        n += 1
        term = term * (2.0 * z * z) / (2 * n + 1)
        total = total + term
    return 0.5 * x * (1.0 + (2.0 / math.sqrt(math.pi) * torch.exp(-z * z) * total).to(x.dtype))"""

STABILITY: tuple[Mutant, ...] = (
    _ts("ts-softmax-no-max", ((_TS_SOFTMAX_EXP, "const e = Math.exp(x.data[row + j]);"),),
        "softmax without subtracting the row max: exp overflows past 709.8 (inf / inf = NaN)",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _ts("ts-ln-one-pass-variance", (
        ("sq += centered[j] * centered[j];", "sq += x.data[t * d + j] * x.data[t * d + j];"),
        ("const s = Math.sqrt(sq / d + eps);", "const s = Math.sqrt(sq / d - mean * mean + eps);"),
    ), "LayerNorm variance as E[x^2] - E[x]^2: cancellation when |mean| >> std", "blocks.0.ln1.hook_scale",
        fp64_only=True, caught_on="stress"),
    _ts("ts-additive-mask", ((_TS_PATTERN, _TS_ADDITIVE_MASK),),
        "causal mask added as -1e4 inside the softmax (the scores tap keeps -inf): leaks past a 1e4 score gap",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _ts("ts-erf-series", (
        (_TS_IMPORTS, _TS_ERF_SERIES),
        (_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + erfSeries(v / Math.SQRT2));"),
    ), "erf by the positive series A&S 7.1.6: exact to 1e-14, then inf * 0 = NaN for |x| > 37.7",
        "blocks.0.mlp.hook_post", caught_on="stress"),
    _py("py-softmax-no-max", ((_PY_PATTERN, "pattern = torch.exp(scores) / torch.exp(scores).sum(dim=-1, "
                                            "keepdim=True)"),),
        "softmax without subtracting the row max: exp overflows past 88.7 in float32, 709.8 in float64",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _py("py-ln-one-pass-variance", ((_PY_LN_VAR, "var = (x * x).mean(dim=-1, keepdim=True) - mean * mean"),),
        "LayerNorm variance as E[x^2] - E[x]^2: cancellation when |mean| >> std", "blocks.0.ln1.hook_scale",
        caught_on="stress"),
    _py("py-additive-mask", ((_PY_PATTERN, "pattern = torch.softmax(torch.where(future, (qh @ kh.transpose(-2, -1)) "
                                           "/ math.sqrt(dh) - 1e4, scores), dim=-1)"),),
        "causal mask added as -1e4 inside the softmax (the scores tap keeps -inf): leaks past a 1e4 score gap",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _py("py-erf-series", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_ERF_SERIES),),
        "erf by the positive series A&S 7.1.6 (in float64): exact to 1e-14, then inf * 0 = NaN for |x| > 37.7",
        "blocks.0.mlp.hook_post", caught_on="stress"),
)

# -- reduced precision: a half fast path, caught in fp16 on the probe fixture, invisible in fp32 and fp64 --------
_PY_HALF = "(torch.float16, torch.bfloat16)"
_PY_SOFTMAX_FP16_SUM = f'''def _softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis; half dtypes: exp(x - max) summed by a running accumulator in the dtype."""
    if x.dtype not in {_PY_HALF}:
        return torch.softmax(x, dim=-1)
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))  # (..., n)
    total = torch.zeros_like(e[..., :1])  # (..., 1)
    for j in range(e.shape[-1]):
        total = total + e[..., j : j + 1]  # each add rounded: a fp16 sum stagnates at 2048
    return e / total


def gelu('''
_PY_LN_VAR_FP16_SUM = f"""if x.dtype in {_PY_HALF}:  # the half fast path: a running sum in the dtype
        sq = centered * centered  # (T, d)
        total = torch.zeros_like(sq[..., :1])  # (T, 1)
        for j in range(sq.shape[-1]):
            total = total + sq[..., j : j + 1]  # (T, 1): 40000 + 40000 is inf in fp16
        var = total / sq.shape[-1]  # (T, 1)
    else:
        var = (centered * centered).mean(dim=-1, keepdim=True)"""
_PY_GELU_BF16 = """    if x.dtype == torch.float16:  # the half fast path: the bf16 kernel
        xb = x.to(torch.bfloat16)
        return (0.5 * xb * (1.0 + torch.erf(xb / math.sqrt(2.0)))).to(torch.float16)
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))"""
_PY_KV_FP16 = '''def _stored_fp16(t: Tensor) -> Tensor:
    """A tensor through a float16 cache buffer: written in fp16, read back in t's dtype."""
    return t.to(torch.float16).to(t.dtype)


def prefill('''
_PY_PREFILL_K = 'taps[f"blocks.{i}.attn.hook_k"].transpose(-3, -2), taps[f"blocks.{i}.attn.hook_v"].transpose(-3, -2)'

REDUCED: tuple[Mutant, ...] = (
    _py("py-rp-softmax-fp16-sum", (
        ("def gelu(", _PY_SOFTMAX_FP16_SUM),
        ("pattern = torch.softmax(scores, dim=-1)", "pattern = _softmax(scores)"),
        ('taps["probs"] = torch.softmax(logits[..., last, :], dim=-1)',
         'taps["probs"] = _softmax(logits[..., last, :])'),
        ('taps[f"logit_lens.{k}"] = torch.softmax(lens[..., k * rows:(k + 1) * rows, :], dim=-1)',
         'taps[f"logit_lens.{k}"] = _softmax(lens[..., k * rows:(k + 1) * rows, :])'),
    ), "softmax accumulated in fp16 (a running half sum of exp(x - max)): stagnates at 2048, off ~2x over "
       "4,096 flat logits", "probs", caught_on="probe", precision="fp16"),
    _py("py-rp-ln-var-fp16-sum", ((_PY_LN_VAR, _PY_LN_VAR_FP16_SUM),),
        "LayerNorm variance accumulated in fp16 (a running half sum of the centered squares): two squares of "
        "40,000 overflow", "blocks.0.ln1.hook_scale", caught_on="probe", precision="fp16"),
    _py("py-rp-gelu-bf16", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_GELU_BF16),),
        "GELU computed in bf16 in an fp16 run (input and output rounded to bf16): under the tolerance, on "
        "bf16's grid", "blocks.0.mlp.hook_post", caught_on="probe", precision="fp16"),
    _py("py-rp-kv-cache-fp16", (
        ("def prefill(", _PY_KV_FP16),
        (_PY_PREFILL_K, '_stored_fp16(taps[f"blocks.{i}.attn.hook_k"].transpose(-3, -2)), '
                        '_stored_fp16(taps[f"blocks.{i}.attn.hook_v"].transpose(-3, -2))'),
        ("keys = torch.cat([cache_k, k.reshape(1, H, dh).transpose(0, 1)], dim=-2)",
         "keys = torch.cat([cache_k, _stored_fp16(k.reshape(1, H, dh).transpose(0, 1))], dim=-2)"),
        ("values = torch.cat([cache_v, v.reshape(1, H, dh).transpose(0, 1)], dim=-2)",
         "values = torch.cat([cache_v, _stored_fp16(v.reshape(1, H, dh).transpose(0, 1))], dim=-2)"),
    ), "KV cache stored in fp16 while the model computes in fp32 (written in fp16, read back): decoding only",
        "blocks.0.attn.cache_k", step=0),
)

# -- the Llama family: patches of parity_reference/llama_model.py, caught on fixtures/toy-llama ---------------------
_LLAMA_SCALE = "scale = torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)"
_LLAMA_PRE = 'pre = x @ params[prefix + "gate_proj.weight"].T'
_LLAMA_PRE_LINEAR = 'pre_linear = x @ params[prefix + "up_proj.weight"].T'
LLAMA: tuple[Mutant, ...] = (
    _llama("llama-rope-pairing", (('if pairing == "half":', 'if pairing != "half":'),),
           "RoPE pairs the other columns: interleaved (2j, 2j+1) for half (j, j + d_head/2), or the reverse",
           "blocks.0.attn.hook_rot_q"),
    _llama("llama-rope-base", (("torch.tensor(base, dtype=torch.float64)",
                                "torch.tensor(500000.0 if base == 10000.0 else 10000.0, dtype=torch.float64)"),),
           "the RoPE base of the other Llama generation (Llama 2's 1e4 for Llama 3's 5e5, or the reverse)",
           "blocks.0.attn.hook_rot_q"),
    _llama("llama-gqa-repeat", (("return kv.repeat_interleave(n_rep, dim=-3)", "return kv.repeat(n_rep, 1, 1)"),),
           "grouped-query kv heads expanded with `repeat` (head h reads kv h % n_kv) instead of `repeat_interleave`",
           "blocks.0.attn.hook_attn_scores"),
    _llama("llama-swiglu-swapped", ((_LLAMA_PRE, _LLAMA_PRE.replace("gate_proj", "up_proj")),
                                    (_LLAMA_PRE_LINEAR, _LLAMA_PRE_LINEAR.replace("up_proj", "gate_proj"))),
           "SwiGLU's gate and up projections swapped: silu(up(x)) * gate(x)",
           "blocks.0.mlp.hook_pre"),
    _llama("llama-rms-eps", ((_LLAMA_SCALE, _LLAMA_SCALE.replace("+ eps)", "+ (1e-6 if eps != 1e-6 else 1e-5))")),),
           "RMSNorm eps from the other checkpoint (1e-6 for 1e-5, or the reverse)",
           "blocks.0.ln1.hook_scale"),
    _llama("llama-rms-one-plus-w", (("return normalized * weight", "return normalized * (1.0 + weight)"),),
           "RMSNorm's gain applied as (1 + w), Gemma's convention, to Llama's w",
           "blocks.0.attn.hook_q"),
)

# -- the same six bugs in the NumPy Llama (parity_reference/llama_numpy.py), run like the numpy backend ---------------
_RMS_EPS_NP = "+ x.dtype.type(eps))"
_TWIN = {m.name: m for m in LLAMA}
LLAMA_NUMPY: tuple[Mutant, ...] = (
    _llama_numpy(_TWIN["llama-rope-pairing"], (('if pairing == "half":', 'if pairing != "half":'),)),
    _llama_numpy(_TWIN["llama-rope-base"], (("np.float64(base)",
                                             "np.float64(500000.0 if base == 10000.0 else 10000.0)"),)),
    _llama_numpy(_TWIN["llama-gqa-repeat"], (("return np.repeat(kv, n_rep, axis=-3)",
                                              "return np.tile(kv, (n_rep, 1, 1))"),),
                 "grouped-query kv heads expanded with `np.tile` (head h reads kv h % n_kv) instead of `np.repeat` "
                 "(torch's `repeat` for `repeat_interleave`)"),
    _llama_numpy(_TWIN["llama-swiglu-swapped"], _TWIN["llama-swiglu-swapped"].patches),  # the same text in both
    _llama_numpy(_TWIN["llama-rms-eps"], ((_RMS_EPS_NP, _RMS_EPS_NP.replace("(eps)",
                                                                           "(1e-6 if eps != 1e-6 else 1e-5)")),)),
    _llama_numpy(_TWIN["llama-rms-one-plus-w"], (("normalized * weight", "normalized * (1.0 + weight)"),)),
)

CATALOG: tuple[Mutant, ...] = (
    # -- TypeScript port (float64 only: the fp64 tier and the fp64-vs-fp32 comparison) ------------
    _ts("ts-no-causal-mask", ((_TS_MASK, "scores.data[(h * T + i) * T + j] = dot / rootDh;"),),
        "no causal mask: every query sees future keys", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-mask-off-by-one", (("config.causal && j > i ?", "config.causal && j > i + 1 ?"),),
        "mask off by one: query i also sees key i+1", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-scale-sqrt-d-model", (("const rootDh = Math.sqrt(dh);", "const rootDh = Math.sqrt(d);"),),
        "scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-qk-swapped", (("dot += q.data[(i * H + h) * dh + e] * k.data[(j * H + h) * dh + e];",
                           "dot += k.data[(i * H + h) * dh + e] * q.data[(j * H + h) * dh + e];"),),
        "q and k swapped in the scores (k_i . q_j: the transpose; invisible for T = 1)",
        "blocks.0.attn.hook_attn_scores"),
    _ts("ts-heads-wrong-order", (
        ("for (let c = 0; c < d; c++) {",
         "for (let c = 0; c < d; c++) {\n      const src = (c % dh) * H + Math.floor(c / dh); // read as [dh, H]"),
        ("q.data[t * d + c] = qkv.data[t * 3 * d + c];", "q.data[t * d + c] = qkv.data[t * 3 * d + src];"),
        ("k.data[t * d + c] = qkv.data[t * 3 * d + d + c];", "k.data[t * d + c] = qkv.data[t * 3 * d + d + src];"),
        ("v.data[t * d + c] = qkv.data[t * 3 * d + 2 * d + c];",
         "v.data[t * d + c] = qkv.data[t * 3 * d + 2 * d + src];"),
    ), "heads split in the wrong order: columns read as [d_head, H] instead of [H, d_head]",
        "blocks.0.attn.hook_q"),
    _ts("ts-ln-unbiased-variance",
        (("const s = Math.sqrt(sq / d + eps);", "const s = Math.sqrt(sq / (d - 1) + eps);"),),
        "LayerNorm variance divided by d - 1 (unbiased) instead of d", "blocks.0.ln1.hook_scale"),
    _ts("ts-gelu-tanh", ((_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + Math.tanh(Math.sqrt(2 / Math.PI) * "
                                    "(v + 0.044715 * v * v * v)));"),),
        "tanh-approximated GELU (GPT-2's gelu_new) instead of the exact erf GELU", "blocks.0.mlp.hook_post"),
    _ts("ts-erf-polynomial", (
        (_TS_IMPORTS, _TS_ERF_AS),
        (_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + erfAS(v / Math.SQRT2));"),
    ), "erf by the Abramowitz-Stegun 7.1.26 polynomial (error 1.5e-7)", "blocks.0.mlp.hook_post", fp64_only=True),
    _ts("ts-positions-float32", (
        ("invFreq[i] = Math.pow(10000, -(2 * i) / dModel);",
         "invFreq[i] = Math.fround(Math.pow(10000, Math.fround(-(2 * i) / dModel)));"),
        (_TS_ANGLE, "const angle = Math.fround(pos * invFreq[i]);"),
        ("= Math.sin(angle);", "= Math.fround(Math.sin(angle));"),
        ("= Math.cos(angle);", "= Math.fround(Math.cos(angle));"),
    ), "sinusoidal positions computed in float32 (Math.fround at each step)", "hook_pos_embed", fp64_only=True),
    _ts("ts-positions-shifted", ((_TS_ANGLE, "const angle = (pos + 1) * invFreq[i];"),),
        "positions counted from 1 instead of 0", "hook_pos_embed"),
    _ts("ts-float32-accumulation", (
        *((f"od[r{i} + j] += x{i} * wkj;", f"od[r{i} + j] = Math.fround(od[r{i} + j] + x{i} * wkj);")
          for i in range(4)),  # linearColumns' four-row tile
        ("for (let j = j0; j < j1; j++) od[row + j] += xk * wd[wrow + j]!;",  # and its remaining rows
         "for (let j = j0; j < j1; j++) od[row + j] = Math.fround(od[row + j] + xk * wd[wrow + j]!);"),
        ("for (let j = 0; j < m; j++) od[r + j] += bd[j]!;",  # linear's bias
         "for (let j = 0; j < m; j++) od[r + j] = Math.fround(od[r + j] + bd[j]!);"),
    ), "Conv1D (x @ W + b) accumulated in float32, as with a Float32Array buffer", "blocks.0.attn.hook_q",
        fp64_only=True),
    _ts("ts-final-ln-unused", (('return linearTransposed(ln, param(params, "wte.weight"));',
                                'return linearTransposed(x, param(params, "wte.weight"));'),),
        "final LayerNorm computed but not applied: logits read the raw residual stream", "logits"),
    # -- Python mutants of the reference (float32 and float64: all three comparisons) ------------
    _py("py-post-ln", (
        ('    ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, taps, '
         'f"{name}.ln1")\n    attn_out = attention(ln1,', "    attn_out = attention(x,"),
        ("    resid_mid = x + attn_out",
         '    resid_mid = layer_norm(x + attn_out, params[p + "ln_1.weight"], params[p + "ln_1.bias"], '
         'config.ln_eps, taps, f"{name}.ln1")'),
        ('    ln2 = layer_norm(\n        resid_mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], '
         'config.ln_eps, taps, f"{name}.ln2"\n    )\n    mlp_out = mlp(ln2,', "    mlp_out = mlp(resid_mid,"),
        ("    resid_post = resid_mid + mlp_out",
         '    resid_post = layer_norm(resid_mid + mlp_out, params[p + "ln_2.weight"], params[p + "ln_2.bias"], '
         'config.ln_eps, taps, f"{name}.ln2")'),
    ), "post-LN (x = LN(x + Attn(x))) instead of GPT-2's pre-LN", "blocks.0.ln1.hook_scale"),
    _py("py-gelu-relu", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", "    return torch.relu(x)"),),
        "ReLU instead of GELU", "blocks.0.mlp.hook_post"),
    _py("py-erf-polynomial", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_ERF_AS),),
        "erf by the Abramowitz-Stegun 7.1.26 polynomial (error 1.5e-7)", "blocks.0.mlp.hook_post", fp64_only=True),
    _py("py-ln-eps", (("scale = torch.sqrt(var + eps)", "scale = torch.sqrt(var + 1e-6)"),),
        "LayerNorm eps 1e-6 instead of the config's 1e-5", "blocks.0.ln1.hook_scale"),
    _py("py-no-conv1d-transpose", (('out: Tensor = z_flat @ params[prefix + "c_proj.weight"] +',
                                    'out: Tensor = z_flat @ params[prefix + "c_proj.weight"].T +'),),
        "attention c_proj weight used as nn.Linear [out, in], without the Conv1D transpose",
        "blocks.0.hook_attn_out"),
    _py("py-softmax-wrong-axis",
        (("pattern = torch.softmax(scores, dim=-1)", "pattern = torch.softmax(scores, dim=-2)"),),
        "attention softmax over queries instead of keys", "blocks.0.attn.hook_pattern"),
    _py("py-untied-output", (
        ("def unembed(", _PY_UNTIED),
        ('    return ln @ params["wte.weight"].T', '    return ln @ _untied_lm_head(params["wte.weight"]).T'),
    ), "untied output layer: a fresh lm_head instead of wte^T", "logits"),
    # -- incremental decoding (KV cache): the forward pass is untouched; caught by the decoding check
    #    at a step (0 = the prefill) and a decoding tap ---------------------------------------------
    _ts("ts-decode-position-not-offset", (("sinusoidalPositions(pos + 1, d).data.slice(pos * d)",
                                           "sinusoidalPositions(1, d).data.slice(0)"),),
        "incremental mode: the new token's position not offset by the cache length (always position 0)",
        "blocks.0.attn.cache_k", step=1),
    _ts("ts-decode-cache-appended-after-use", (
        ("const T = pos + 1;", "const T = pos;"),
        ("keys.data[kj + e]", "cache.k.data[kj + e]"),
        ("values.data[cacheOffset(h, j, T, H, dh) + e]", "cache.v.data[cacheOffset(h, j, T, H, dh) + e]"),
    ), "cache appended after use (off by one): the new token's query does not see its own key and value",
        "blocks.1.attn.cache_k", step=1),
    _ts("ts-decode-mask-single-query", (("config.causal && j > pos ?", "config.causal && j > 0 ?"),),
        "mask wrong for a single-token query: the square mask's first row, so it sees key 0 only",
        "blocks.1.attn.cache_k", step=1),
    _ts("ts-decode-cache-transposed", (("return (h * T + t) * dh;", "return (t * H + h) * dh;"),),
        "cache stored positions x heads [T, H, d_head] (transposed), read back consistently: the logits "
        "agree, the cache does not", "blocks.0.attn.cache_k", step=0),
    _ts("ts-decode-position-off-by-one", (("sinusoidalPositions(pos + 1, d).data.slice(pos * d)",
                                           "sinusoidalPositions(pos + 2, d).data.slice((pos + 1) * d)"),),
        "incremental mode: the new token encoded one position late (position T + 1 instead of T)",
        "blocks.0.attn.cache_k", step=1),
    _py("py-decode-stale-cache", (("    return out, keys, values", "    return out, cache_k, cache_v"),),
        "incremental mode: the grown cache not returned, so every step keeps the prefill's (a stale cache)",
        "blocks.0.attn.cache_k", step=1),
    _py("py-decode-position-not-offset", (("sinusoidal_positions(pos + 1, config.d_model, wte.dtype)[pos:]",
                                           "sinusoidal_positions(1, config.d_model, wte.dtype)"),),
        "incremental mode: the new token's position not offset by the cache length (always position 0)",
        "blocks.0.attn.cache_k", step=1),
    # -- numerical stability: invisible on fixtures/toy, caught on fixtures/toy-stress ----------------
    *STABILITY,
    # -- reduced precision: caught in fp16 on the probe fixture (the KV cache: by the decoding check) --
    *REDUCED,
    # -- the Llama family: caught on fixtures/toy-llama, each at its tap with its likely cause -----------
    *LLAMA,
    *LLAMA_NUMPY,  # the same bugs in the NumPy Llama
)



def by_name(names: list[str] | None) -> list[Mutant]:
    """The catalog, or the named mutants in catalog order; ParityError (exit 2) for an unknown name."""
    if names is None:
        return list(CATALOG)
    known = {m.name for m in CATALOG}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParityError(f"unknown mutant {unknown[0]!r} (known: {', '.join(m.name for m in CATALOG)})")
    return [m for m in CATALOG if m.name in names]
