// The model's building blocks on values that can be checked by hand.

import assert from "node:assert/strict";
import { test } from "node:test";

import { argmax, decode, gelu, geluNew, layerNorm, paramShapes, parseConfig, runWithTaps, sinusoidalPositions, tapNames } from "../model/model.ts";
import type { GPTConfig, Taps, Tensor } from "../model/model.ts";

const TOY: GPTConfig = {
  vocab_size: 12, n_ctx: 16, d_model: 8, n_layer: 2, n_head: 2, d_mlp: 32,
  positions: "sinusoidal", ln_eps: 1e-5, causal: true,
};

const t = (shape: number[], values: number[]): Tensor => ({ shape, data: Float64Array.from(values) });

test("sinusoidal positions: sin on even columns, cos on odd, inv_freq = 10000 ** (-2i/d)", () => {
  const p = sinusoidalPositions(3, 4);
  assert.deepEqual([...p.data.subarray(0, 4)], [0, 1, 0, 1]);
  assert.equal(p.data[4 * 2 + 0], Math.sin(2));
  assert.equal(p.data[4 * 2 + 3], Math.cos(2 * Math.pow(10000, -2 / 4)));
});

test("layerNorm: biased variance, TransformerLens scale and normalized taps", () => {
  const taps: Taps = new Map();
  const out = layerNorm(t([1, 2], [1, 3]), t([2], [2, 2]), t([2], [1, 1]), 0, taps, "ln");
  assert.deepEqual([...taps.get("ln.hook_scale")!.data], [1]); // var = 1 (divide by d)
  assert.deepEqual([...taps.get("ln.hook_normalized")!.data], [-1, 1]);
  assert.deepEqual([...out.data], [-1, 3]);
});

test("gelu is the exact one", () => {
  const y = gelu(t([3], [0, 1, -1])).data;
  assert.equal(y[0], 0);
  assert.ok(Math.abs(y[1]! - 0.8413447460685429) < 1e-16); // Phi(1), not tanh's 0.8411920
  assert.ok(Math.abs(y[2]! + 0.15865525393145707) < 1e-16);
});

test("geluNew is GPT-2's tanh GELU, not the exact one", () => {
  const y = geluNew(t([3], [0, 1, -1])).data;
  assert.equal(y[0], 0);
  // transformers NewGELUActivation in float64; Phi(1) would be 0.8413447
  assert.ok(Math.abs(y[1]! - 0.8411919906082768) < 1e-16);
  assert.ok(Math.abs(y[2]! + 0.1588080093917233) < 1e-16);
});

test("config: validated like parity_reference.config.GPTConfig", () => {
  assert.deepEqual(parseConfig({ ...TOY }), TOY);
  assert.throws(() => parseConfig({ ...TOY, extra: 1 }), /unknown config keys: extra/);
  assert.throws(() => parseConfig({ ...TOY, n_head: 3 }), /not divisible/);
  assert.throws(() => parseConfig({ ...TOY, positions: "rotary" }), /positions must be/);
  const { causal: _, ...noCausal } = TOY;
  assert.throws(() => parseConfig(noCausal), /missing config keys: causal/);
  assert.deepEqual(parseConfig({ ...TOY, activation: "gelu_new" }), { ...TOY, activation: "gelu_new" }); // optional
  assert.throws(() => parseConfig({ ...TOY, activation: "relu" }), /activation must be 'gelu' or 'gelu_new'/);
});

test("the parameter count matches the seed's table (1,856 for the toy)", () => {
  let n = 0;
  for (const shape of paramShapes(TOY).values()) n += shape.reduce((a, b) => a * b, 1);
  assert.equal(n, 1856);
  const gpt2 = { ...TOY, vocab_size: 50257, n_ctx: 1024, d_model: 768, n_layer: 12, n_head: 12, d_mlp: 3072, positions: "learned" as const };
  n = 0;
  for (const shape of paramShapes(gpt2).values()) n += shape.reduce((a, b) => a * b, 1);
  assert.equal(n, 124439808);
});

test("a forward pass records every tap, in dataflow order, with masked scores at -inf", () => {
  const params = new Map<string, Tensor>();
  let seed = 1;
  const rand = (): number => ((seed = (seed * 16807) % 2147483647) / 2147483647 - 0.5) * 0.1;
  for (const [name, shape] of paramShapes(TOY)) {
    params.set(name, { shape, data: Float64Array.from({ length: shape.reduce((a, b) => a * b, 1) }, rand) });
  }
  const taps = runWithTaps(params, TOY, [0, 3, 5]);
  assert.deepEqual([...taps.keys()], tapNames(2));
  const scores = taps.get("blocks.0.attn.hook_attn_scores")!;
  assert.deepEqual(scores.shape, [2, 3, 3]);
  assert.equal(scores.data[0 * 9 + 0 * 3 + 1], -Infinity);
  const probs = taps.get("probs")!.data;
  for (let r = 0; r < 3; r++) {
    const sum = probs.subarray(r * 12, (r + 1) * 12).reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(sum - 1) < 1e-15);
  }
});

test("decode: each step's logits and cache equal the full forward's, layout [H, T, d_head]", () => {
  let seed = 12345; // a small LCG: reproducible random weights, no dependency
  const rand = (): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) * 0.6;
  const params = new Map<string, Tensor>();
  for (const [name, shape] of paramShapes(TOY)) {
    params.set(name, { shape, data: Float64Array.from({ length: shape.reduce((a, b) => a * b, 1) }, rand) });
  }
  const tokens = [0, 1, 4, 7, 1, 6];
  const steps = decode(params, TOY, tokens.slice(0, 2), 4, tokens.slice(2));
  const [H, dh, V] = [TOY.n_head, TOY.d_model / TOY.n_head, TOY.vocab_size];
  steps.forEach((step, k) => {
    const T = 2 + k;
    const taps = runWithTaps(params, TOY, tokens.slice(0, T));
    const logits = taps.get("logits")!.data.subarray((T - 1) * V);
    step.logits.data.forEach((x, j) => assert.ok(Math.abs(x - logits[j]!) < 1e-12, `step ${k} logit ${j}`));
    const hookK = taps.get("blocks.1.attn.hook_k")!.data; // (T, H, dh)
    assert.deepEqual(step.cache[1]!.k.shape, [H, T, dh]);
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) {
        for (let e = 0; e < dh; e++) {
          const got = step.cache[1]!.k.data[(h * T + t) * dh + e]!;
          assert.ok(Math.abs(got - hookK[(t * H + h) * dh + e]!) < 1e-12, `step ${k} cache_k [${h}, ${t}, ${e}]`);
        }
      }
    }
  });
  assert.equal(argmax({ shape: [3], data: Float64Array.from([1, 3, 3]) }), 1); // the first maximum, as torch
});
