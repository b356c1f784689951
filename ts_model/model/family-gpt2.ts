// The gpt2 family's tap table, generated from reference/parity_reference/families/gpt2.json by
// `python -m parity_reference.families --typescript gpt2 > ts_model/model/family-gpt2.ts`.
// Do not edit: tests/families/test_families.py checks this file equals what the table generates.

import type { FamilyTable } from "./families.ts";

export const GPT2_FAMILY: FamilyTable = {
  "family": "gpt2",
  "indices": {"i": "n_layer", "k": "n_layer + 1"},
  "taps": [
    {"name": "hook_embed", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": null, "sublayer": null},
    {"name": "hook_pos_embed", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": null, "sublayer": null},
    {"name": "blocks.{i}.hook_resid_pre", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": null},
    {"name": "blocks.{i}.ln1.hook_scale", "shape": ["T", 1], "axes": ["position", "scale"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.ln1.hook_normalized", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": "layernorm", "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_q", "shape": ["T", "n_head", "d_head"], "axes": ["position", "head", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_k", "shape": ["T", "n_head", "d_head"], "axes": ["position", "head", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_v", "shape": ["T", "n_head", "d_head"], "axes": ["position", "head", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_attn_scores", "shape": ["n_head", "T", "T"], "axes": ["head", "position", "key_position"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_pattern", "shape": ["n_head", "T", "T"], "axes": ["head", "position", "key_position"], "rows": "position", "bounds": "probability", "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.attn.hook_z", "shape": ["T", "n_head", "d_head"], "axes": ["position", "head", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.hook_attn_out", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.hook_resid_mid", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "attn"},
    {"name": "blocks.{i}.ln2.hook_scale", "shape": ["T", 1], "axes": ["position", "scale"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "mlp"},
    {"name": "blocks.{i}.ln2.hook_normalized", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": "layernorm", "layer": "i", "sublayer": "mlp"},
    {"name": "blocks.{i}.mlp.hook_pre", "shape": ["T", "d_mlp"], "axes": ["position", "neuron"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "mlp"},
    {"name": "blocks.{i}.mlp.hook_post", "shape": ["T", "d_mlp"], "axes": ["position", "neuron"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "mlp"},
    {"name": "blocks.{i}.hook_mlp_out", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "mlp"},
    {"name": "blocks.{i}.hook_resid_post", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": null, "layer": "i", "sublayer": "mlp"},
    {"name": "ln_final.hook_scale", "shape": ["T", 1], "axes": ["position", "scale"], "rows": "position", "bounds": null, "layer": null, "sublayer": "unembed"},
    {"name": "ln_final.hook_normalized", "shape": ["T", "d_model"], "axes": ["position", "dim"], "rows": "position", "bounds": "layernorm", "layer": null, "sublayer": "unembed"},
    {"name": "logits", "shape": ["T", "vocab_size"], "axes": ["position", "token"], "rows": "position", "bounds": null, "layer": null, "sublayer": "unembed"},
    {"name": "probs", "shape": ["T", "vocab_size"], "axes": ["position", "token"], "rows": "position", "bounds": "probability", "layer": null, "sublayer": null},
    {"name": "logit_lens.{k}", "shape": ["T", "vocab_size"], "axes": ["position", "token"], "rows": "position", "bounds": "probability", "layer": null, "sublayer": null},
  ],
};
