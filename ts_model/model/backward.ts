// The backward of ./model.ts and the lesson's training step, by hand, float64 throughout: so the page can train.
//
// A function-by-function mirror of reference/parity_reference/numpy_backward.py, under the same names in camelCase:
//
//     crossEntropyBackward, unembedBackward, layerNormBackward, mlpBackward, geluBackward, geluNewBackward,
//     attentionBackward, softmaxBackward, blockBackward, backward, batchBackward, adamwStep, train
//
// What it computes is reference/parity_reference/training.py's spec. The loss of one case of T >= 2 tokens is the
// mean over its T - 1 predicted cells of -ln softmax(logits[t])[tokens[t + 1]]; `backward` returns it with the
// gradient of every forward tap on the loss's path ("{tap}.grad", the tap's shape: `probs` and the logit lens
// have none) and of every parameter ("{name}.grad"), in backward order (`backwardNames`). The activations are
// ./model.ts's `forward` and its taps; each function here takes the gradient of its forward step's output and
// returns the gradients of its inputs, with the forward values it needs read from the taps.
//
// Each known bug of a training port is local to one function: the tied embedding's gradient summed from both uses
// (`backward`), LayerNorm's mean term (`layerNormBackward`), softmax backward from its output
// (`softmaxBackward`), the exact GELU's derivative (`geluBackward`), the 1/sqrt(d_head) scale
// (`attentionBackward`), a fresh gradient each step (`train`), the bias correction at t = step and weight decay
// only where the spec says (`adamwStep`).
//
// GPT-2 family only (the lesson's model; model.ts implements no other). Tensors are row-major Float64Arrays with a
// shape, as in model.ts; the comment on each line gives the shape. No runtime dependencies.

import { erf } from "./erf.ts";
import { dHead, forward, paramShapes, tapNames } from "./model.ts";
import type { GPTConfig, Params, Taps, Tensor } from "./model.ts";

// -- the training spec (reference/parity_reference/training.py TrainingSpec) ---------------------------------------

/** The training step a fixture's goldens hold: AdamW from the fixture's weights on a fixed batch of cases. The
 *  field names are the keys of the manifest's `training` section. */
export interface TrainingSpec {
  readonly steps: number; // N >= 1 optimizer steps
  readonly lr: readonly number[]; // the learning rate of each step
  readonly betas: readonly [number, number]; // (b1, b2)
  readonly eps: number; // added to sqrt(v_hat)
  readonly weight_decay: number; // decoupled: p <- p * (1 - lr * weight_decay)
  readonly no_decay: readonly string[]; // parameters excluded from weight decay
  readonly cases: readonly string[]; // the batch: case names, each of >= 2 tokens
}

/** A manifest's `training` section (or the same object from elsewhere) checked as data; throws on a bad field.
 *  Keys it does not use (`loss`, `c`, `platform`) are ignored. */
export function parseTrainingSpec(raw: unknown): TrainingSpec {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new Error("training must be an object");
  const r = raw as Record<string, unknown>;
  const num = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
  const steps = r.steps;
  if (typeof steps !== "number" || !Number.isInteger(steps) || steps < 1) {
    throw new Error(`training: steps must be a positive integer, got ${JSON.stringify(steps)}`);
  }
  const lr = r.lr;
  if (!Array.isArray(lr) || lr.length !== steps || !lr.every((x) => num(x) && x >= 0)) {
    throw new Error(`training: lr must be a list of ${steps} non-negative numbers (one per step)`);
  }
  const betas = r.betas;
  if (!Array.isArray(betas) || betas.length !== 2 || !betas.every((b) => num(b) && b >= 0 && b < 1)) {
    throw new Error("training: betas must be two numbers in [0, 1)");
  }
  if (!num(r.eps) || r.eps <= 0) throw new Error(`training: eps must be a positive number, got ${JSON.stringify(r.eps)}`);
  if (!num(r.weight_decay) || r.weight_decay < 0) {
    throw new Error(`training: weight_decay must be a non-negative number, got ${JSON.stringify(r.weight_decay)}`);
  }
  const noDecay = r.no_decay ?? [];
  if (!Array.isArray(noDecay) || !noDecay.every((n) => typeof n === "string")) {
    throw new Error("training: no_decay must be a list of parameter names");
  }
  const cases = r.cases;
  if (!Array.isArray(cases) || cases.length === 0 || !cases.every((c) => typeof c === "string")
    || new Set(cases).size !== cases.length) {
    throw new Error("training: cases must be a non-empty list of distinct case names");
  }
  return {
    steps, lr: lr as number[], betas: [betas[0] as number, betas[1] as number], eps: r.eps,
    weight_decay: r.weight_decay, no_decay: noDecay as string[], cases: cases as string[],
  };
}

/** Whether AdamW decays `param`: a non-zero weight decay and the parameter not in `no_decay`. */
export function decays(spec: TrainingSpec, param: string): boolean {
  return spec.weight_decay !== 0 && !spec.no_decay.includes(param);
}

// -- names (reference/parity_reference/training.py) ---------------------------------------------------------------

/** True when a forward tap is on the loss's path (every tap but `probs` and the logit lens). */
export function hasBackward(tap: string): boolean {
  return !(tap === "probs" || tap.startsWith("logit_lens."));
}

/** Every gradient of a case's backward, in backward order: the tap gradients from the loss back to the embedding,
 *  then the parameters' (leaves) in reverse order. */
export function backwardNames(config: GPTConfig): string[] {
  const taps = tapNames(config.n_layer).filter(hasBackward).reverse().map((t) => t + ".grad");
  return [...taps, ...[...paramShapes(config).keys()].reverse().map((p) => p + ".grad")];
}

// -- tensors and the products the backward uses ----------------------------------------------------------------

export type Grads = Map<string, Tensor>;

function zeros(...shape: number[]): Tensor {
  return { shape, data: new Float64Array(shape.reduce((a, b) => a * b, 1)) };
}

function get(map: ReadonlyMap<string, Tensor>, name: string): Tensor {
  const t = map.get(name);
  if (t === undefined) throw new Error(`missing ${name}`);
  return t;
}

/** a (T, n) @ b (n, m) -> (T, m); each cell sums over n in order. */
function matmul(a: Tensor, b: Tensor): Tensor {
  const [T, n] = a.shape as [number, number];
  const m = b.shape[1]!;
  const out = zeros(T, m); // (T, m)
  for (let t = 0; t < T; t++) {
    for (let k = 0; k < n; k++) {
      const x = a.data[t * n + k]!;
      for (let j = 0; j < m; j++) out.data[t * m + j] += x * b.data[k * m + j]!;
    }
  }
  return out;
}

/** a (T, m) @ b^T for b (n, m) -> (T, n): a gradient sent back through x @ W (W (n, m)). */
function matmulBt(a: Tensor, b: Tensor): Tensor {
  const [T, m] = a.shape as [number, number];
  const n = b.shape[0]!;
  const out = zeros(T, n); // (T, n)
  for (let t = 0; t < T; t++) {
    for (let i = 0; i < n; i++) {
      let acc = 0;
      for (let j = 0; j < m; j++) acc += a.data[t * m + j]! * b.data[i * m + j]!;
      out.data[t * n + i] = acc;
    }
  }
  return out;
}

/** a^T @ b for a (T, n), b (T, m) -> (n, m): a weight's gradient, summed over the positions t in order. */
function matmulAt(a: Tensor, b: Tensor): Tensor {
  const [T, n] = a.shape as [number, number];
  const m = b.shape[1]!;
  const out = zeros(n, m); // (n, m)
  for (let t = 0; t < T; t++) {
    for (let i = 0; i < n; i++) {
      const x = a.data[t * n + i]!;
      for (let j = 0; j < m; j++) out.data[i * m + j] += x * b.data[t * m + j]!;
    }
  }
  return out;
}

/** The sum over rows of a (T, m) -> (m,): a bias's gradient. */
function sumRows(a: Tensor): Tensor {
  const [T, m] = a.shape as [number, number];
  const out = zeros(m); // (m,)
  for (let t = 0; t < T; t++) for (let j = 0; j < m; j++) out.data[j] += a.data[t * m + j]!;
  return out;
}

function add(a: Tensor, b: Tensor): Tensor {
  const out: Tensor = { shape: a.shape, data: new Float64Array(a.data.length) };
  for (let i = 0; i < a.data.length; i++) out.data[i] = a.data[i]! + b.data[i]!;
  return out;
}

/** LayerNorm's output from its taps, as model.ts computes it: normalized * weight + bias. (T, d) */
function layerNormOut(normalized: Tensor, weight: Tensor, bias: Tensor): Tensor {
  const [T, d] = normalized.shape as [number, number];
  const out = zeros(T, d); // (T, d)
  for (let t = 0; t < T; t++) {
    for (let j = 0; j < d; j++) out.data[t * d + j] = normalized.data[t * d + j]! * weight.data[j]! + bias.data[j]!;
  }
  return out;
}

// -- the backward, from the loss back to the embedding ------------------------------------------------------------

/** The next-token cross-entropy of one case and its gradient. logits (T, V), tokens (T,); `cells` divides the sum
 *  (T - 1 for one case's mean; the batch's total count in `batchBackward`). Returns the sum over the T - 1 cells of
 *  -ln softmax(logits[t])[tokens[t + 1]], the loss (sum / cells), and dlogits = (softmax - onehot) / cells on the
 *  predicted rows, 0 on the last. */
export function crossEntropyBackward(
  logits: Tensor, tokens: readonly number[], cells: number = tokens.length - 1,
): { readonly sum: number; readonly loss: number; readonly dlogits: Tensor } {
  const [T, V] = logits.shape as [number, number];
  if (T < 2) throw new Error(`a case of ${T} token predicts nothing: it has no loss`);
  const dlogits = zeros(T, V); // (T, V): the last row predicts nothing
  let sum = 0;
  for (let t = 0; t < T - 1; t++) {
    const row = t * V;
    let max = -Infinity;
    for (let j = 0; j < V; j++) max = Math.max(max, logits.data[row + j]!);
    let total = 0;
    for (let j = 0; j < V; j++) total += Math.exp(logits.data[row + j]! - max);
    const lse = Math.log(total);
    const target = tokens[t + 1]!;
    sum += lse - (logits.data[row + target]! - max); // -log_softmax at the next token
    for (let j = 0; j < V; j++) dlogits.data[row + j] = Math.exp(logits.data[row + j]! - max - lse) / cells;
    dlogits.data[row + target] -= 1 / cells;
  }
  return { sum, loss: sum / cells, dlogits };
}

/** LayerNorm's backward. dout, normalized (T, d), scale (T, 1), weight (d,). out = normalized * w + b and
 *  normalized = centered / scale, scale = sqrt(mean(centered^2) + eps), centered = x - mean(x):
 *  dnormalized = dout * w; dscale = -sum_j dnormalized * normalized / scale (the adjoint through the division:
 *  the `hook_scale` gradient); dcentered = dnormalized / scale + dscale * normalized / d; dx = dcentered minus its
 *  mean (the mean term). dweight = sum_t dout * normalized, dbias = sum_t dout. */
export function layerNormBackward(
  dout: Tensor, normalized: Tensor, scale: Tensor, weight: Tensor,
): { readonly dx: Tensor; readonly dnormalized: Tensor; readonly dscale: Tensor; readonly dweight: Tensor;
     readonly dbias: Tensor } {
  const [T, d] = dout.shape as [number, number];
  const dnormalized = zeros(T, d); // (T, d)
  const dscale = zeros(T, 1); // (T, 1)
  const dx = zeros(T, d); // (T, d)
  const dweight = zeros(d); // (d,)
  const dbias = zeros(d); // (d,)
  const dcentered = new Float64Array(d); // (d,) one row
  for (let t = 0; t < T; t++) {
    const s = scale.data[t]!;
    let ds = 0;
    for (let j = 0; j < d; j++) {
      const g = dout.data[t * d + j]!;
      const n = normalized.data[t * d + j]!;
      dweight.data[j] += g * n;
      dbias.data[j] += g;
      const dn = g * weight.data[j]!;
      dnormalized.data[t * d + j] = dn;
      ds -= dn * n;
    }
    ds /= s;
    dscale.data[t] = ds;
    let mean = 0;
    for (let j = 0; j < d; j++) {
      dcentered[j] = dnormalized.data[t * d + j]! / s + (ds * normalized.data[t * d + j]!) / d;
      mean += dcentered[j]!;
    }
    mean /= d;
    for (let j = 0; j < d; j++) dx.data[t * d + j] = dcentered[j]! - mean;
  }
  return { dx, dnormalized, dscale, dweight, dbias };
}

/** The tied unembedding's backward, logits = LN_f(x) @ wte^T: the final LayerNorm's input gradient (T, d), and
 *  the unembedding's share of wte's gradient (V, d) (`backward` adds the lookup's). Records `logits.grad` and
 *  the final LayerNorm's tap gradients in `grads`, its parameters' in `paramGrads`. */
export function unembedBackward(
  dlogits: Tensor, taps: Taps, params: Params, grads: Grads, paramGrads: Grads,
): { readonly dx: Tensor; readonly dwte: Tensor } {
  const normalized = get(taps, "ln_final.hook_normalized"); // (T, d)
  const weight = get(params, "ln_f.weight"); // (d,)
  const wte = get(params, "wte.weight"); // (V, d)
  grads.set("logits.grad", dlogits);
  const ln = layerNormOut(normalized, weight, get(params, "ln_f.bias")); // (T, d)
  const dwte = matmulAt(dlogits, ln); // (V, d)
  const dln = matmul(dlogits, wte); // (T, d)
  const back = layerNormBackward(dln, normalized, get(taps, "ln_final.hook_scale"), weight);
  grads.set("ln_final.hook_normalized.grad", back.dnormalized);
  grads.set("ln_final.hook_scale.grad", back.dscale);
  paramGrads.set("ln_f.weight", back.dweight);
  paramGrads.set("ln_f.bias", back.dbias);
  return { dx: back.dx, dwte };
}

/** The exact GELU's derivative times dy: d/dx x Phi(x) = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2,
 *  phi(x) = exp(-x^2 / 2) / sqrt(2 pi). x, dy (T, f). */
export function geluBackward(x: Tensor, dy: Tensor): Tensor {
  const out: Tensor = { shape: x.shape, data: new Float64Array(x.data.length) }; // (T, f)
  const invSqrt2Pi = 1 / Math.sqrt(2 * Math.PI);
  for (let i = 0; i < x.data.length; i++) {
    const v = x.data[i]!;
    const cdf = 0.5 * (1.0 + erf(v / Math.SQRT2));
    out.data[i] = dy.data[i]! * (cdf + v * Math.exp(-0.5 * v * v) * invSqrt2Pi);
  }
  return out;
}

/** GPT-2's tanh GELU's derivative times dy: with u = c (x + 0.044715 x^3), c = sqrt(2 / pi),
 *  d/dx x (1 + tanh u) / 2 = (1 + tanh u) / 2 + x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2) / 2. x, dy (T, f). */
export function geluNewBackward(x: Tensor, dy: Tensor): Tensor {
  const out: Tensor = { shape: x.shape, data: new Float64Array(x.data.length) }; // (T, f)
  const c = Math.sqrt(2.0 / Math.PI);
  for (let i = 0; i < x.data.length; i++) {
    const v = x.data[i]!;
    const th = Math.tanh(c * (v + 0.044715 * (v * v * v)));
    const local = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * v * v);
    out.data[i] = dy.data[i]! * local;
  }
  return out;
}

/** The MLP's backward: pre = x @ W_fc + b_fc, post = act(pre), out = post @ W_proj + b_proj. dout (T, d), x the
 *  MLP's input (LN2's output, (T, d)), pre and post its taps (T, f). */
export function mlpBackward(
  dout: Tensor, x: Tensor, pre: Tensor, post: Tensor, params: Params, prefix: string, config: GPTConfig,
): { readonly dx: Tensor; readonly dpre: Tensor; readonly dpost: Tensor; readonly params: Grads } {
  const wFc = get(params, prefix + "c_fc.weight"); // (d, f)
  const wProj = get(params, prefix + "c_proj.weight"); // (f, d)
  const dpost = matmulBt(dout, wProj); // (T, f)
  const dpre = config.activation === "gelu_new" ? geluNewBackward(pre, dpost) : geluBackward(pre, dpost); // (T, f)
  const grads: Grads = new Map([
    [prefix + "c_fc.weight", matmulAt(x, dpre)], // (d, f)
    [prefix + "c_fc.bias", sumRows(dpre)], // (f,)
    [prefix + "c_proj.weight", matmulAt(post, dout)], // (f, d)
    [prefix + "c_proj.bias", sumRows(dout)], // (d,)
  ]);
  return { dx: matmulBt(dpre, wFc), dpre, dpost, params: grads }; // dx (T, d)
}

/** Softmax's backward over the last axis, from its output p: dx = p * (dp - sum_k p_k dp_k). A masked cell
 *  (p = 0) gets 0. p, dp (..., n). */
export function softmaxBackward(p: Tensor, dp: Tensor): Tensor {
  const n = p.shape[p.shape.length - 1]!;
  const out: Tensor = { shape: p.shape, data: new Float64Array(p.data.length) }; // same shape as p
  for (let row = 0; row < p.data.length; row += n) {
    let dot = 0;
    for (let j = 0; j < n; j++) dot += p.data[row + j]! * dp.data[row + j]!;
    for (let j = 0; j < n; j++) out.data[row + j] = p.data[row + j]! * (dp.data[row + j]! - dot);
  }
  return out;
}

/** Attention's backward. dout (T, d), x the attention's input (LN1's output, (T, d)); q, k, v, pattern and z read
 *  from the taps under `name` ("blocks.{i}.attn"). z = pattern @ v per head; scores = q k^T / sqrt(d_head), masked
 *  to -inf after the key's position; qkv = x @ W_attn + b_attn. Returns the input's gradient, every tap's
 *  (q, k, v (T, H, dh); scores, pattern (H, T, T); z (T, H, dh)) and the parameters'. */
export function attentionBackward(
  dout: Tensor, x: Tensor, taps: Taps, name: string, params: Params, prefix: string, config: GPTConfig,
): { readonly dx: Tensor; readonly taps: Grads; readonly params: Grads } {
  const T = x.shape[0]!;
  const d = config.d_model;
  const H = config.n_head;
  const dh = dHead(config);
  const q = get(taps, `${name}.hook_q`); // (T, H, dh)
  const k = get(taps, `${name}.hook_k`); // (T, H, dh)
  const v = get(taps, `${name}.hook_v`); // (T, H, dh)
  const pattern = get(taps, `${name}.hook_pattern`); // (H, T, T)
  const z = get(taps, `${name}.hook_z`); // (T, H, dh)
  const wProj = get(params, prefix + "c_proj.weight"); // (d, d)
  const zFlat: Tensor = { shape: [T, d], data: z.data }; // (T, d): heads side by side
  const dzFlat = matmulBt(dout, wProj); // (T, d)
  const dz: Tensor = { shape: [T, H, dh], data: dzFlat.data }; // (T, H, dh)
  const dpattern = zeros(H, T, T); // (H, T, T): dz . v, non-zero at masked cells too
  const dv = zeros(T, H, dh); // (T, H, dh)
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        let acc = 0;
        for (let e = 0; e < dh; e++) acc += dz.data[(i * H + h) * dh + e]! * v.data[(j * H + h) * dh + e]!;
        dpattern.data[(h * T + i) * T + j] = acc;
      }
    }
    for (let j = 0; j < T; j++) {
      for (let e = 0; e < dh; e++) {
        let acc = 0;
        for (let i = 0; i < T; i++) acc += pattern.data[(h * T + i) * T + j]! * dz.data[(i * H + h) * dh + e]!;
        dv.data[(j * H + h) * dh + e] = acc;
      }
    }
  }
  const dscores = softmaxBackward(pattern, dpattern); // (H, T, T): 0 at masked cells
  const rootDh = Math.sqrt(dh);
  const dq = zeros(T, H, dh); // (T, H, dh)
  const dk = zeros(T, H, dh); // (T, H, dh)
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        const g = dscores.data[(h * T + i) * T + j]! / rootDh; // through the division by sqrt(d_head)
        if (g === 0) continue;
        for (let e = 0; e < dh; e++) {
          dq.data[(i * H + h) * dh + e] += g * k.data[(j * H + h) * dh + e]!;
          dk.data[(j * H + h) * dh + e] += g * q.data[(i * H + h) * dh + e]!;
        }
      }
    }
  }
  const dqkv = zeros(T, 3 * d); // (T, 3d): [dq | dk | dv], heads side by side
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < d; c++) {
      dqkv.data[t * 3 * d + c] = dq.data[t * d + c]!;
      dqkv.data[t * 3 * d + d + c] = dk.data[t * d + c]!;
      dqkv.data[t * 3 * d + 2 * d + c] = dv.data[t * d + c]!;
    }
  }
  const tapGrads: Grads = new Map([
    [`${name}.hook_z.grad`, dz],
    [`${name}.hook_pattern.grad`, dpattern],
    [`${name}.hook_attn_scores.grad`, dscores],
    [`${name}.hook_v.grad`, dv],
    [`${name}.hook_k.grad`, dk],
    [`${name}.hook_q.grad`, dq],
  ]);
  const paramGrads: Grads = new Map([
    [prefix + "c_attn.weight", matmulAt(x, dqkv)], // (d, 3d)
    [prefix + "c_attn.bias", sumRows(dqkv)], // (3d,)
    [prefix + "c_proj.weight", matmulAt(zFlat, dout)], // (d, d)
    [prefix + "c_proj.bias", sumRows(dout)], // (d,)
  ]);
  return { dx: matmulBt(dqkv, get(params, prefix + "c_attn.weight")), taps: tapGrads, params: paramGrads }; // dx (T, d)
}

/** Block i's backward, from the gradient of its output (resid_post, (T, d)) to its input's (resid_pre): records
 *  every tap gradient of the block in `grads` (resid_post, mlp_out, the MLP's, LN2's, resid_mid, attn_out, the
 *  attention's, LN1's, resid_pre) and its parameters' in `paramGrads`. */
export function blockBackward(
  dResidPost: Tensor, taps: Taps, params: Params, i: number, config: GPTConfig, grads: Grads, paramGrads: Grads,
): Tensor {
  const p = `h.${i}.`;
  const name = `blocks.${i}`;
  grads.set(`${name}.hook_resid_post.grad`, dResidPost);
  grads.set(`${name}.hook_mlp_out.grad`, dResidPost); // resid_post = resid_mid + mlp_out
  const ln2Normalized = get(taps, `${name}.ln2.hook_normalized`); // (T, d)
  const ln2Weight = get(params, p + "ln_2.weight"); // (d,)
  const ln2 = layerNormOut(ln2Normalized, ln2Weight, get(params, p + "ln_2.bias")); // (T, d)
  const mlp = mlpBackward(dResidPost, ln2, get(taps, `${name}.mlp.hook_pre`), get(taps, `${name}.mlp.hook_post`),
    params, p + "mlp.", config);
  grads.set(`${name}.mlp.hook_post.grad`, mlp.dpost);
  grads.set(`${name}.mlp.hook_pre.grad`, mlp.dpre);
  const back2 = layerNormBackward(mlp.dx, ln2Normalized, get(taps, `${name}.ln2.hook_scale`), ln2Weight);
  grads.set(`${name}.ln2.hook_normalized.grad`, back2.dnormalized);
  grads.set(`${name}.ln2.hook_scale.grad`, back2.dscale);
  const dResidMid = add(dResidPost, back2.dx); // (T, d): the residual and LN2's input
  grads.set(`${name}.hook_resid_mid.grad`, dResidMid);
  grads.set(`${name}.hook_attn_out.grad`, dResidMid); // resid_mid = resid_pre + attn_out
  const ln1Normalized = get(taps, `${name}.ln1.hook_normalized`); // (T, d)
  const ln1Weight = get(params, p + "ln_1.weight"); // (d,)
  const ln1 = layerNormOut(ln1Normalized, ln1Weight, get(params, p + "ln_1.bias")); // (T, d)
  const attn = attentionBackward(dResidMid, ln1, taps, `${name}.attn`, params, p + "attn.", config);
  for (const [k, g] of attn.taps) grads.set(k, g);
  const back1 = layerNormBackward(attn.dx, ln1Normalized, get(taps, `${name}.ln1.hook_scale`), ln1Weight);
  grads.set(`${name}.ln1.hook_normalized.grad`, back1.dnormalized);
  grads.set(`${name}.ln1.hook_scale.grad`, back1.dscale);
  const dResidPre = add(dResidMid, back1.dx); // (T, d)
  grads.set(`${name}.hook_resid_pre.grad`, dResidPre);
  paramGrads.set(p + "ln_1.weight", back1.dweight);
  paramGrads.set(p + "ln_1.bias", back1.dbias);
  for (const [k, g] of attn.params) paramGrads.set(k, g);
  paramGrads.set(p + "ln_2.weight", back2.dweight);
  paramGrads.set(p + "ln_2.bias", back2.dbias);
  for (const [k, g] of mlp.params) paramGrads.set(k, g);
  return dResidPre;
}

/** One case: the forward (model.ts, with its taps), then its loss and every gradient of `backwardNames`, in that
 *  order ("{tap}.grad" in the tap's shape, "{param}.grad" in the parameter's). `cells` divides the cross-entropy's
 *  sum (default T - 1: the case's own mean); `sum` is that sum. The tied embedding's gradient sums both uses: the
 *  unembedding's and the lookup's (each position's stream gradient added to its token's row). */
export function backward(
  params: Params, config: GPTConfig, tokens: readonly number[], cells: number = tokens.length - 1,
): { readonly loss: number; readonly sum: number; readonly grads: Grads } {
  const T = tokens.length;
  const d = config.d_model;
  const taps: Taps = new Map();
  const logits = forward(params, config, tokens, taps); // (T, V)
  const ce = crossEntropyBackward(logits, tokens, cells);
  const grads: Grads = new Map(); // tap gradients
  const paramGrads: Grads = new Map(); // parameter name -> gradient
  const unembed = unembedBackward(ce.dlogits, taps, params, grads, paramGrads);
  let dx = unembed.dx; // (T, d): the last stream's gradient
  for (let i = config.n_layer - 1; i >= 0; i--) dx = blockBackward(dx, taps, params, i, config, grads, paramGrads);
  grads.set("hook_pos_embed.grad", dx); // x = embed + pos_embed: the same adjoint for both
  grads.set("hook_embed.grad", dx);
  const dwte = unembed.dwte; // (V, d): the unembedding's use ...
  for (let t = 0; t < T; t++) {
    const row = tokens[t]! * d;
    for (let j = 0; j < d; j++) dwte.data[row + j] += dx.data[t * d + j]!; // ... plus the lookup's
  }
  paramGrads.set("wte.weight", dwte);
  if (config.positions === "learned") {
    const dwpe = zeros(config.n_ctx, d); // (n_ctx, d): rows past T are 0
    dwpe.data.set(dx.data);
    paramGrads.set("wpe.weight", dwpe);
  }
  const out: Grads = new Map();
  for (const name of backwardNames(config)) {
    const base = name.slice(0, -".grad".length);
    const g = grads.get(name) ?? paramGrads.get(base);
    if (g === undefined) throw new Error(`the backward produced no ${name}`);
    out.set(name, g);
  }
  return { loss: ce.loss, sum: ce.sum, grads: out };
}

/** The batch's loss, one mean over every predicted cell (the sum of each case's cross-entropies over the total
 *  count), and every parameter's gradient (parameter name -> gradient, in paramShapes order). */
export function batchBackward(
  params: Params, config: GPTConfig, batch: readonly (readonly number[])[],
): { readonly loss: number; readonly grads: Grads } {
  const total = batch.reduce((n, tokens) => n + Math.max(0, tokens.length - 1), 0);
  if (total < 1) throw new Error("the batch predicts nothing: every case has one token");
  const grads: Grads = new Map();
  for (const name of paramShapes(config).keys()) grads.set(name, zeros(...get(params, name).shape));
  let sum = 0;
  for (const tokens of batch) {
    const one = backward(params, config, tokens, total);
    sum += one.sum;
    for (const [name, g] of grads) {
      const part = get(one.grads, name + ".grad");
      for (let i = 0; i < g.data.length; i++) g.data[i] += part.data[i]!;
    }
  }
  return { loss: sum / total, grads };
}

/** One AdamW step of one parameter, torch.optim.AdamW's arithmetic (single tensor, not fused): step t (1-based),
 *  learning rate lr. p <- p (1 - lr wd) when it decays; m <- m + (1 - b1) (g - m) (torch's lerp);
 *  v <- b2 v + (1 - b2) g^2; p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), each in torch's
 *  order of operations. New arrays. */
export function adamwStep(
  p: Float64Array, g: Float64Array, m: Float64Array, v: Float64Array, t: number, lr: number, spec: TrainingSpec,
  decay: boolean,
): { readonly p: Float64Array; readonly m: Float64Array; readonly v: Float64Array } {
  const [b1, b2] = spec.betas;
  const outP = new Float64Array(p.length);
  const outM = new Float64Array(m.length);
  const outV = new Float64Array(v.length);
  const shrink = decay ? 1 - lr * spec.weight_decay : 1;
  const stepSize = lr / (1 - b1 ** t);
  const bc2Sqrt = Math.sqrt(1 - b2 ** t);
  for (let i = 0; i < p.length; i++) {
    const gi = g[i]!;
    const mi = m[i]! + (1 - b1) * (gi - m[i]!);
    const vi = v[i]! * b2 + (1 - b2) * gi * gi;
    outM[i] = mi;
    outV[i] = vi;
    outP[i] = p[i]! * shrink + (-stepSize * mi) / (Math.sqrt(vi) / bc2Sqrt + spec.eps); // torch's addcdiv order
  }
  return { p: outP, m: outM, v: outV };
}

/** `spec.steps` steps of AdamW from `params` on the batch: per step s (1-based) "step{s}/loss" and
 *  "step{s}/grad_norm" (shape [], before the update; the norm is sqrt(sum over parameters of sum g^2)) and every
 *  parameter after the update, "step{s}/{name}". A fresh gradient each step. `params` is not changed. */
export function train(
  params: Params, config: GPTConfig, batch: readonly (readonly number[])[], spec: TrainingSpec,
): Map<string, Tensor> {
  const names = [...paramShapes(config).keys()];
  const current = new Map<string, Tensor>(names.map((n) => [n, get(params, n)]));
  const m = new Map<string, Float64Array>(names.map((n) => [n, new Float64Array(get(params, n).data.length)])); // AdamW's m
  const v = new Map<string, Float64Array>(names.map((n) => [n, new Float64Array(get(params, n).data.length)])); // AdamW's v
  const out = new Map<string, Tensor>();
  for (let s = 1; s <= spec.steps; s++) {
    const { loss, grads } = batchBackward(current, config, batch);
    let sq = 0;
    for (const name of names) {
      let part = 0;
      for (const x of get(grads, name).data) part += x * x;
      sq += part;
    }
    out.set(`step${s}/loss`, { shape: [], data: Float64Array.of(loss) });
    out.set(`step${s}/grad_norm`, { shape: [], data: Float64Array.of(Math.sqrt(sq)) });
    for (const name of names) {
      const p = get(current, name);
      const next = adamwStep(p.data, get(grads, name).data, m.get(name)!, v.get(name)!, s, spec.lr[s - 1]!, spec,
        decays(spec, name));
      m.set(name, next.m);
      v.set(name, next.v);
      current.set(name, { shape: p.shape, data: next.p });
      out.set(`step${s}/${name}`, current.get(name)!);
    }
  }
  return out;
}
