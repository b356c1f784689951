// backward.ts against finite differences on a tiny random model: every parameter's gradient, each function's input
// gradient, and the tap gradients through the identities that tie them to the parameters'; then AdamW's step.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  adamwStep, attentionBackward, backward, backwardNames, batchBackward, crossEntropyBackward, geluBackward,
  geluNewBackward, layerNormBackward, softmaxBackward, train,
} from "../model/backward.ts";
import type { TrainingSpec } from "../model/backward.ts";
import { attention, forward, gelu, geluNew, layerNorm, paramShapes, tapNames } from "../model/model.ts";
import type { GPTConfig, Params, Taps, Tensor } from "../model/model.ts";
import { values } from "./test-values.ts";

const BASE: GPTConfig = {
  vocab_size: 7, n_ctx: 6, d_model: 4, n_layer: 2, n_head: 2, d_mlp: 8,
  positions: "sinusoidal", ln_eps: 1e-5, causal: true,
};
// The lesson's model; GPT-2's learned positions, tanh GELU, and the unmasked experiment.
const CONFIGS: readonly [string, GPTConfig][] = [
  ["sinusoidal, causal, exact GELU", BASE],
  ["learned, unmasked, gelu_new", { ...BASE, positions: "learned", causal: false, activation: "gelu_new" }],
];
const TOKENS = [3, 1, 4, 1, 5]; // a repeated token: the lookup's gradient adds up on its row
const H = 1e-5; // the central difference's step: truncation ~1e-10, round-off ~1e-11

/** Random parameters: matrices and biases in [-0.5, 0.5), LayerNorm gains in [0.75, 1.25). */
function randomParams(config: GPTConfig, seed: number): Map<string, Tensor> {
  const params = new Map<string, Tensor>();
  let s = seed;
  for (const [name, shape] of paramShapes(config)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const data = values(n, s++).map((x) => (/ln_\d\.weight$|ln_f\.weight$/.test(name) ? 1 + x / 4 : x / 2));
    params.set(name, { shape, data });
  }
  return params;
}

/** The case's loss, written out here: mean over t < T - 1 of -ln softmax(logits[t])[tokens[t + 1]]. */
function lossOf(params: Params, config: GPTConfig, tokens: readonly number[]): number {
  const logits = forward(params, config, tokens); // (T, V)
  const V = config.vocab_size;
  let sum = 0;
  for (let t = 0; t < tokens.length - 1; t++) {
    const row = Array.from(logits.data.subarray(t * V, (t + 1) * V));
    const max = Math.max(...row);
    sum += Math.log(row.reduce((a, x) => a + Math.exp(x - max), 0)) - (row[tokens[t + 1]!]! - max);
  }
  return sum / (tokens.length - 1);
}

/** Central differences of f over every entry of `x` (changed in place, restored). */
function numericGrad(x: Float64Array, f: () => number): Float64Array {
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const keep = x[i]!;
    x[i] = keep + H;
    const up = f();
    x[i] = keep - H;
    const down = f();
    x[i] = keep;
    out[i] = (up - down) / (2 * H);
  }
  return out;
}

/** The largest |a - b| over the largest |b| (1 when b is all zero): what each check bounds. */
function relErr(a: Float64Array, b: Float64Array): number {
  assert.equal(a.length, b.length);
  let err = 0;
  let max = 0;
  for (let i = 0; i < a.length; i++) {
    err = Math.max(err, Math.abs(a[i]! - b[i]!));
    max = Math.max(max, Math.abs(b[i]!));
  }
  return err / (max > 0 ? max : 1);
}

const FD_TOL = 1e-7; // relative to each tensor's largest value; a wrong adjoint is off by O(1)

/** The sum over rows of a (T, m) tensor, or of its columns [from, from + m) when it is wider. */
function sumRows(t: Tensor, from = 0, m = t.shape[t.shape.length - 1]!): Float64Array {
  const width = t.data.length / t.shape[0]!;
  const out = new Float64Array(m);
  for (let r = 0; r < t.shape[0]!; r++) for (let j = 0; j < m; j++) out[j] += t.data[r * width + from + j]!;
  return out;
}

for (const [label, config] of CONFIGS) {
  test(`every parameter's gradient matches finite differences (${label})`, () => {
    const params = randomParams(config, 7);
    const { loss, grads } = backward(params, config, TOKENS);
    assert.ok(Math.abs(loss - lossOf(params, config, TOKENS)) < 1e-14);
    for (const name of paramShapes(config).keys()) {
      const g = grads.get(name + ".grad")!;
      const fd = numericGrad(params.get(name)!.data, () => lossOf(params, config, TOKENS));
      const err = relErr(g.data, fd);
      assert.ok(err < FD_TOL, `${name}.grad: ${err.toExponential(2)} off finite differences`);
    }
  });

  test(`tap gradients: every name in backward order, each the adjoint its parameters say (${label})`, () => {
    const params = randomParams(config, 11);
    const { grads } = backward(params, config, TOKENS);
    assert.deepEqual([...grads.keys()], backwardNames(config));
    const T = TOKENS.length;
    const d = config.d_model;
    const onPath = tapNames(config.n_layer).filter((t) => t !== "probs" && !t.startsWith("logit_lens."));
    assert.equal(grads.size, onPath.length + paramShapes(config).size);
    const g = (name: string): Tensor => grads.get(name + ".grad")!;
    const close = (a: Float64Array, b: Float64Array, what: string): void => {
      const err = relErr(a, b);
      assert.ok(err < 1e-13, `${what}: ${err.toExponential(2)}`);
    };
    // Biases: each is the sum over positions of the gradient of the tap it is added into.
    for (let i = 0; i < config.n_layer; i++) {
      const b = `blocks.${i}`;
      close(g(`h.${i}.mlp.c_proj.bias`).data, sumRows(g(`${b}.hook_mlp_out`)), `${b} mlp_out`);
      close(g(`h.${i}.attn.c_proj.bias`).data, sumRows(g(`${b}.hook_attn_out`)), `${b} attn_out`);
      close(g(`h.${i}.mlp.c_fc.bias`).data, sumRows(g(`${b}.mlp.hook_pre`)), `${b} mlp pre`);
      const qkv = g(`h.${i}.attn.c_attn.bias`).data;
      close(qkv.subarray(0, d), sumRows({ shape: [T, d], data: g(`${b}.attn.hook_q`).data }), `${b} q`);
      // The key bias shifts every score of a query by the same amount: softmax ignores it, its gradient is 0 (round-off).
      const scaleOf = Math.max(...qkv.map(Math.abs));
      assert.ok(qkv.subarray(d, 2 * d).every((v) => Math.abs(v) < 1e-14 * scaleOf), `${b} key bias`);
      close(qkv.subarray(2 * d), sumRows({ shape: [T, d], data: g(`${b}.attn.hook_v`).data }), `${b} v`);
      // The residual stream: resid_post feeds the next block (or the final LayerNorm) unchanged.
      if (i + 1 < config.n_layer) close(g(`${b}.hook_resid_post`).data, g(`blocks.${i + 1}.hook_resid_pre`).data, b);
      close(g(`${b}.hook_attn_out`).data, g(`${b}.hook_resid_mid`).data, `${b} attn_out = resid_mid`);
    }
    close(g("hook_embed").data, g("blocks.0.hook_resid_pre").data, "embed");
    close(g("hook_pos_embed").data, g("hook_embed").data, "pos_embed");
    // The logits' gradient: (softmax - onehot) / (T - 1) on predicted rows, and the last row 0.
    const V = config.vocab_size;
    const dl = g("logits").data;
    for (let j = 0; j < V; j++) assert.ok(dl[(T - 1) * V + j] === 0);
    const taps: Taps = new Map();
    forward(params, config, TOKENS, taps);
    const pattern = taps.get("blocks.0.attn.hook_pattern")!;
    const scoresGrad = g("blocks.0.attn.hook_attn_scores").data;
    for (let i = 0; i < pattern.data.length; i++) if (pattern.data[i] === 0) assert.ok(scoresGrad[i] === 0); // 0 or -0
  });
}

test("learned positions: wpe's gradient is hook_pos_embed's on the first T rows, 0 after", () => {
  const config = CONFIGS[1]![1];
  const { grads } = backward(randomParams(config, 3), config, TOKENS);
  const wpe = grads.get("wpe.weight.grad")!.data;
  const pos = grads.get("hook_pos_embed.grad")!.data;
  assert.deepEqual([...wpe.subarray(0, pos.length)], [...pos]);
  assert.ok(wpe.subarray(pos.length).every((x) => x === 0));
});

test("crossEntropyBackward: dlogits match finite differences of the loss", () => {
  const logits: Tensor = { shape: [4, 5], data: values(20, 5).map((x) => 3 * x) };
  const tokens = [0, 4, 2, 2];
  const f = (): number => crossEntropyBackward(logits, tokens).loss;
  const { dlogits } = crossEntropyBackward(logits, tokens);
  assert.ok(relErr(dlogits.data, numericGrad(logits.data, f)) < FD_TOL);
  assert.throws(() => crossEntropyBackward({ shape: [1, 5], data: new Float64Array(5) }, [0]), /predicts nothing/);
});

test("layerNormBackward: dx, dweight, dbias and the scale's adjoint match finite differences", () => {
  const [T, d] = [3, 5];
  const x: Tensor = { shape: [T, d], data: values(T * d, 21) };
  const w: Tensor = { shape: [d], data: values(d, 22).map((v) => 1 + v / 2) };
  const b: Tensor = { shape: [d], data: values(d, 23) };
  const r = values(T * d, 24); // L = sum(out * r): dout = r
  const L = (): number => layerNorm(x, w, b, 1e-5, null, "").data.reduce((a, v, i) => a + v * r[i]!, 0);
  const taps: Taps = new Map();
  layerNorm(x, w, b, 1e-5, taps, "ln");
  const normalized = taps.get("ln.hook_normalized")!;
  const scale = taps.get("ln.hook_scale")!;
  const back = layerNormBackward({ shape: [T, d], data: r }, normalized, scale, w);
  assert.ok(relErr(back.dx.data, numericGrad(x.data, L)) < FD_TOL);
  assert.ok(relErr(back.dweight.data, numericGrad(w.data, L)) < FD_TOL);
  assert.ok(relErr(back.dbias.data, numericGrad(b.data, L)) < FD_TOL);
  // hook_scale's gradient: the adjoint of scale in normalized = centered / scale, centered held.
  const centered = normalized.data.map((v, i) => v * scale.data[Math.floor(i / d)]!);
  const s = Float64Array.from(scale.data);
  const viaScale = (): number => centered.reduce((a, c, i) => a + (c / s[Math.floor(i / d)]!) * w.data[i % d]! * r[i]!, 0);
  assert.ok(relErr(back.dscale.data, numericGrad(s, viaScale)) < FD_TOL);
});

test("geluBackward and geluNewBackward: the derivative of each GELU, not of the other", () => {
  const x: Tensor = { shape: [1, 12], data: values(12, 31).map((v) => 4 * v) };
  const dy: Tensor = { shape: [1, 12], data: values(12, 32) };
  for (const [fwd, bwd] of [[gelu, geluBackward], [geluNew, geluNewBackward]] as const) {
    const L = (): number => fwd(x).data.reduce((a, v, i) => a + v * dy.data[i]!, 0);
    assert.ok(relErr(bwd(x, dy).data, numericGrad(x.data, L)) < FD_TOL);
  }
  assert.ok(relErr(geluBackward(x, dy).data, geluNewBackward(x, dy).data) > 1e-5); // they differ
});

test("softmaxBackward: the Jacobian of softmax, from its output", () => {
  const x: Tensor = { shape: [2, 4], data: values(8, 41).map((v) => 2 * v) };
  const dp = values(8, 42);
  const softmax = (): Float64Array => {
    const out = new Float64Array(8);
    for (let r = 0; r < 8; r += 4) {
      const row = x.data.subarray(r, r + 4);
      const max = Math.max(...row);
      const e = row.map((v) => Math.exp(v - max));
      const sum = e.reduce((a, v) => a + v, 0);
      e.forEach((v, j) => (out[r + j] = v / sum));
    }
    return out;
  };
  const got = softmaxBackward({ shape: [2, 4], data: softmax() }, { shape: [2, 4], data: dp });
  const L = (): number => softmax().reduce((a, v, i) => a + v * dp[i]!, 0);
  assert.ok(relErr(got.data, numericGrad(x.data, L)) < FD_TOL);
});

test("attentionBackward: the input's and the parameters' gradients match finite differences", () => {
  const config = BASE;
  const params = randomParams(config, 51);
  const T = 4;
  const x: Tensor = { shape: [T, config.d_model], data: values(T * config.d_model, 52) };
  const r = values(T * config.d_model, 53);
  const L = (): number => attention(x, params, "h.0.attn.", config, null, "").data.reduce((a, v, i) => a + v * r[i]!, 0);
  const taps: Taps = new Map();
  attention(x, params, "h.0.attn.", config, taps, "a");
  const back = attentionBackward({ shape: [T, config.d_model], data: r }, x, taps, "a", params, "h.0.attn.", config);
  assert.ok(relErr(back.dx.data, numericGrad(x.data, L)) < FD_TOL);
  for (const [name, g] of back.params) {
    assert.ok(relErr(g.data, numericGrad(params.get(name)!.data, L)) < FD_TOL, name);
  }
});

test("batchBackward: one mean over every cell of the batch, the sum of per-case gradients weighted by cells", () => {
  const params = randomParams(BASE, 61);
  const batch = [[1, 2, 3], [4, 5, 6, 0, 1]];
  const { loss, grads } = batchBackward(params, BASE, batch);
  const [a, b] = batch.map((tokens) => backward(params, BASE, tokens));
  assert.ok(Math.abs(loss - (2 * a!.loss + 4 * b!.loss) / 6) < 1e-15);
  for (const [name, g] of grads) {
    const want = a!.grads.get(name + ".grad")!.data.map((v, i) => (2 * v + 4 * b!.grads.get(name + ".grad")!.data[i]!) / 6);
    assert.ok(relErr(g.data, want) < 1e-13, name);
  }
});

test("adamwStep and train: AdamW's arithmetic, bias-corrected at t = step, decay only where the spec says", () => {
  const spec: TrainingSpec = {
    steps: 2, lr: [0.1, 0.05], betas: [0.9, 0.99], eps: 1e-8, weight_decay: 0.5, no_decay: ["ln_f.bias"],
    cases: ["a"],
  };
  const p = Float64Array.of(1, -2);
  const g = Float64Array.of(0.5, 0.25);
  const one = adamwStep(p, g, new Float64Array(2), new Float64Array(2), 1, 0.1, spec, true);
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * sign(g) (eps aside), after the decay p (1 - lr wd).
  for (let i = 0; i < 2; i++) assert.ok(Math.abs(one.p[i]! - (p[i]! * 0.95 - 0.1 * Math.sign(g[i]!))) < 1e-8);
  const kept = adamwStep(p, g, new Float64Array(2), new Float64Array(2), 1, 0.1, spec, false);
  for (let i = 0; i < 2; i++) assert.ok(Math.abs(kept.p[i]! - (p[i]! - 0.1 * Math.sign(g[i]!))) < 1e-8);
  const params = randomParams(BASE, 71);
  const batch = [[1, 2, 3, 4]];
  const out = train(params, BASE, batch, spec);
  const names = [...paramShapes(BASE).keys()];
  assert.deepEqual([...out.keys()], [1, 2].flatMap((s) => [`step${s}/loss`, `step${s}/grad_norm`, ...names.map((n) => `step${s}/${n}`)]));
  const first = batchBackward(params, BASE, batch);
  assert.equal(out.get("step1/loss")!.data[0], first.loss);
  const norm = Math.sqrt(names.reduce((a, n) => a + first.grads.get(n)!.data.reduce((s, x) => s + x * x, 0), 0));
  assert.ok(Math.abs(out.get("step1/grad_norm")!.data[0]! - norm) < 1e-14 * norm);
  // Step 2's loss is the loss at step 1's parameters: a fresh gradient each step.
  const after1 = new Map(names.map((n) => [n, out.get(`step1/${n}`)!]));
  assert.equal(out.get("step2/loss")!.data[0], batchBackward(after1, BASE, batch).loss);
  // A parameter without decay moves by the Adam update only: ln_f.bias at step 1 is p - lr sign(g).
  const bias = params.get("ln_f.bias")!.data;
  const gb = first.grads.get("ln_f.bias")!.data;
  out.get("step1/ln_f.bias")!.data.forEach((v, i) => assert.ok(Math.abs(v - (bias[i]! - 0.1 * Math.sign(gb[i]!))) < 1e-6));
});
