"""The Llama family's reference: PyTorch and NumPy agree, Hugging Face's Llama agrees, and each porting bug shows.

A seeded tiny Llama (d_model 16, 2 blocks, 4 query heads sharing 2 key/value heads, d_mlp 32, 12 tokens,
untied, half pairing). Transformers computes RoPE's tables, RMSNorm and the eager softmax in float32 even
in a float64 model, so it is compared in float32 only; the two references are compared in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from parity_reference.families import load_family
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig, param_shapes

torch = pytest.importorskip("torch")

from parity_reference import llama_model, llama_numpy  # noqa: E402  (torch first: skipped without it)

TOKENS = [1, 5, 3, 7, 2, 11, 0, 4, 9, 6]
SEED = 38
STD = 0.3  # wide enough that every tap carries signal: a wrong pairing or head map moves it by far more than round-off


def params(config: LlamaConfig, dtype: Any) -> dict[str, Any]:
    return llama_model.init_params(config, SEED, dtype, std=STD)


def as_numpy(p: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in p.items()}


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a - b|, the masked (-inf) cells required to be masked in both."""
    assert a.shape == b.shape
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    assert np.array_equal(inf_a, inf_b) and np.array_equal(a[inf_a], b[inf_b])
    return float(np.max(np.abs(np.where(inf_a, 0.0, a - np.where(inf_b, 0.0, b))), initial=0.0))


def first_difference(a: dict[str, Any], b: dict[str, Any], atol: float) -> str | None:
    for name in a:
        if max_diff(a[name].numpy(), b[name].numpy()) > atol:
            return name
    return None


# -- the config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_kv_heads": 3}, "n_head=4 is not a multiple of n_kv_heads=3"),
    ({"n_kv_heads": 8}, "n_head=4 is not a multiple of n_kv_heads=8"),
    ({"d_model": 12, "n_head": 4, "n_kv_heads": 2}, "RoPE needs an even d_head, got 3"),
    ({"rope_pairing": "meta"}, "rope_pairing must be 'half' or 'interleaved', got 'meta'"),
    ({"rope_base": 1.0}, "rope_base must be above 1, got 1.0"),
    ({"rms_eps": float("nan")}, "rms_eps must be a finite number, got nan"),
    ({"n_layer": 0}, "n_layer must be a positive integer, got 0"),
    ({"tied": 1}, "tied must be true or false, got 1"),
])
def test_a_bad_config_is_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        LlamaConfig(**kwargs)
    assert str(info.value) == message


def test_config_round_trips_through_its_dict_and_refuses_unknown_keys() -> None:
    config = LlamaConfig(rope_pairing="interleaved", bias=True, tied=True, rope_base=500000.0)
    assert LlamaConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown config keys: ln_eps"):
        LlamaConfig.from_dict({**config.to_dict(), "ln_eps": 1e-5})
    with pytest.raises(ValueError, match="missing config keys: n_kv_heads"):
        LlamaConfig.from_dict({k: v for k, v in config.to_dict().items() if k != "n_kv_heads"})


# -- PyTorch and NumPy, float64 ------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    TOY_LLAMA,
    LlamaConfig(rope_pairing="interleaved", bias=True, tied=True, rope_base=500000.0, rms_eps=1e-6, n_kv_heads=1),
], ids=["toy", "interleaved-bias-tied-mqa"])
def test_torch_and_numpy_agree_on_every_tap_in_float64(config: LlamaConfig) -> None:
    p = params(config, torch.float64)
    t = llama_model.run_with_taps(p, config, TOKENS)
    n = llama_numpy.forward(as_numpy(p), config, TOKENS)
    family = load_family("llama")
    assert list(t) == list(n) == family.tap_names(config)
    worst = {name: max_diff(t[name].numpy(), n[name]) for name in t}
    assert max(worst.values()) <= 1e-13, {k: v for k, v in worst.items() if v > 1e-13}
    for name, value in n.items():
        assert value.dtype == np.float64 and t[name].dtype == torch.float64, name
        template = family.shape_template(config, name)
        assert list(value.shape) == [len(TOKENS) if s == "T" else s for s in template], name


def test_float32_params_compute_in_float32_and_stay_near_float64() -> None:
    p64 = params(TOY_LLAMA, torch.float64)
    p32 = {k: v.to(torch.float32) for k, v in p64.items()}
    t32 = llama_model.run_with_taps(p32, TOY_LLAMA, TOKENS)
    n32 = llama_numpy.forward(as_numpy(p32), TOY_LLAMA, TOKENS)
    t64 = llama_model.run_with_taps(p64, TOY_LLAMA, TOKENS)
    assert all(v.dtype == torch.float32 for v in t32.values())
    assert all(v.dtype == np.float32 for v in n32.values())
    assert max(max_diff(t32[k].numpy(), n32[k]) for k in t32) < 1e-5
    assert max_diff(t32["logits"].numpy().astype(np.float64), t64["logits"].numpy()) < 1e-5


# -- Hugging Face's LlamaForCausalLM, float32 ------------------------------------------------------


def hf_model(config: LlamaConfig, p: dict[str, Any]) -> Any:
    """transformers' LlamaForCausalLM (eager attention) with exactly the reference's weights."""
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_mlp,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, num_key_value_heads=config.n_kv_heads,
        max_position_embeddings=config.n_ctx, rms_norm_eps=config.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        attention_bias=config.bias, mlp_bias=False, tie_word_embeddings=config.tied, attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    assert model.config._attn_implementation == "eager"
    state = dict(p)
    if config.tied:
        state["lm_head.weight"] = p["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


# Measured: 9.4e-7 on the logits (|logit| <= 2.9), 2.6e-6 on the block outputs (|x| <= 9.4): about 3 float32 ulps, from
# the order of operations (rsqrt and multiply vs sqrt and divide); HF's own float32 RoPE tables change neither number.
HF_ATOL = 1e-5


@pytest.mark.parametrize("config", [
    TOY_LLAMA, LlamaConfig(bias=True, tied=True, rope_base=500000.0, rms_eps=1e-6),
], ids=["toy", "bias-tied-base5e5-eps1e-6"])
def test_hf_llama_agrees_with_the_reference_in_float32(config: LlamaConfig) -> None:
    p = params(config, torch.float32)
    model = hf_model(config, p)
    outputs: list[Any] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out[0] if isinstance(out, tuple) else out))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([TOKENS])).logits[0]
    finally:
        for h in hooks:
            h.remove()
    taps = llama_model.run_with_taps(p, config, TOKENS)
    assert len(outputs) == config.n_layer
    for i, out in enumerate(outputs):
        diff = max_diff(out[0].numpy(), taps[f"blocks.{i}.hook_resid_post"].numpy())
        assert diff <= HF_ATOL, f"blocks.{i}.hook_resid_post differs from HF's layer {i} by {diff:.3g}"
    diff = max_diff(logits.numpy(), taps["logits"].numpy())
    assert diff <= HF_ATOL, f"logits differ from HF's by {diff:.3g}"
    assert float(taps["logits"].abs().max()) > 0.1  # the logits are not all near zero: the bound means something


def test_the_hf_comparison_sees_a_wrong_rope_base() -> None:
    """The same comparison fails when only the RoPE base differs: a wrong base is caught."""
    p = params(TOY_LLAMA, torch.float32)
    model = hf_model(LlamaConfig(rope_base=500000.0), p)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0]
    taps = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    assert max_diff(logits.numpy(), taps["logits"].numpy()) > 100 * HF_ATOL


# -- the porting bugs the family expresses ---------------------------------------------------------


def meta_from_hf(w: Any, n_heads: int) -> Any:
    """Undo the HF converter's `permute`: q/k rows from half-split order back to Meta's interleaved order."""
    out, d_in = w.shape
    dh = out // n_heads
    return w.reshape(n_heads, 2, dh // 2, d_in).transpose(1, 2).reshape(out, d_in)


def hf_from_meta(w: Any, n_heads: int) -> Any:
    """convert_llama_weights_to_hf.py's `permute`: Meta's interleaved q/k rows to half-split order."""
    out, d_in = w.shape
    dh = out // n_heads
    return w.reshape(n_heads, dh // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


def meta_params(config: LlamaConfig, p: dict[str, Any]) -> dict[str, Any]:
    out = dict(p)
    for i in range(config.n_layer):
        for proj, heads in (("q_proj", config.n_head), ("k_proj", config.n_kv_heads)):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            out[name] = meta_from_hf(p[name], heads)
    return out


def test_interleaved_pairing_on_meta_weights_is_half_pairing_on_hf_weights() -> None:
    p_hf = params(TOY_LLAMA, torch.float64)
    p_meta = meta_params(TOY_LLAMA, p_hf)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(hf_from_meta(p_meta[name], TOY_LLAMA.n_head), p_hf[name])  # the two permutations invert
    assert not torch.equal(p_meta[name], p_hf[name])
    interleaved = LlamaConfig(rope_pairing="interleaved")
    half = llama_model.run_with_taps(p_hf, TOY_LLAMA, TOKENS)
    meta = llama_model.run_with_taps(p_meta, interleaved, TOKENS)
    for tap in ("blocks.0.attn.hook_attn_scores", "blocks.1.attn.hook_z", "logits"):
        assert max_diff(meta[tap].numpy(), half[tap].numpy()) <= 1e-13, tap
    # The porting bug: Meta's weights read with Hugging Face's pairing. First wrong at hook_rot_q.
    wrong = llama_model.run_with_taps(p_meta, TOY_LLAMA, TOKENS)
    assert first_difference(
        {k: v for k, v in wrong.items() if not k.endswith(("hook_q", "hook_k"))}, half, 1e-6
    ) == "blocks.0.attn.hook_rot_q"
    assert max_diff(wrong["logits"].numpy(), half["logits"].numpy()) > 1e-3


@contextmanager
def patched(module: Any, name: str, value: Callable[..., Any]) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def test_gqa_with_repeat_instead_of_repeat_interleave_changes_hook_z() -> None:
    """Query head h must read kv head h // n_rep ([0, 0, 1, 1]); `repeat` reads h % n_kv_heads ([0, 1, 0, 1])."""
    p = params(TOY_LLAMA, torch.float64)
    good = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    with patched(llama_model, "expand_kv", lambda kv, n_rep: kv.repeat(n_rep, 1, 1)):
        bad = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    assert first_difference(bad, good, 1e-6) == "blocks.0.attn.hook_attn_scores"
    assert max_diff(bad["blocks.0.attn.hook_z"].numpy(), good["blocks.0.attn.hook_z"].numpy()) > 1e-3
    # NumPy's mirror makes the same mapping as PyTorch's (head h reads kv head h // n_rep), not the mutant's.
    kv = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    assert np.array_equal(llama_numpy.expand_kv(kv, 2), llama_model.expand_kv(torch.from_numpy(kv), 2).numpy())
    assert np.array_equal(llama_numpy.expand_kv(kv, 2)[:, 0, 0], [0, 0, 12, 12])


# -- incremental decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    TOY_LLAMA, LlamaConfig(rope_pairing="interleaved", bias=True, tied=True, n_kv_heads=1),
], ids=["toy", "interleaved-bias-tied-mqa"])
def test_decoding_matches_the_full_forward_at_every_step(config: LlamaConfig) -> None:
    p = params(config, torch.float64)
    prompt, feed = [3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5]
    steps_t = llama_model.decode(p, config, prompt, len(feed), feed)
    steps_n = llama_numpy.decode(as_numpy(p), config, prompt, len(feed), feed)
    worst = 0.0
    for k, ((logits_t, cache_t), (logits_n, cache_n)) in enumerate(zip(steps_t, steps_n, strict=True)):
        seen = prompt + feed[:k]
        full = llama_model.run_with_taps(p, config, seen)
        worst = max(worst, max_diff(logits_t.numpy(), full["logits"][-1].numpy()),
                    max_diff(logits_n, full["logits"][-1].numpy()))
        for i, ((keys, values), (keys_n, values_n)) in enumerate(zip(cache_t, cache_n, strict=True)):
            assert tuple(keys.shape) == (config.n_kv_heads, len(seen), config.d_head)
            worst = max(worst, max_diff(keys.numpy(), full[f"blocks.{i}.attn.hook_rot_k"].transpose(0, 1).numpy()),
                        max_diff(values.numpy(), full[f"blocks.{i}.attn.hook_v"].transpose(0, 1).numpy()),
                        max_diff(keys_n, keys.numpy()), max_diff(values_n, values.numpy()))
    assert worst <= 1e-13


def test_decoding_refuses_a_position_past_the_context() -> None:
    config = LlamaConfig(n_ctx=4)
    p = params(config, torch.float64)
    _, cache = llama_model.prefill(p, config, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match=r"position 4 is past the context \(4\)"):
        llama_model.decode_step(p, config, torch.tensor([0]), cache)
    _, cache_n = llama_numpy.prefill(as_numpy(p), config, [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"position 4 is past the context \(4\)"):
        llama_numpy.decode_step(as_numpy(p), config, 0, cache_n)


def test_param_shapes_are_hf_llamas() -> None:
    transformers = pytest.importorskip("transformers")
    for config in (TOY_LLAMA, LlamaConfig(bias=True, tied=True)):
        model = hf_model(config, params(config, torch.float32))
        assert {k: tuple(v.shape) for k, v in model.named_parameters()} == param_shapes(config)
    assert transformers.__version__


# -- TransformerLens: the names are its names, and its HookedTransformer computes the same numbers -----


@pytest.mark.full  # importing transformer_lens takes about 7 s
def test_transformerlens_hooks_are_the_family_taps_and_agree_in_float64() -> None:
    """An offline HookedTransformer (config by hand, weights through TL's own `convert_llama_weights`)."""
    tl = pytest.importorskip("transformer_lens")
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    config = TOY_LLAMA
    cfg = tl.HookedTransformerConfig(
        d_model=config.d_model, n_layers=config.n_layer, n_heads=config.n_head, n_key_value_heads=config.n_kv_heads,
        d_head=config.d_head, d_mlp=config.d_mlp, d_vocab=config.vocab_size, n_ctx=config.n_ctx, act_fn="silu",
        normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True, final_rms=True,
        rotary_adjacent_pairs=False, rotary_dim=config.d_head, rotary_base=config.rope_base, eps=config.rms_eps,
        original_architecture="LlamaForCausalLM", default_prepend_bos=False, dtype=torch.float64,
    )
    p = params(config, torch.float64)
    hf = hf_model(config, p).to(torch.float64)
    hf.load_state_dict(p, strict=True)  # exactly the float64 weights, not their float32 rounding
    model = tl.HookedTransformer(cfg)
    result = model.load_state_dict(convert_llama_weights(hf, cfg), strict=False)
    assert result.unexpected_keys == []
    logits, cache = model.run_with_cache(torch.tensor([TOKENS]))
    ours = llama_model.run_with_taps(p, config, TOKENS)
    hooks = [k for k in cache if not k.startswith("unembed.")]  # unembed.hook_in/out: the logits' input and output
    assert hooks == [k for k in load_family("llama").tap_names(config) if k in ours and k in cache]
    assert set(ours) - set(hooks) == {"logits", "probs", *(f"logit_lens.{k}" for k in range(config.n_layer + 1))}
    worst = {k: max_diff(cache[k][0].detach().numpy(), ours[k].numpy()) for k in hooks}
    worst["logits"] = max_diff(logits[0].detach().numpy(), ours["logits"].numpy())
    assert max(worst.values()) <= 1e-13, {k: v for k, v in worst.items() if v > 1e-13}  # measured: 1.8e-15


# -- each classic porting bug first shows at its own tap ------------------------------------------


def _swap_gate_and_up(p: dict[str, Any]) -> dict[str, Any]:
    out = dict(p)
    for i in range(TOY_LLAMA.n_layer):
        gate, up = f"model.layers.{i}.mlp.gate_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"
        out[gate], out[up] = p[up], p[gate]
    return out


def _one_plus_w(p: dict[str, Any]) -> dict[str, Any]:
    """RMSNorm's gain read as 1 + w (Gemma's convention) on Llama weights."""
    return {k: 1.0 + v if k.endswith("norm.weight") else v for k, v in p.items()}


@pytest.mark.parametrize(("bug", "first", "logits_off"), [
    (("config", {"rope_base": 500000.0}), "blocks.0.attn.hook_rot_q", 1e-3),
    (("config", {"rope_pairing": "interleaved"}), "blocks.0.attn.hook_rot_q", 1e-3),
    (("config", {"rms_eps": 1e-6}), "blocks.0.ln1.hook_scale", 1e-5),  # 1e-5 read as 1e-6: logits off by 2.7e-4
    (("params", _swap_gate_and_up), "blocks.0.mlp.hook_pre", 1e-3),
    (("params", _one_plus_w), "blocks.0.attn.hook_q", 1e-3),  # the gain is after hook_normalized
], ids=["rope-base", "rope-pairing", "rms-eps", "gate-up-swapped", "rmsnorm-1+w"])
def test_each_porting_bug_first_shows_at_its_tap(bug: tuple[str, Any], first: str, logits_off: float) -> None:
    """What a selftest mutant of each bug must be caught at: the first tap off by more than float64 round-off."""
    p = params(TOY_LLAMA, torch.float64)
    good = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    kind, change = bug
    if kind == "config":
        bad = llama_model.run_with_taps(p, LlamaConfig(**change), TOKENS)
    else:
        bad = llama_model.run_with_taps(change(p), TOY_LLAMA, TOKENS)
    assert first_difference(bad, good, 1e-9) == first
    assert max_diff(bad["logits"].numpy(), good["logits"].numpy()) > logits_off


# -- why Hugging Face's float64 Llama is compared in float32 only: three float32 islands, named -------


def _rms_norm_float64(self: Any, hidden_states: Any) -> Any:
    """LlamaRMSNorm.forward without its `.to(torch.float32)`."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_float64(self: Any, x: Any, position_ids: Any) -> Any:
    """LlamaRotaryEmbedding.forward with inv_freq, the angles, cos and sin in float64 (not `.float()`)."""
    dim = 2 * self.inv_freq.shape[0]
    base = torch.tensor(self.config.rope_parameters["rope_theta"], dtype=torch.float64)
    inv_freq = torch.pow(base, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dh/2,)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (1, T, dh/2)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _eager_attention_float64(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float, dropout: float = 0.0,
    **kwargs: Any,
) -> Any:
    """eager_attention_forward with the softmax in the inputs' dtype (not `dtype=torch.float32`)."""
    from transformers.models.llama.modeling_llama import repeat_kv

    keys, values = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


def test_hf_llama_in_float64_computes_three_steps_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repro for docs/backends.md: a float64 LlamaForCausalLM (transformers 5.24) first diverges from the
    float64 reference at blocks.0's input RMSNorm (2.5e-7: `hidden_states.to(torch.float32)`), and its RoPE
    tables and eager softmax are float32 too. Each island alone leaves an error of ~1e-7 .. 1e-6 on the logits;
    with all three in float64 it agrees with the reference to 3.8e-15 (measured), every layer.
    """
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    p = params(TOY_LLAMA, torch.float64)
    model = hf_model(TOY_LLAMA, p).to(torch.float64)
    model.load_state_dict(p, strict=True)  # exactly the float64 weights, not their float32 rounding
    ours = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    norm_in = ours["blocks.0.ln1.hook_normalized"] * p["model.layers.0.input_layernorm.weight"]
    seen: dict[str, Any] = {}
    model.model.layers[0].input_layernorm.register_forward_hook(lambda _m, _i, out: seen.__setitem__("ln1", out))

    def logits_and_layers() -> tuple[float, float, list[float]]:
        outputs: list[Any] = []
        hooks = [layer.register_forward_hook(lambda _m, _i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
                 for layer in model.model.layers]
        with torch.no_grad():
            logits = model(torch.tensor([TOKENS])).logits[0]
        for h in hooks:
            h.remove()
        layers = [max_diff(o[0].numpy(), ours[f"blocks.{i}.hook_resid_post"].numpy()) for i, o in enumerate(outputs)]
        return (max_diff(logits.numpy(), ours["logits"].numpy()), max_diff(seen["ln1"][0].numpy(), norm_in.numpy()),
                layers)

    logits_off, ln1_off, _ = logits_and_layers()
    assert 1e-9 < ln1_off < 1e-5 and 1e-9 < logits_off < 1e-5  # float32 inside, at the first RMSNorm already
    islands = {
        "rms_norm": (modeling_llama.LlamaRMSNorm, "forward", _rms_norm_float64),
        "rope": (modeling_llama.LlamaRotaryEmbedding, "forward", _rope_float64),
        "softmax": (modeling_llama, "eager_attention_forward", _eager_attention_float64),
    }
    for name, (owner, attr, fix) in islands.items():  # one island lifted: the other two still show
        with monkeypatch.context() as m:
            m.setattr(owner, attr, fix)
            assert logits_and_layers()[0] > 1e-9, f"{name} alone made HF float64"
    for owner, attr, fix in islands.values():
        monkeypatch.setattr(owner, attr, fix)
    logits_off, ln1_off, layers = logits_and_layers()
    assert max(logits_off, ln1_off, *layers) <= 1e-13


def test_bounded_taps_stay_in_the_family_tables_ranges() -> None:
    """The table's bounds hold on the reference; RMSNorm's is sqrt(d_model), not LayerNorm's sqrt(d_model - 1)."""
    family = load_family("llama")
    p = params(TOY_LLAMA, torch.float64)
    taps = llama_model.run_with_taps(p, TOY_LLAMA, TOKENS)
    bounded = [name for name in taps if family.value_range(TOY_LLAMA, name) is not None]
    assert "blocks.0.ln1.hook_normalized" in bounded and "blocks.1.attn.hook_pattern" in bounded
    for name in bounded:
        lo, hi = family.value_range(TOY_LLAMA, name)  # type: ignore[misc]
        assert lo <= float(taps[name].min()) and float(taps[name].max()) <= hi, name
    spike = torch.zeros(1, TOY_LLAMA.d_model, dtype=torch.float64)
    spike[0, 3] = 1e3  # all the energy in one coordinate: normalized to just under sqrt(d_model)
    seen: dict[str, Any] = {}
    llama_model.rms_norm(spike, torch.ones(TOY_LLAMA.d_model, dtype=torch.float64), 1e-12, seen, "n")
    _, hi = family.value_range(TOY_LLAMA, "ln_final.hook_normalized")  # type: ignore[misc]
    assert (TOY_LLAMA.d_model - 1) ** 0.5 < float(seen["n.hook_normalized"].max()) <= hi
