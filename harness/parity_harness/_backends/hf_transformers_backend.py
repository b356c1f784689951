"""The `hf-transformers` backend: Hugging Face transformers' `GPT2LMHeadModel`, an implementation nobody here wrote.

The model is built from the fixture's config (`attn_implementation="eager"`; `activation_function` the
config's `activation`: "gelu", the exact erf GELU, or "gelu_new", GPT-2's tanh GELU, transformers'
`NewGELUActivation`; dropout 0; tied embeddings) and given the fixture's weights in the
precision's dtype: upcast to float64 for fp64, rounded once (to nearest) to float16 / bfloat16 for fp16 /
bf16; for the stored weight format f16, the weights as a GGUF file stores them in float16 (stored_weights.py),
computed in float32, judged against those weights' goldens. A sinusoidal fixture's positions are the sinusoid
table (parity_reference.model's, computed in float64 and rounded once to the dtype) loaded as `wpe`. Nothing is
downloaded (HF_HUB_OFFLINE=1).

The dtype takes transformers' documented path for a model built from a config,
`AutoModelForCausalLM.from_config(config, dtype=...)` (transformers 4's `torch_dtype`, deprecated for
`dtype` since 4.56; the pinned 5.24 warns on `torch_dtype`). For a config it does one thing: it builds
the model with torch's default dtype set to `dtype` (and records `config.dtype`), so every parameter is
created in it; no `.to(dtype)` follows, and every floating tensor is checked to be in the dtype after
the weights are assigned. In fp16 and bf16 (on the CPU) transformers' GPT-2 then computes in that
dtype, but for the attention: it runs with transformers' `reorder_and_upcast_attn` (q.k in float32 with the
scale inside the product, the softmax in float32, the pattern cast to the dtype), transformers' own remedy for
scores that overflow fp16 before the scale, as its default eager attention does on the fp16-stress fixture's
attention sink (docs/backends.md). Two things differ from
parity_reference/model.py, which rounds every op: the LayerNorms are `nn.LayerNorm`, torch's fused CPU
kernel, whose mean and variance are not rounded to the dtype, and the exact GELU is torch's fused `gelu`
(gelu_new is written op by op, as the reference writes it).
Taps are widened to float32 arrays (exactly: the reduced precisions' container); `probs` and the logit
lens are softmaxes of the dtype's logits, in the dtype, so every value is on the dtype's grid.

Taps come from forward hooks on transformers' own modules: embeddings (`wte`, `wpe`), each block's
input and output, `attn.c_attn` (q, k, v), the attention module's weights (the pattern), the input of
`attn.c_proj` (z), the attention and MLP outputs, `ln_2`'s input (resid_mid), `mlp.c_fc` and `mlp.act`
(the MLP's pre- and post-activation), and the logits. `probs` is a softmax of those logits, and the
logit lens runs each block's input through transformers' `ln_f` and `lm_head`. Not supported, because
transformers computes them inside one fused call and never exposes them: every LayerNorm's
`hook_scale` and `hook_normalized` (nn.LayerNorm), and the pre-softmax attention scores (inside
`eager_attention_forward`). A causal=false fixture is declined (GPT-2 in transformers is always causal).

A Llama fixture (family "llama") gets transformers' `LlamaForCausalLM` (eager attention, default RoPE, SiLU),
built the same way from the fixture's weights, which carry Hugging Face's names already (`hf_llama_model`).
Taps come from hooks on its modules, and `hook_rot_q`, `hook_rot_k` and `hook_pattern` from its attention
function's arguments and result: transformers' own `eager_attention_forward`, registered (with its eager mask
function: without one transformers gives no mask) under the name `parity_eager`. In fp64 the three steps
transformers computes in float32 inside a float64 Llama (RMSNorm, the RoPE tables, the softmax) are computed
in float64, on the model's own module instances; no class is patched (docs/backends.md, "hf-transformers").
RMSNorm's `hook_scale`/`hook_normalized` and the scores stay unexposed; an interleaved-pairing fixture is declined.

The model is built once per `run_cases` call (one fixture, one precision), never per case; no decoding
(in any precision). What transformers says to model authors (its warnings and log records, e.g. about
special token ids) is kept off the user's terminal (`silenced`, quiet.py); the config names no special token outside
the vocabulary.

**The backward** (`parity run --grad`, fp32 and fp64, both families) is torch autograd through transformers' own
model, built as above (for fp64 the same float64 model, RMSNorm, RoPE and softmax computed in float64 on its own
modules): each training case's logits from the model, the next-token cross-entropy computed here from them
(`parity_reference.backward.case_loss`, in the model's dtype: transformers' `labels=` loss casts the logits to
float32), and `torch.autograd.grad` of it with respect to the model's parameters (the tied embedding once: its
gradient sums both uses) and to the very tensors the forward hooks read, with the batch axis (a tap is a view of
them: the adjoint of `c_attn`'s output, split three ways, gives q, k and v's; the input of `c_proj`, reshaped,
z's). Every tap it reads from the model has its gradient, `hook_rot_q`, `hook_rot_k` and `hook_pattern` of the
Llama included (the attention function's own arguments and result); the taps it does not expose have none
(`UNEXPOSED`, ln_final's). `probs` and the logit lens, which it computes itself, are off the loss's path: no
gradient anyway. The training step is torch.optim.AdamW (foreach=False, the no_decay group) on the model's own
parameters, the batch's loss the sum of every case's cross-entropy over its cells.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision, training_spec
from parity_harness._backends.quiet import silenced
from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import is_reduced, is_stored

if TYPE_CHECKING:
    import torch

    from parity_harness._fixture.fixture import Fixture
    from parity_reference.config import GPTConfig
    from parity_reference.training import TrainingSpec

# The taps transformers' GPT-2 never materializes as a module's input or output.
UNEXPOSED = ("ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized",
             "attn.hook_attn_scores")


GPT2_EOS = 50256  # GPT2Config's default bos_token_id and eos_token_id


def hf_config(config: GPTConfig, upcast_attention: bool = False) -> Any:
    """transformers' GPT2Config for a parity config: eager attention, the config's activation ("gelu", the exact
    GELU, or "gelu_new"; transformers' names are parity's), no dropout, tied. `upcast_attention` (fp16 and bf16):
    transformers' `reorder_and_upcast_attn`, its scores and softmax in float32 with q.k scaled inside the product,
    its own remedy for q.k overflowing fp16 before the scale (docs/backends.md)."""
    from transformers import GPT2Config

    special = GPT2_EOS if config.vocab_size > GPT2_EOS else None  # GPT-2's <|endoftext|>, if the vocabulary has it
    cfg = GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.d_model, n_layer=config.n_layer,
        n_head=config.n_head, n_inner=config.d_mlp, activation_function=config.activation,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=config.ln_eps,
        tie_word_embeddings=True, scale_attn_weights=True, use_cache=False,
        bos_token_id=special, eos_token_id=special, reorder_and_upcast_attn=upcast_attention,
    )
    cfg._attn_implementation = "eager"
    return cfg


def hf_model(weights: dict[str, np.ndarray], config: GPTConfig, precision: Precision) -> Any:
    """A GPT2LMHeadModel in eval mode holding the fixture's weights in the precision's dtype.

    Consumes `weights`: each array is popped as it is converted (a GPT-2-sized model's float32 and
    float64 copies are never both whole in memory).
    """
    import torch

    from parity_reference.model import sinusoidal_positions
    from parity_reference.run import torch_dtype

    with silenced(("transformers",)):
        from transformers import AutoModelForCausalLM

    dtype = torch_dtype(precision)
    # One copy each, in the dtype (rounded once, to nearest); each float32 array is popped as soon as converted.
    state = {f"transformer.{k}": torch.tensor(weights.pop(k), dtype=dtype) for k in list(weights)}
    if config.positions == "sinusoidal":
        state["transformer.wpe.weight"] = sinusoidal_positions(config.n_ctx, config.d_model, dtype)  # (n_ctx, d)
    # Built from the config on the meta device (no random initialization of 124M parameters replaced anyway),
    # then given the dtype. Not `from_config(config, dtype=...)`: that builds the model under torch's *default*
    # dtype set to `dtype`, process-wide, while another backend may be computing beside this one (`--jobs`);
    # an un-typed tensor it made meanwhile would be float64. The dtype is recorded as config.dtype, as
    # from_config records it.
    with silenced(("transformers",)), torch.device("meta"):
        model = cast(Any, AutoModelForCausalLM).from_config(hf_config(config, is_reduced(precision))).to(dtype)
    model.config.dtype = dtype
    model.load_state_dict(state, strict=False, assign=True)
    model.lm_head.weight = model.transformer.wte.weight  # tied embeddings
    model = model.eval()
    tensors = [*model.named_parameters(), *model.named_buffers()]
    left = [n for n, t in tensors if t.is_meta]
    if left:
        raise RuntimeError(f"transformers' GPT-2 has tensors the fixture does not fill: {left[:3]}")
    other = [f"{n} ({t.dtype})" for n, t in tensors if t.is_floating_point() and t.dtype != dtype]
    if other:
        raise RuntimeError(f"transformers' GPT-2 holds tensors outside {dtype}: {other[:3]}")
    return model


class HFTransformersBackend(Backend):
    name: ClassVar[str] = "hf-transformers"
    description: ClassVar[str] = (
        "transformers' GPT2LMHeadModel (eager attention, the fixture's GELU), taps from hooks; fp16 and bf16 on the "
        "CPU")
    # f16: the weights as a GGUF file stores them in float16 (stored_weights.py), computed in float32
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64", "fp16", "bf16", "f16")
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    install_hint: ClassVar[str] = "pip install 'parity-harness[hf]'"
    streams: ClassVar[bool] = True
    concurrent: ClassVar[bool] = True  # builds without torch's default dtype; only silences output beside others
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [t for t in fixture.tap_names if not t.startswith("ln_final.") and not t.endswith(UNEXPOSED)]

    def declines(self, fixture: Fixture) -> str | None:
        if fixture.family == "llama":
            return _llama_declines(fixture)
        if not fixture.config.causal:
            return "transformers' GPT-2 is always causal; this fixture has causal=false"
        return None

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded
        import torch

        # One thread, as the pytorch backend (parity_reference/run.py): the same reduction order whether or
        # not another backend ran first, and no thread pool spinning for a toy's tiny ops on a busy machine.
        torch.set_num_threads(1)
        if fixture.family == "llama":
            yield from _llama_run_cases(fixture, precision, set(self.supported_taps(fixture)))
            return
        config = fixture.config
        weights, precision = _weights_for(fixture, precision)
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        model = hf_model(weights, config, precision)  # pops each array as it converts it
        wanted = set(self.supported_taps(fixture))
        H, dh = config.n_head, config.d_head
        yield from _cases(fixture, config, precision, wanted, lambda taps: _hooks(model, taps, H, dh),
                          lambda x: model.lm_head(model.transformer.ln_f(x)), model)

    # -- the backward and the training step (parity run --grad) -------------------------------------------------

    def supports_grad(self, fixture: Fixture) -> bool:
        return True

    def supported_grads(self, fixture: Fixture) -> list[str]:
        """Every gradient of a tap it reads from the model, and every parameter's."""
        from parity_reference.training import GRAD_SUFFIX

        readable = set(self.supported_taps(fixture)) | set(fixture.model.param_shapes())
        return [n for n in fixture.grad_names() if n.removesuffix(GRAD_SUFFIX) in readable]

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        import torch

        from parity_reference.backward import case_loss
        from parity_reference.training import GRAD_SUFFIX, grad_name

        spec, model, params = _grad_model(fixture, self.name, precision, every=True)
        taps = [n.removesuffix(GRAD_SUFFIX) for n in self.supported_grads(fixture)]
        taps = [t for t in taps if t not in params]
        out: dict[str, dict[str, np.ndarray]] = {}
        for name in spec.cases:
            tokens = list(fixture.case(name).tokens)
            found: dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]] = {}
            full = _grad_forward(fixture, model, tokens, found)  # (1, T, V)
            ids = torch.tensor(tokens, dtype=torch.int64)  # (T,)
            loss = case_loss(full[0], ids)  # ()
            missing = [t for t in taps if t not in found]
            if missing:
                raise RuntimeError(f"transformers' model did not show the tap {missing[0]!r} to its hooks")
            unique = list({id(found[t][0]): found[t][0] for t in taps}.values())
            grads = torch.autograd.grad(loss, [*unique, *params.values()], allow_unused=True)
            by_id = {id(t): g for t, g in zip(unique, grads[: len(unique)], strict=True)}
            result = {"loss": loss.detach().numpy().copy()}
            for tap in taps:
                tensor, to_tap = found[tap]
                g = by_id[id(tensor)]
                if g is None:
                    raise RuntimeError(f"the tensor of tap {tap!r} is not on the loss's path in transformers' model")
                value = to_tap(g)
                if tuple(value.shape) != fixture.tap_shape(tap, fixture.case(name)):
                    raise RuntimeError(f"the gradient of tap {tap!r} has shape {tuple(value.shape)}")
                result[grad_name(tap)] = value.detach().contiguous().numpy().copy()
            for (pname, p), g in zip(params.items(), grads[len(unique):], strict=True):
                g = torch.zeros_like(p) if g is None else g
                result[grad_name(pname)] = g.detach().contiguous().numpy().copy()
            out[name] = result
        return out

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        import torch

        from parity_reference.backward import adamw_steps, case_loss
        from parity_reference.training import predicted_cells

        spec, model, params = _grad_model(fixture, self.name, precision, every=False)
        batch = [list(fixture.case(name).tokens) for name in spec.cases]
        total = sum(predicted_cells(len(tokens)) for tokens in batch)

        def loss_of_batch() -> Any:  # the batch's summed cross-entropy, case by case, over every predicted cell
            loss: Any = None
            for tokens in batch:
                full = _grad_forward(fixture, model, tokens, {})  # (1, T, V)
                part = case_loss(full[0], torch.tensor(tokens, dtype=torch.int64), reduction="sum")  # ()
                loss = part if loss is None else loss + part
            return loss / total  # ()

        return adamw_steps(params, spec, loss_of_batch)


Found = dict[str, tuple["torch.Tensor", Callable[["torch.Tensor"], "torch.Tensor"]]]  # tap -> (tensor, to the tap)


def _grad_model(fixture: Fixture, backend: str, precision: Precision,
                every: bool) -> tuple[TrainingSpec, Any, dict[str, Any]]:
    """The training spec, transformers' model of the fixture in the precision (as `run_cases` builds it), and the
    fixture's parameters as the model's own, by the fixture's names. `every`: every parameter of the model requires
    a gradient (a sinusoidal fixture's position table too, so that `hook_pos_embed` is on the graph); else the
    fixture's only (the ones AdamW trains)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    spec = training_spec(fixture, backend, precision)
    config: Any = fixture.model.config
    for name in spec.cases:
        if len(fixture.case(name).tokens) > config.n_ctx:
            raise FixtureError(f"case {name!r}: {len(fixture.case(name).tokens)} tokens, more than the context "
                               f"({config.n_ctx})")
    torch.set_num_threads(1)
    weights = fixture.weights()
    fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
    if fixture.family == "llama":
        model, prefix = hf_llama_model(weights, config, precision), ""
    else:
        model, prefix = hf_model(weights, config, precision), "transformer."
    model.requires_grad_(every)
    params = {name: model.get_parameter(prefix + name) for name in fixture.model.param_shapes()}
    for p in params.values():
        p.requires_grad_(True)
    return spec, model, params


def _grad_forward(fixture: Fixture, model: Any, tokens: list[int], found: Found) -> Any:
    """transformers' logits (1, T, V) of one case with autograd on, the tap tensors its hooks see put in `found`."""
    import torch

    if fixture.family == "llama":
        config: Any = fixture.model.config
        handles = _llama_grad_hooks(model, found, config)
    else:
        handles = _grad_hooks(model, found, fixture.config.n_head, fixture.config.d_head)
    try:
        with silenced(("transformers",)):
            full = model(input_ids=torch.tensor([tokens], dtype=torch.int64), use_cache=False).logits  # (1, T, V)
    finally:
        for h in handles:
            h.remove()
        if fixture.family == "llama":
            for layer in model.model.layers:
                layer.self_attn._parity_record = None
    found["logits"] = (full, lambda g: g[0])
    return full


def _first(value: Any) -> Any:
    """A module's output tensor (the first of a tuple), with its batch axis."""
    return value[0] if isinstance(value, tuple) else value


def _row(g: Any) -> Any:
    return g[0]  # (T, ...): batch row 0


def _heads(heads: int, dh: int) -> Callable[[Any], Any]:
    return lambda g: g[0].reshape(g.shape[1], heads, dh)  # (1, T, heads * dh) -> (T, heads, dh)


def _grad_hooks(model: Any, found: Found, H: int, dh: int) -> list[Any]:
    """Hooks on transformers' GPT-2 that keep, for each tap, the tensor on the loss's path it is read from."""
    tr = model.transformer
    handles: list[Any] = []

    def out(name: str, to_tap: Callable[[Any], Any] = _row, index: int = 0) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            found[name] = (output[index] if isinstance(output, tuple) else output, to_tap)
        return hook

    def inp(name: str, to_tap: Callable[[Any], Any] = _row) -> Any:
        def hook(_module: Any, args: Any, kwargs: Any) -> None:
            found[name] = (args[0] if args else kwargs["hidden_states"], to_tap)
        return hook

    def column_block(j: int) -> Callable[[Any], Any]:
        return lambda g: g[0, :, j * H * dh:(j + 1) * H * dh].reshape(g.shape[1], H, dh)  # (1, T, 3d) -> (T, H, dh)

    def qkv(b: str) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            for j, tap in enumerate("qkv"):  # q, k, v: column blocks of c_attn's output
                found[f"{b}.attn.hook_{tap}"] = (output, column_block(j))
        return hook

    handles.append(tr.wte.register_forward_hook(out("hook_embed")))
    handles.append(tr.wpe.register_forward_hook(out("hook_pos_embed", lambda g: g[0] if g.dim() == 3 else g)))
    for i, block in enumerate(tr.h):
        b = f"blocks.{i}"
        handles.append(block.register_forward_pre_hook(inp(f"{b}.hook_resid_pre"), with_kwargs=True))
        handles.append(block.attn.c_attn.register_forward_hook(qkv(b)))
        handles.append(block.attn.register_forward_hook(out(f"{b}.attn.hook_pattern", index=1)))
        handles.append(block.attn.c_proj.register_forward_pre_hook(inp(f"{b}.attn.hook_z", _heads(H, dh)),
                                                                   with_kwargs=True))
        handles.append(block.attn.register_forward_hook(out(f"{b}.hook_attn_out")))
        handles.append(block.ln_2.register_forward_pre_hook(inp(f"{b}.hook_resid_mid"), with_kwargs=True))
        handles.append(block.mlp.c_fc.register_forward_hook(out(f"{b}.mlp.hook_pre")))
        handles.append(block.mlp.act.register_forward_hook(out(f"{b}.mlp.hook_post")))
        handles.append(block.mlp.register_forward_hook(out(f"{b}.hook_mlp_out")))
        handles.append(block.register_forward_hook(out(f"{b}.hook_resid_post")))
    return handles


def _llama_grad_hooks(model: Any, found: Found, config: Any) -> list[Any]:
    """Hooks on transformers' Llama (and its attention function's recorder) keeping each tap's tensor."""
    dh = config.d_head
    handles: list[Any] = []

    def out(name: str, to_tap: Callable[[Any], Any] = _row) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            found[name] = (_first(output), to_tap)
        return hook

    def inp(name: str, to_tap: Callable[[Any], Any] = _row) -> Any:
        def hook(_module: Any, args: Any, kwargs: Any) -> None:
            found[name] = (args[0] if args else kwargs["hidden_states"], to_tap)
        return hook

    def attention(b: str) -> Any:
        def record(query: Any, key: Any, pattern: Any) -> None:
            found[f"{b}.attn.hook_rot_q"] = (query, lambda g: g[0].transpose(0, 1))  # (1, H, T, dh) -> (T, H, dh)
            found[f"{b}.attn.hook_rot_k"] = (key, lambda g: g[0].transpose(0, 1))  # (1, Hkv, T, dh)
            found[f"{b}.attn.hook_pattern"] = (pattern, _row)  # (1, H, T, T)
        return record

    handles.append(model.model.embed_tokens.register_forward_hook(out("hook_embed")))
    for i, layer in enumerate(model.model.layers):
        b, attn, mlp = f"blocks.{i}", layer.self_attn, layer.mlp
        handles.append(layer.register_forward_pre_hook(inp(f"{b}.hook_resid_pre"), with_kwargs=True))
        handles.append(attn.q_proj.register_forward_hook(out(f"{b}.attn.hook_q", _heads(config.n_head, dh))))
        handles.append(attn.k_proj.register_forward_hook(out(f"{b}.attn.hook_k", _heads(config.n_kv_heads, dh))))
        handles.append(attn.v_proj.register_forward_hook(out(f"{b}.attn.hook_v", _heads(config.n_kv_heads, dh))))
        attn._parity_record = attention(b)
        handles.append(attn.o_proj.register_forward_pre_hook(inp(f"{b}.attn.hook_z", _heads(config.n_head, dh)),
                                                             with_kwargs=True))
        handles.append(attn.register_forward_hook(out(f"{b}.hook_attn_out")))
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(inp(f"{b}.hook_resid_mid"),
                                                                               with_kwargs=True))
        handles.append(mlp.gate_proj.register_forward_hook(out(f"{b}.mlp.hook_pre")))
        handles.append(mlp.up_proj.register_forward_hook(out(f"{b}.mlp.hook_pre_linear")))
        handles.append(mlp.down_proj.register_forward_pre_hook(inp(f"{b}.mlp.hook_post"), with_kwargs=True))
        handles.append(mlp.register_forward_hook(out(f"{b}.hook_mlp_out")))
        handles.append(layer.register_forward_hook(out(f"{b}.hook_resid_post")))
    return handles


def _cases(fixture: Fixture, config: Any, precision: Precision, wanted: set[str],
           install_hooks: Callable[[dict[str, torch.Tensor]], list[Any]], unembed: Callable[[Any], Any],
           model: Any, after: Callable[[], None] = lambda: None) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """Every case through transformers' model, its taps recorded by `install_hooks`, for either family: the
    logits, probs and the logit lens (`unembed`: transformers' final norm and lm_head, every stream's rows in
    one product, the (V, d) table read once, not once per stream). `after` runs when a case's hooks are removed."""
    import torch

    lens_rows = fixture.lens_rows()
    for case in fixture.cases:
        # Bad input is one clear line (a ParityError), never transformers' IndexError.
        if not 1 <= len(case.tokens) <= config.n_ctx:
            raise FixtureError(f"case {case.name!r}: {len(case.tokens)} tokens, expected 1 to {config.n_ctx}")
        bad = [t for t in case.tokens if not 0 <= t < config.vocab_size]
        if bad:
            raise FixtureError(f"case {case.name!r}: token id {bad[0]} out of range [0, {config.vocab_size})")
        taps: dict[str, torch.Tensor] = {}
        handles = install_hooks(taps)
        try:
            with silenced(("transformers",)), torch.no_grad():
                tokens = torch.tensor([case.tokens], dtype=torch.int64)  # (1, T)
                logits = model(input_ids=tokens, use_cache=False).logits[0]  # (T, V)
                taps["logits"] = logits
                last = slice(None) if lens_rows is None else slice(-lens_rows, None)
                taps["probs"] = torch.softmax(logits[last], dim=-1)  # (rows, V)
                streams = [taps[f"blocks.{i}.hook_resid_pre"] for i in range(config.n_layer)]
                streams.append(taps[f"blocks.{config.n_layer - 1}.hook_resid_post"])
                kept = [stream[last] for stream in streams]  # L + 1 of (rows, d)
                lens = unembed(torch.cat(kept))  # ((L + 1) * rows, V)
                for k, part in enumerate(lens.split(kept[0].shape[0])):
                    taps[f"logit_lens.{k}"] = torch.softmax(part, dim=-1)  # (rows, V)
        finally:
            for h in handles:
                h.remove()
            after()
        # fp16 and bf16 taps leave as float32 arrays holding the same values (exact: a widening cast).
        widen = precision in ("fp16", "bf16")
        yield case.name, {tap: (t.detach().to(torch.float32) if widen else t.detach()).contiguous().numpy().copy()
                          for tap, t in taps.items() if tap in wanted}


def _hooks(model: Any, taps: dict[str, torch.Tensor], H: int, dh: int) -> list[Any]:
    """Forward hooks on transformers' modules that record the taps of one sequence (batch of 1)."""
    tr = model.transformer
    handles: list[Any] = []

    def out(name: str, reshape: bool = False, index: int | None = None) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            value = (output[index] if index is not None else output[0] if isinstance(output, tuple) else output)[0]
            taps[name] = value.reshape(value.shape[0], H, dh) if reshape else value
        return hook

    def inp(name: str, reshape: bool = False) -> Any:
        def hook(_module: Any, args: Any, kwargs: Any) -> None:
            value = (args[0] if args else kwargs["hidden_states"])[0]
            taps[name] = value.reshape(value.shape[0], H, dh) if reshape else value
        return hook

    def qkv(name: str) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            q, k, v = output[0].split(H * dh, dim=-1)  # 3 x (T, d)
            for tap, value in (("q", q), ("k", k), ("v", v)):
                taps[f"{name}.attn.hook_{tap}"] = value.reshape(value.shape[0], H, dh)  # (T, H, dh)
        return hook

    handles.append(tr.wte.register_forward_hook(out("hook_embed")))
    handles.append(tr.wpe.register_forward_hook(out("hook_pos_embed")))
    for i, block in enumerate(tr.h):
        b = f"blocks.{i}"
        handles.append(block.register_forward_pre_hook(inp(f"{b}.hook_resid_pre"), with_kwargs=True))
        handles.append(block.attn.c_attn.register_forward_hook(qkv(b)))
        handles.append(block.attn.register_forward_hook(out(f"{b}.attn.hook_pattern", index=1)))
        handles.append(block.attn.c_proj.register_forward_pre_hook(inp(f"{b}.attn.hook_z", reshape=True),
                                                                   with_kwargs=True))
        handles.append(block.attn.register_forward_hook(out(f"{b}.hook_attn_out", index=0)))
        handles.append(block.ln_2.register_forward_pre_hook(inp(f"{b}.hook_resid_mid"), with_kwargs=True))
        handles.append(block.mlp.c_fc.register_forward_hook(out(f"{b}.mlp.hook_pre")))
        handles.append(block.mlp.act.register_forward_hook(out(f"{b}.mlp.hook_post")))
        handles.append(block.mlp.register_forward_hook(out(f"{b}.hook_mlp_out")))
        handles.append(block.register_forward_hook(out(f"{b}.hook_resid_post")))
    return handles


# -- the Llama family: LlamaForCausalLM --------------------------------------------------------------------------

# The taps transformers' Llama never materializes are GPT-2's UNEXPOSED and ln_final's: RMSNorm's scale and
# normalized values (one fused expression) and the pre-softmax scores (inside the attention function).
ATTENTION = "parity_eager"  # transformers' eager attention, registered under this name to see its inputs


def _llama_declines(fixture: Fixture) -> str | None:
    config: Any = fixture.model.config  # a LlamaConfig
    if not config.causal:
        return "transformers' Llama is always causal; this fixture has causal=false"
    if config.rope_pairing != "half":
        return ("transformers' Llama rotates half-split pairs (rotate_half); this fixture has rope_pairing="
                f"{config.rope_pairing!r}")
    return None


def hf_llama_config(config: Any) -> Any:
    """transformers' LlamaConfig for a parity LlamaConfig: eager attention, no dropout, default RoPE."""
    from transformers import LlamaConfig as HFLlamaConfig

    cfg = HFLlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_mlp,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, num_key_value_heads=config.n_kv_heads,
        head_dim=config.d_head, max_position_embeddings=config.n_ctx, rms_norm_eps=config.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base}, hidden_act="silu",
        attention_bias=config.bias, mlp_bias=False, tie_word_embeddings=config.tied, attention_dropout=0.0,
        use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    cfg._attn_implementation = "eager"
    return cfg


def _rms_norm_float64(self: Any, hidden_states: Any) -> Any:
    """LlamaRMSNorm.forward without its float32 island (`hidden_states.to(torch.float32)`)."""
    import torch

    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_float64(self: Any, x: Any, position_ids: Any) -> Any:
    """LlamaRotaryEmbedding.forward with inv_freq, the angles, cos and sin in float64 (not `.float()`)."""
    import torch

    dim = 2 * self.inv_freq.shape[0]
    base = torch.tensor(float(self.config.rope_parameters["rope_theta"]), dtype=torch.float64)
    inv_freq = torch.pow(base, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dh/2,)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (1, T, dh/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (1, T, dh)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float,
               dropout: float = 0.0, **kwargs: Any) -> Any:
    """transformers' `eager_attention_forward`, its inputs (q and k after RoPE) and pattern recorded; in a float64
    model its softmax in float64 (transformers' takes it in float32, `dtype=torch.float32`)."""
    import torch
    from transformers.models.llama import modeling_llama

    if query.dtype == torch.float64:
        keys = modeling_llama.repeat_kv(key, module.num_key_value_groups)  # (1, H, T, dh)
        values = modeling_llama.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, keys.transpose(2, 3)) * scaling  # (1, H, T, T)
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.softmax(weights, dim=-1)
        out, pattern = torch.matmul(weights, values).transpose(1, 2).contiguous(), weights
    else:
        out, pattern = modeling_llama.eager_attention_forward(module, query, key, value, attention_mask, scaling,
                                                              dropout=dropout, **kwargs)
    record = getattr(module, "_parity_record", None)
    if record is not None:
        record(query, key, pattern)
    return out, pattern


def hf_llama_model(weights: dict[str, np.ndarray], config: Any, precision: Precision) -> Any:
    """A LlamaForCausalLM in eval mode holding the fixture's weights (Hugging Face names) in the precision's dtype.

    In fp64 the three steps transformers computes in float32 inside a float64 model (RMSNorm, the RoPE tables,
    the eager softmax) are computed in float64, on this model's own modules only (no class is patched).
    """
    import types

    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from parity_reference.run import torch_dtype

    with silenced(("transformers",)):
        from transformers import AutoModelForCausalLM
    # Idempotent: the same functions under the same name. The mask must be registered too: transformers gives an
    # attention function it has no mask function for no mask at all (every position sees the future).
    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)
    dtype = torch_dtype(precision)
    state = {k: torch.tensor(weights.pop(k), dtype=dtype) for k in list(weights)}
    if config.tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with silenced(("transformers",)), torch.device("meta"):
        model = cast(Any, AutoModelForCausalLM).from_config(hf_llama_config(config)).to(dtype)
    model.config.dtype = dtype
    model.config._attn_implementation = ATTENTION
    model.load_state_dict(state, strict=False, assign=True)
    if config.tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    # The RoPE module's inv_freq is a non-persistent buffer: made again, for real, from the config.
    with silenced(("transformers",)):
        rotary = type(model.model.rotary_emb)(model.config)
    model.model.rotary_emb = rotary  # its inv_freq in float32, as transformers keeps it
    model = model.eval()
    if precision == "fp64":
        model.model.rotary_emb.forward = types.MethodType(_rope_float64, model.model.rotary_emb)
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = types.MethodType(_rms_norm_float64, module)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    left = [n for n, t in tensors if t.is_meta]
    if left:
        raise RuntimeError(f"transformers' Llama has tensors the fixture does not fill: {left[:3]}")
    other = [f"{n} ({t.dtype})" for n, t in model.named_parameters() if t.dtype != dtype]
    if other:
        raise RuntimeError(f"transformers' Llama holds parameters outside {dtype}: {other[:3]}")
    return model


def _weights_for(fixture: Fixture, precision: Precision) -> tuple[dict[str, np.ndarray], Precision]:
    """The weights a run computes from and the dtype it computes in: the fixture's in the precision, or for the
    stored format f16 the weights as float16 stores them (stored_weights.py), in float32."""
    if is_stored(precision):
        from parity_harness._fixture.stored_weights import stored_weights

        return stored_weights(fixture, precision), "fp32"
    return fixture.weights(), precision


def _llama_run_cases(fixture: Fixture, precision: Precision,
                     wanted: set[str]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    config = fixture.model.config
    weights, precision = _weights_for(fixture, precision)
    fixture.release_weights()
    model = hf_llama_model(weights, config, precision)

    def forget() -> None:  # the attention function's recorder, set by _llama_hooks
        for layer in model.model.layers:
            layer.self_attn._parity_record = None

    yield from _cases(fixture, config, precision, wanted, lambda taps: _llama_hooks(model, taps, config),
                      lambda x: model.lm_head(model.model.norm(x)), model, forget)


def _llama_hooks(model: Any, taps: dict[str, torch.Tensor], config: Any) -> list[Any]:
    """Forward hooks on transformers' Llama modules (and its attention function) recording one sequence's taps."""
    dh = config.d_head
    handles: list[Any] = []

    def first(value: Any) -> Any:
        return (value[0] if isinstance(value, tuple) else value)[0]  # the module's output, batch row 0

    def out(name: str, heads: int | None = None) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            value = first(output)
            taps[name] = value if heads is None else value.reshape(value.shape[0], heads, dh)
        return hook

    def inp(name: str, heads: int | None = None) -> Any:
        def hook(_module: Any, args: Any, kwargs: Any) -> None:
            value = (args[0] if args else kwargs["hidden_states"])[0]
            taps[name] = value if heads is None else value.reshape(value.shape[0], heads, dh)
        return hook

    def attention(b: str) -> Any:
        def record(query: Any, key: Any, pattern: Any) -> None:
            taps[f"{b}.attn.hook_rot_q"] = query[0].transpose(0, 1)  # (T, H, dh)
            taps[f"{b}.attn.hook_rot_k"] = key[0].transpose(0, 1)  # (T, Hkv, dh)
            taps[f"{b}.attn.hook_pattern"] = pattern[0]  # (H, T, T)
        return record

    handles.append(model.model.embed_tokens.register_forward_hook(out("hook_embed")))
    for i, layer in enumerate(model.model.layers):
        b, attn, mlp = f"blocks.{i}", layer.self_attn, layer.mlp
        handles.append(layer.register_forward_pre_hook(inp(f"{b}.hook_resid_pre"), with_kwargs=True))
        handles.append(attn.q_proj.register_forward_hook(out(f"{b}.attn.hook_q", config.n_head)))
        handles.append(attn.k_proj.register_forward_hook(out(f"{b}.attn.hook_k", config.n_kv_heads)))
        handles.append(attn.v_proj.register_forward_hook(out(f"{b}.attn.hook_v", config.n_kv_heads)))
        attn._parity_record = attention(b)
        handles.append(attn.o_proj.register_forward_pre_hook(inp(f"{b}.attn.hook_z", config.n_head),
                                                             with_kwargs=True))
        handles.append(attn.register_forward_hook(out(f"{b}.hook_attn_out")))
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(inp(f"{b}.hook_resid_mid"),
                                                                               with_kwargs=True))
        handles.append(mlp.gate_proj.register_forward_hook(out(f"{b}.mlp.hook_pre")))
        handles.append(mlp.up_proj.register_forward_hook(out(f"{b}.mlp.hook_pre_linear")))
        handles.append(mlp.down_proj.register_forward_pre_hook(inp(f"{b}.mlp.hook_post"), with_kwargs=True))
        handles.append(mlp.register_forward_hook(out(f"{b}.hook_mlp_out")))
        handles.append(layer.register_forward_hook(out(f"{b}.hook_resid_post")))
    return handles
