"""The Llama family's mutants: its porting bugs, in the torch Llama and in the NumPy Llama, named in the family's
table (`code.mutants`, parity_reference/families/llama.json).

`LLAMA` ("llama-..."): patches of `parity_reference/llama_model.py` (target "reference", run like the pytorch
backend); `LLAMA_NUMPY` ("llama-np-..."): the same bugs in `parity_reference/llama_numpy.py` (target "numpy", run by
the numpy backend's own code), each made from its torch twin (the same description and tap, the NumPy spelling of the
patch). All are caught_on "family": the selftest runs them on `FIXTURE`, the committed Llama toy (the toy's sibling
directory, fixtures/toy-llama), in float32 and float64, where each must be caught at its tap with a likely cause that
names it (parity_harness/_compare/llama_causes.py).
"""

from __future__ import annotations

from parity_harness._tools.mutants import Mutant

FAMILY = "llama"
TITLE = "Llama"  # how the selftest names the family's mutants ("Llama mutants caught at their tap ...")
FIXTURE = "toy-llama"  # the committed fixture its mutants are caught on: the toy's sibling directory


def _llama(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str) -> Mutant:
    return Mutant(name, "reference", "llama_model.py", patches, description, tap, False, None, "family",
                  family=FAMILY)


def _llama_numpy(twin: Mutant, patches: tuple[tuple[str, str], ...], description: str | None = None) -> Mutant:
    """The same bug in parity_reference/llama_numpy.py: the torch twin's tap, fixture and (unless given) description."""
    name = twin.name.replace("llama-", "llama-np-", 1)
    return Mutant(name, "numpy", "llama_numpy.py", patches, description or twin.description, twin.expected_tap,
                  twin.fp64_only, twin.expected_step, twin.caught_on, family=twin.family)


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

MUTANTS: tuple[Mutant, ...] = (*LLAMA, *LLAMA_NUMPY)  # the catalog's order: the torch Llama's, then their twins
