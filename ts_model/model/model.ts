// The reference GPT-2-style transformer in TypeScript, float64 throughout (JavaScript numbers).
//
// A function-by-function mirror of reference/parity_reference/model.py, in the same order and under the same names
// in camelCase:
//
//     sinusoidalPositions, layerNorm, gelu, geluNew, attention, mlp, block, unembed, forward, runWithTaps
//
// and, for incremental decoding from a key/value cache (keys and values [H, T, d_head] per block):
//
//     prefill, attentionStep, blockStep, decodeStep, decode
//
// Parameters are read under their Hugging Face GPT-2 names, float32 in the weights file and
// upcast to float64 here (`loadParams`). Every activation ("tap") of docs/spec.md (section 2) is
// recorded under its TransformerLens name, one sequence of T tokens, no batch axis. Tensors are
// row-major Float64Arrays with a shape; the comment on each line gives the shape.
//
// No runtime dependencies: erf comes from ./erf.ts (fdlibm), everything else is Math.

import { erf } from "./erf.ts";
import { GPT2, familyTapNames } from "./families.ts";

// -- configuration, parameter table, tap names (reference/parity_reference/config.py, reference/parity_reference/taps.py) ------------

/** The model's sizes. The field names are the keys of the manifest's `config` (GPTConfig's fields). */
export interface GPTConfig {
  readonly vocab_size: number; // V: words in the vocabulary
  readonly n_ctx: number; // longest sequence the model reads (and rows of `wpe` when learned)
  readonly d_model: number; // d: width of the residual stream
  readonly n_layer: number; // L: number of transformer blocks
  readonly n_head: number; // H: attention heads per block; d_head = d_model / n_head
  readonly d_mlp: number; // width of the MLP's hidden layer, 4 * d_model in GPT-2
  readonly positions: "sinusoidal" | "learned"; // 2017 sinusoids (no parameters) or GPT-2's wpe
  readonly ln_eps: number; // LayerNorm epsilon, added to the biased variance
  readonly causal: boolean; // causal mask; false only for the lesson's unmasked experiment
  // The MLP's activation: absent (a manifest leaves it out) or "gelu", the exact erf GELU; "gelu_new", GPT-2's tanh one.
  readonly activation?: "gelu" | "gelu_new";
}

const CONFIG_INTS = ["vocab_size", "n_ctx", "d_model", "n_layer", "n_head", "d_mlp"] as const;
const CONFIG_KEYS = [...CONFIG_INTS, "positions", "ln_eps", "causal"] as const;
const CONFIG_OPTIONAL = ["activation"] as const; // may be left out: "gelu"

/** Build a config from a manifest's `config` object; unknown, missing or invalid keys throw. */
export function parseConfig(raw: unknown): GPTConfig {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new Error("config must be an object");
  }
  const data = raw as Record<string, unknown>;
  const known: readonly string[] = [...CONFIG_KEYS, ...CONFIG_OPTIONAL];
  const unknown = Object.keys(data).filter((k) => !known.includes(k));
  if (unknown.length > 0) throw new Error(`unknown config keys: ${unknown.sort().join(", ")}`);
  const missing = CONFIG_KEYS.filter((k) => !(k in data));
  if (missing.length > 0) throw new Error(`missing config keys: ${[...missing].sort().join(", ")}`);
  for (const name of CONFIG_INTS) {
    const v = data[name];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) {
      throw new Error(`${name} must be a positive integer, got ${JSON.stringify(v)}`);
    }
  }
  const config = data as unknown as GPTConfig;
  if (config.positions !== "sinusoidal" && config.positions !== "learned") {
    throw new Error(`positions must be 'sinusoidal' or 'learned', got ${JSON.stringify(config.positions)}`);
  }
  if (typeof config.ln_eps !== "number" || !(config.ln_eps >= 0)) {
    throw new Error(`ln_eps must be a non-negative number, got ${JSON.stringify(config.ln_eps)}`);
  }
  if (typeof config.causal !== "boolean") {
    throw new Error(`causal must be true or false, got ${JSON.stringify(config.causal)}`);
  }
  if ("activation" in data && config.activation !== "gelu" && config.activation !== "gelu_new") {
    throw new Error(`activation must be 'gelu' or 'gelu_new', got ${JSON.stringify(config.activation)}`);
  }
  if (config.d_model % config.n_head !== 0) {
    throw new Error(`d_model=${config.d_model} is not divisible by n_head=${config.n_head}`);
  }
  if (config.positions === "sinusoidal" && config.d_model % 2 !== 0) {
    throw new Error(`sinusoidal positions need an even d_model, got ${config.d_model}`);
  }
  return config;
}

export function dHead(config: GPTConfig): number {
  return config.d_model / config.n_head;
}

/** Every parameter under its Hugging Face GPT-2 name with its shape, in dataflow order.
 *  Conv1D weights (c_attn, c_proj, c_fc) are stored [in, out] and used as x @ W + b: the
 *  transpose of nn.Linear's [out, in]. */
export function paramShapes(config: GPTConfig): Map<string, number[]> {
  const d = config.d_model;
  const f = config.d_mlp;
  const shapes = new Map<string, number[]>([["wte.weight", [config.vocab_size, d]]]);
  if (config.positions === "learned") shapes.set("wpe.weight", [config.n_ctx, d]);
  for (let i = 0; i < config.n_layer; i++) {
    const p = `h.${i}.`;
    shapes.set(p + "ln_1.weight", [d]);
    shapes.set(p + "ln_1.bias", [d]);
    shapes.set(p + "attn.c_attn.weight", [d, 3 * d]);
    shapes.set(p + "attn.c_attn.bias", [3 * d]);
    shapes.set(p + "attn.c_proj.weight", [d, d]);
    shapes.set(p + "attn.c_proj.bias", [d]);
    shapes.set(p + "ln_2.weight", [d]);
    shapes.set(p + "ln_2.bias", [d]);
    shapes.set(p + "mlp.c_fc.weight", [d, f]);
    shapes.set(p + "mlp.c_fc.bias", [f]);
    shapes.set(p + "mlp.c_proj.weight", [f, d]);
    shapes.set(p + "mlp.c_proj.bias", [d]);
  }
  shapes.set("ln_f.weight", [d]);
  shapes.set("ln_f.bias", [d]);
  return shapes;
}

/** Per-block taps in dataflow order, relative to "blocks.{i}.": the GPT-2 family's table (families.ts), as
 *  reference/parity_reference/taps.py reads it. */
export const BLOCK_TAPS: readonly string[] = GPT2.taps.filter((t) => t.layer === "i").map((t) => t.name.slice("blocks.{i}.".length));

/** Every tap name for a model of `nLayer` blocks, in dataflow order (the family's table). */
export function tapNames(nLayer: number): string[] {
  return familyTapNames(GPT2, nLayer);
}

// -- tensors, and the few torch operations the forward pass uses --------------------------------

/** A row-major float64 array with its shape. */
export interface Tensor {
  readonly shape: readonly number[];
  readonly data: Float64Array;
}

export type Params = ReadonlyMap<string, Tensor>;
export type Taps = Map<string, Tensor>;

function zeros(...shape: number[]): Tensor {
  return { shape, data: new Float64Array(shape.reduce((a, b) => a * b, 1)) };
}

function record(taps: Taps | null, name: string, value: Tensor): void {
  if (taps !== null) taps.set(name, value);
}

function param(params: Params, name: string): Tensor {
  const p = params.get(name);
  if (p === undefined) throw new Error(`missing parameter ${name}`);
  return p;
}

// -- the matrix products ---------------------------------------------------------------------------
//
// `linear` and `linearTransposed` run their kernels through `products`: by default on this thread, over
// every output column. A caller may install another engine (`useMatrixProducts`), such as
// ../node/threads.ts, which splits the columns across worker threads: each cell is still computed by the
// same kernel, over k in the same order, so the result does not depend on the engine, bit for bit.

/** Which product: "linear", x (T, n) @ w (n, m); "linearTransposed", x (T, n) @ w^T for w (m, n). */
export type ProductKind = "linear" | "linearTransposed";

/** How the products run: `alloc` makes the arrays they read and write (parameters, outputs), `run`
 * computes x @ w (or x @ w^T) into a fresh (T, m) array from `alloc`. */
export interface MatrixProducts {
  alloc(length: number): Float64Array;
  run(kind: ProductKind, xd: Float64Array, wd: Float64Array, T: number, n: number, m: number): Float64Array;
}

/** Columns [j0, j1) of x (T, n) @ w (n, m) into od (T, m), which starts at zero.
 *
 * Four rows of x at a time share each row of w, so w is read T/4 times instead of T (at GPT-2 size
 * w is megabytes, beyond the caches); every output cell starts at 0 and adds x[t,k] * w[k,j] for
 * k = 0, 1, ... in order: the same operations as one cell at a time, bit for bit. */
export function linearColumns(
  xd: Float64Array, wd: Float64Array, od: Float64Array, T: number, n: number, m: number, j0: number, j1: number,
): void {
  let t = 0;
  for (; t + 4 <= T; t += 4) {
    const r0 = t * m, r1 = r0 + m, r2 = r1 + m, r3 = r2 + m;
    for (let k = 0; k < n; k++) {
      const x0 = xd[t * n + k]!, x1 = xd[(t + 1) * n + k]!, x2 = xd[(t + 2) * n + k]!, x3 = xd[(t + 3) * n + k]!;
      const wrow = k * m;
      for (let j = j0; j < j1; j++) {
        const wkj = wd[wrow + j]!;
        od[r0 + j] += x0 * wkj;
        od[r1 + j] += x1 * wkj;
        od[r2 + j] += x2 * wkj;
        od[r3 + j] += x3 * wkj;
      }
    }
  }
  for (; t < T; t++) {
    const row = t * m;
    for (let k = 0; k < n; k++) {
      const xk = xd[t * n + k]!;
      const wrow = k * m;
      for (let j = j0; j < j1; j++) od[row + j] += xk * wd[wrow + j]!;
    }
  }
}

/** Columns [j0, j1) of x (T, n) @ w^T for w (m, n) into od (T, m).
 *
 * Two rows of w (two words) are dotted with four rows of x at a time, eight independent sums held in
 * registers: w, the whole vocabulary for the unembedding, is read T/4 times instead of T. Each dot
 * product runs over k in order from 0, as one cell at a time would, bit for bit. */
export function linearTransposedColumns(
  xd: Float64Array, wd: Float64Array, od: Float64Array, T: number, n: number, m: number, j0: number, j1: number,
): void {
  let t = 0;
  for (; t + 4 <= T; t += 4) {
    const x0 = t * n, x1 = x0 + n, x2 = x1 + n, x3 = x2 + n;
    const r0 = t * m, r1 = r0 + m, r2 = r1 + m, r3 = r2 + m;
    let j = j0;
    for (; j + 2 <= j1; j += 2) {
      const wa = j * n, wb = wa + n;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let k = 0; k < n; k++) {
        const u = wd[wa + k]!, v = wd[wb + k]!;
        const p = xd[x0 + k]!, q = xd[x1 + k]!, r = xd[x2 + k]!, s = xd[x3 + k]!;
        a0 += p * u; a1 += q * u; a2 += r * u; a3 += s * u;
        b0 += p * v; b1 += q * v; b2 += r * v; b3 += s * v;
      }
      od[r0 + j] = a0; od[r1 + j] = a1; od[r2 + j] = a2; od[r3 + j] = a3;
      od[r0 + j + 1] = b0; od[r1 + j + 1] = b1; od[r2 + j + 1] = b2; od[r3 + j + 1] = b3;
    }
    for (; j < j1; j++) {
      const wa = j * n;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (let k = 0; k < n; k++) {
        const u = wd[wa + k]!;
        a0 += xd[x0 + k]! * u; a1 += xd[x1 + k]! * u; a2 += xd[x2 + k]! * u; a3 += xd[x3 + k]! * u;
      }
      od[r0 + j] = a0; od[r1 + j] = a1; od[r2 + j] = a2; od[r3 + j] = a3;
    }
  }
  for (; t < T; t++) {
    for (let j = j0; j < j1; j++) {
      let acc = 0;
      for (let k = 0; k < n; k++) acc += xd[t * n + k]! * wd[j * n + k]!;
      od[t * m + j] = acc;
    }
  }
}

/** The kernel of each product, over a column range: what every engine runs. */
export const PRODUCT_KERNELS: Readonly<Record<ProductKind, typeof linearColumns>> = {
  linear: linearColumns,
  linearTransposed: linearTransposedColumns,
};

/** This thread, every column. */
export const SINGLE_THREAD: MatrixProducts = {
  alloc: (length) => new Float64Array(length),
  run(kind, xd, wd, T, n, m) {
    const od = new Float64Array(T * m); // (T, m)
    PRODUCT_KERNELS[kind](xd, wd, od, T, n, m, 0, m);
    return od;
  },
};

let products: MatrixProducts = SINGLE_THREAD;

/** Run the matrix products (and allocate the parameters) with `engine` from now on; null: this thread. */
export function useMatrixProducts(engine: MatrixProducts | null): void {
  products = engine ?? SINGLE_THREAD;
}

/** x (T, n) @ w (n, m) + b (m): GPT-2's Conv1D. Sums over n in order, then adds the bias. */
function linear(x: Tensor, w: Tensor, b: Tensor | null): Tensor {
  const [T, n] = x.shape as [number, number];
  const m = w.shape[1]!;
  const od = products.run("linear", x.data, w.data, T, n, m); // (T, m)
  if (b !== null) {
    const bd = b.data;
    for (let r = 0; r < T * m; r += m) for (let j = 0; j < m; j++) od[r + j] += bd[j]!;
  }
  return { shape: [T, m], data: od };
}

/** x (T, n) @ w^T for w (m, n): the tied unembedding against the token table. */
function linearTransposed(x: Tensor, w: Tensor): Tensor {
  const [T, n] = x.shape as [number, number];
  const m = w.shape[0]!;
  return { shape: [T, m], data: products.run("linearTransposed", x.data, w.data, T, n, m) }; // (T, m)
}

/** Softmax over the last axis, as torch.softmax: exp(x - max) / sum. -inf cells give 0. */
function softmax(x: Tensor): Tensor {
  const n = x.shape[x.shape.length - 1]!;
  const out: Tensor = { shape: x.shape, data: new Float64Array(x.data.length) }; // same shape as x
  for (let row = 0; row < x.data.length; row += n) {
    let max = -Infinity;
    for (let j = 0; j < n; j++) max = Math.max(max, x.data[row + j]);
    let sum = 0;
    for (let j = 0; j < n; j++) {
      const e = Math.exp(x.data[row + j] - max);
      out.data[row + j] = e;
      sum += e;
    }
    for (let j = 0; j < n; j++) out.data[row + j] /= sum;
  }
  return out;
}

function add(a: Tensor, b: Tensor): Tensor {
  const out: Tensor = { shape: a.shape, data: new Float64Array(a.data.length) };
  for (let i = 0; i < a.data.length; i++) out.data[i] = a.data[i] + b.data[i];
  return out;
}

// -- the model, in dataflow order (reference/parity_reference/model.py) ---------------------------------------------

/** The 2017 paper's positions: sin on even columns, cos on odd, wavelengths 2*pi .. 10000*2*pi.
 *  inv_freq = 10000 ** (-(2i) / d), angle = pos * inv_freq, all float64. */
export function sinusoidalPositions(nPos: number, dModel: number): Tensor {
  const half = dModel / 2;
  const invFreq = new Float64Array(half); // (d/2,)
  for (let i = 0; i < half; i++) invFreq[i] = Math.pow(10000, -(2 * i) / dModel);
  const table = zeros(nPos, dModel); // (T, d)
  for (let pos = 0; pos < nPos; pos++) {
    for (let i = 0; i < half; i++) {
      const angle = pos * invFreq[i]; // (T, d/2)
      table.data[pos * dModel + 2 * i] = Math.sin(angle);
      table.data[pos * dModel + 2 * i + 1] = Math.cos(angle);
    }
  }
  return table;
}

/** LayerNorm over the last axis with the biased variance (divide by d, not d - 1). */
export function layerNorm(
  x: Tensor,
  weight: Tensor,
  bias: Tensor,
  eps: number,
  taps: Taps | null,
  name: string,
): Tensor {
  const [T, d] = x.shape as [number, number];
  const scale = zeros(T, 1); // (T, 1)
  const normalized = zeros(T, d); // (T, d)
  const out = zeros(T, d); // (T, d)
  const centered = new Float64Array(d); // (d,) one row of x - mean
  for (let t = 0; t < T; t++) {
    let sum = 0;
    for (let j = 0; j < d; j++) sum += x.data[t * d + j];
    const mean = sum / d;
    let sq = 0;
    for (let j = 0; j < d; j++) {
      centered[j] = x.data[t * d + j] - mean;
      sq += centered[j] * centered[j];
    }
    const s = Math.sqrt(sq / d + eps);
    scale.data[t] = s;
    for (let j = 0; j < d; j++) {
      const nrm = centered[j] / s;
      normalized.data[t * d + j] = nrm;
      out.data[t * d + j] = nrm * weight.data[j] + bias.data[j];
    }
  }
  record(taps, `${name}.hook_scale`, scale);
  record(taps, `${name}.hook_normalized`, normalized);
  return out;
}

/** The exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), not the tanh approximation. */
export function gelu(x: Tensor): Tensor {
  const out: Tensor = { shape: x.shape, data: new Float64Array(x.data.length) };
  for (let i = 0; i < x.data.length; i++) {
    const v = x.data[i];
    out.data[i] = 0.5 * v * (1.0 + erf(v / Math.SQRT2));
  }
  return out;
}

/** GPT-2's own activation, the tanh approximation x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), written as
 *  transformers' NewGELUActivation writes it (x^3 as x * x * x, which is how torch computes its pow(x, 3)). */
export function geluNew(x: Tensor): Tensor {
  const out: Tensor = { shape: x.shape, data: new Float64Array(x.data.length) };
  const c = Math.sqrt(2.0 / Math.PI);
  for (let i = 0; i < x.data.length; i++) {
    const v = x.data[i];
    out.data[i] = 0.5 * v * (1.0 + Math.tanh(c * (v + 0.044715 * (v * v * v))));
  }
  return out;
}

/** Multi-head self-attention on LN1's output; returns c_proj(z) with its bias. */
export function attention(
  x: Tensor,
  params: Params,
  prefix: string,
  config: GPTConfig,
  taps: Taps | null,
  name: string,
): Tensor {
  const T = x.shape[0]!;
  const d = config.d_model;
  const H = config.n_head;
  const dh = dHead(config);
  const qkv = linear(x, param(params, prefix + "c_attn.weight"), param(params, prefix + "c_attn.bias")); // (T, 3d)
  const q = zeros(T, H, dh); // (T, H, dh): columns [0, d) of qkv, heads side by side
  const k = zeros(T, H, dh); // (T, H, dh): columns [d, 2d)
  const v = zeros(T, H, dh); // (T, H, dh): columns [2d, 3d)
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < d; c++) {
      q.data[t * d + c] = qkv.data[t * 3 * d + c];
      k.data[t * d + c] = qkv.data[t * 3 * d + d + c];
      v.data[t * d + c] = qkv.data[t * 3 * d + 2 * d + c];
    }
  }
  record(taps, `${name}.hook_q`, q);
  record(taps, `${name}.hook_k`, k);
  record(taps, `${name}.hook_v`, v);
  const scores = zeros(H, T, T); // (H, T, T): query i, key j
  const rootDh = Math.sqrt(dh);
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        let dot = 0;
        for (let e = 0; e < dh; e++) dot += q.data[(i * H + h) * dh + e] * k.data[(j * H + h) * dh + e];
        // Masked cells (key j after query i) are -inf, as masked_fill does after the division.
        scores.data[(h * T + i) * T + j] = config.causal && j > i ? -Infinity : dot / rootDh;
      }
    }
  }
  record(taps, `${name}.hook_attn_scores`, scores);
  const pattern = softmax(scores); // (H, T, T): over keys
  record(taps, `${name}.hook_pattern`, pattern);
  const z = zeros(T, H, dh); // (T, H, dh)
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let e = 0; e < dh; e++) {
        let acc = 0;
        for (let j = 0; j < T; j++) acc += pattern.data[(h * T + i) * T + j] * v.data[(j * H + h) * dh + e];
        z.data[(i * H + h) * dh + e] = acc;
      }
    }
  }
  record(taps, `${name}.hook_z`, z);
  const zFlat: Tensor = { shape: [T, d], data: z.data }; // (T, d): heads side by side
  return linear(zFlat, param(params, prefix + "c_proj.weight"), param(params, prefix + "c_proj.bias")); // (T, d)
}

/** The position-wise network d -> d_mlp -> d with the config's activation: the exact GELU, or gelu_new. */
export function mlp(x: Tensor, params: Params, prefix: string, config: GPTConfig, taps: Taps | null, name: string): Tensor {
  const pre = linear(x, param(params, prefix + "c_fc.weight"), param(params, prefix + "c_fc.bias")); // (T, d_mlp)
  record(taps, `${name}.hook_pre`, pre);
  const post = config.activation === "gelu_new" ? geluNew(pre) : gelu(pre); // (T, d_mlp)
  record(taps, `${name}.hook_post`, post);
  return linear(post, param(params, prefix + "c_proj.weight"), param(params, prefix + "c_proj.bias")); // (T, d)
}

/** One pre-LN GPT-2 block: x + Attn(LN1(x)), then + MLP(LN2(.)). */
export function block(x: Tensor, params: Params, i: number, config: GPTConfig, taps: Taps | null): Tensor {
  const p = `h.${i}.`;
  const name = `blocks.${i}`;
  record(taps, `${name}.hook_resid_pre`, x);
  const ln1 = layerNorm(x, param(params, p + "ln_1.weight"), param(params, p + "ln_1.bias"), config.ln_eps, taps, `${name}.ln1`); // (T, d)
  const attnOut = attention(ln1, params, p + "attn.", config, taps, `${name}.attn`); // (T, d)
  record(taps, `${name}.hook_attn_out`, attnOut);
  const residMid = add(x, attnOut); // (T, d)
  record(taps, `${name}.hook_resid_mid`, residMid);
  const ln2 = layerNorm(residMid, param(params, p + "ln_2.weight"), param(params, p + "ln_2.bias"), config.ln_eps, taps, `${name}.ln2`); // (T, d)
  const mlpOut = mlp(ln2, params, p + "mlp.", config, taps, `${name}.mlp`); // (T, d)
  record(taps, `${name}.hook_mlp_out`, mlpOut);
  const residPost = add(residMid, mlpOut); // (T, d)
  record(taps, `${name}.hook_resid_post`, residPost);
  return residPost;
}

/** Final LayerNorm, then scores against every word: tied embeddings, logits = LN_f(x) @ wte^T. */
export function unembed(x: Tensor, params: Params, config: GPTConfig, taps: Taps | null, name: string): Tensor {
  const ln = layerNorm(x, param(params, "ln_f.weight"), param(params, "ln_f.bias"), config.ln_eps, taps, name); // (T, d)
  return linearTransposed(ln, param(params, "wte.weight")); // (T, V)
}

/** The last `rows` rows of a (T, n) tensor (all of them when T <= rows): a copy. */
function lastRows(x: Tensor, rows: number | null): Tensor {
  const [T, n] = x.shape as [number, number];
  if (rows === null || rows >= T) return x;
  return { shape: [rows, n], data: x.data.slice((T - rows) * n) }; // (rows, n)
}

/** Rows of (r, n) tensors one after another: (sum of r, n), as torch.cat(..., dim=-2). */
function concatRows(parts: readonly Tensor[]): Tensor {
  const n = parts[0]!.shape[1]!;
  const rows = parts.reduce((sum, p) => sum + p.shape[0]!, 0);
  const out = zeros(rows, n); // (sum of r, n)
  let offset = 0;
  for (const p of parts) {
    out.data.set(p.data, offset);
    offset += p.data.length;
  }
  return out;
}

/** A (k * r, m) tensor cut into k tensors of r rows each (copies), as torch.split(..., r, dim=-2). */
function splitRows(x: Tensor, k: number): Tensor[] {
  const [rows, m] = x.shape as [number, number];
  const r = rows / k;
  return Array.from({ length: k }, (_, i) => ({ shape: [r, m], data: x.data.slice(i * r * m, (i + 1) * r * m) })); // (r, m) each
}

/** The whole pass: token ids (T,) -> logits (T, V). Fills `taps` in dataflow order if given.
 *  `lensRows`: probs and every logit_lens.k for the last min(T, lensRows) positions only (the
 *  fixture's "rows" of those taps: a [T, V] tap per stream does not scale to GPT-2). */
export function forward(
  params: Params,
  config: GPTConfig,
  tokens: readonly number[],
  taps: Taps | null = null,
  lensRows: number | null = null,
): Tensor {
  const T = tokens.length;
  const d = config.d_model;
  if (T > config.n_ctx) throw new Error(`sequence of ${T} tokens is longer than the context (${config.n_ctx})`);
  const wte = param(params, "wte.weight"); // (V, d)
  const embed = zeros(T, d); // (T, d)
  tokens.forEach((token, t) => {
    if (!Number.isInteger(token) || token < 0 || token >= config.vocab_size) {
      throw new Error(`token id ${token} out of range [0, ${config.vocab_size})`);
    }
    embed.data.set(wte.data.subarray(token * d, (token + 1) * d), t * d);
  });
  record(taps, "hook_embed", embed);
  let posEmbed: Tensor; // (T, d)
  if (config.positions === "learned") {
    posEmbed = { shape: [T, d], data: param(params, "wpe.weight").data.slice(0, T * d) }; // (T, d)
  } else {
    posEmbed = sinusoidalPositions(T, d); // (T, d)
  }
  record(taps, "hook_pos_embed", posEmbed);
  let x = add(embed, posEmbed); // (T, d): the residual stream
  const streams = [x]; // stream k = input of block k; stream L = output of the last block
  for (let i = 0; i < config.n_layer; i++) {
    x = block(x, params, i, config, taps); // (T, d)
    streams.push(x);
  }
  const logits = unembed(x, params, config, taps, "ln_final"); // (T, V)
  record(taps, "logits", logits);
  if (taps !== null) {
    taps.set("probs", softmax(lastRows(logits, lensRows))); // (T or rows, V)
    // The logit lens: read stream k as if it were the last. Every stream's rows in one product, so the
    // (V, d) table is read once, not once per stream (row by row, the same LayerNorm and dot products).
    const kept = streams.map((stream) => lastRows(stream, lensRows)); // L + 1 of (T or rows, d)
    const lens = unembed(concatRows(kept), params, config, null, ""); // ((L + 1) * rows, V)
    splitRows(lens, kept.length).forEach((part, k) => taps.set(`logit_lens.${k}`, softmax(part))); // (T or rows, V)
  }
  return logits;
}

/** Every tap for one sequence, in dataflow order. */
export function runWithTaps(params: Params, config: GPTConfig, tokens: readonly number[]): Taps {
  const taps: Taps = new Map();
  forward(params, config, tokens, taps);
  return taps;
}

// -- incremental decoding: a key/value cache, one new token per step (reference/parity_reference/model.py) ----------
//
// The cache holds, for every block, the keys and values of every position read so far, each
// [H, T, d_head] (heads first: the layout attention reads them in). `prefill` fills it from the
// full forward over the prompt; each `decodeStep` adds the token at position T (the cache's
// length), appends its keys and values, then lets its query read all T + 1 positions.

/** One block's cache: keys and values [H, T, d_head], T = positions read so far. */
export interface BlockCache {
  readonly k: Tensor; // (H, T, dh)
  readonly v: Tensor; // (H, T, dh)
}

export type Cache = BlockCache[];

/** What a prefill or a decode step gives: the newest position's logits (V,) and the cache after it. */
export interface DecodeStepResult {
  readonly logits: Tensor; // (V,)
  readonly cache: Cache;
}

/** Where (head h, position t) starts in a cache tensor of T positions: the layout [H, T, d_head]. */
function cacheOffset(h: number, t: number, T: number, H: number, dh: number): number {
  return (h * T + t) * dh;
}

/** Rows (S, H, dh) appended after the T positions of a cache tensor (H, T, dh): a new (H, T + S, dh). */
function appendRows(cache: Tensor | null, rows: Tensor, H: number, dh: number): Tensor {
  const T = cache === null ? 0 : cache.shape[1]!;
  const S = rows.shape[0]!;
  const out = zeros(H, T + S, dh); // (H, T + S, dh)
  for (let h = 0; h < H; h++) {
    for (let t = 0; t < T + S; t++) {
      const from = t < T ? cacheOffset(h, t, T, H, dh) : ((t - T) * H + h) * dh;
      const src = t < T ? cache!.data : rows.data;
      out.data.set(src.subarray(from, from + dh), cacheOffset(h, t, T + S, H, dh));
    }
  }
  return out;
}

/** The prompt through the full forward: its last position's logits (V,) and every block's cache. */
export function prefill(params: Params, config: GPTConfig, tokens: readonly number[]): DecodeStepResult {
  const taps: Taps = new Map();
  const logits = forward(params, config, tokens, taps); // (T, V)
  const H = config.n_head;
  const dh = dHead(config);
  const V = config.vocab_size;
  const cache: Cache = [];
  for (let i = 0; i < config.n_layer; i++) {
    const k = appendRows(null, taps.get(`blocks.${i}.attn.hook_k`)!, H, dh); // (T, H, dh) -> (H, T, dh)
    const v = appendRows(null, taps.get(`blocks.${i}.attn.hook_v`)!, H, dh); // (T, H, dh) -> (H, T, dh)
    cache.push({ k, v });
  }
  return { logits: { shape: [V], data: logits.data.slice((tokens.length - 1) * V) }, cache };
}

/** Attention of one new position (x: LN1's output, (1, d)) over the cached positions and itself.
 *  Returns c_proj(z) with its bias (1, d), and the block's cache with the new position appended. */
export function attentionStep(
  x: Tensor,
  params: Params,
  prefix: string,
  config: GPTConfig,
  cache: BlockCache,
): { readonly out: Tensor; readonly cache: BlockCache } {
  const d = config.d_model;
  const H = config.n_head;
  const dh = dHead(config);
  const pos = cache.k.shape[1]!; // the new token's position: T positions are cached before it
  const qkv = linear(x, param(params, prefix + "c_attn.weight"), param(params, prefix + "c_attn.bias")); // (1, 3d)
  const q = qkv.data.subarray(0, d); // (H, dh): the query, heads side by side
  const keys = appendRows(cache.k, { shape: [1, H, dh], data: qkv.data.slice(d, 2 * d) }, H, dh); // (H, T + 1, dh)
  const values = appendRows(cache.v, { shape: [1, H, dh], data: qkv.data.slice(2 * d) }, H, dh); // (H, T + 1, dh)
  const T = pos + 1; // keys read: the cached positions and the new one, appended before use
  const z = zeros(1, d); // (1, d): heads side by side
  for (let h = 0; h < H; h++) {
    const stepScores = zeros(1, T); // (1, T + 1) of head h: the query against every key
    for (let j = 0; j < T; j++) {
      const kj = cacheOffset(h, j, T, H, dh);
      let dot = 0;
      for (let e = 0; e < dh; e++) dot += q[h * dh + e] * keys.data[kj + e];
      // A key after the query's position is masked; none is: the query is the newest position.
      stepScores.data[j] = config.causal && j > pos ? -Infinity : dot / Math.sqrt(dh);
    }
    const weights = softmax(stepScores); // (1, T + 1): over keys
    for (let e = 0; e < dh; e++) {
      let acc = 0;
      for (let j = 0; j < T; j++) acc += weights.data[j] * values.data[cacheOffset(h, j, T, H, dh) + e];
      z.data[h * dh + e] = acc;
    }
  }
  const out = linear(z, param(params, prefix + "c_proj.weight"), param(params, prefix + "c_proj.bias")); // (1, d)
  return { out, cache: { k: keys, v: values } };
}

/** Block i on one new position (x: (1, d)): the block's output (1, d) and its grown cache. */
export function blockStep(
  x: Tensor,
  params: Params,
  i: number,
  config: GPTConfig,
  cache: BlockCache,
): { readonly out: Tensor; readonly cache: BlockCache } {
  const p = `h.${i}.`;
  const ln1 = layerNorm(x, param(params, p + "ln_1.weight"), param(params, p + "ln_1.bias"), config.ln_eps, null, ""); // (1, d)
  const attn = attentionStep(ln1, params, p + "attn.", config, cache); // (1, d)
  const mid = add(x, attn.out); // (1, d)
  const ln2 = layerNorm(mid, param(params, p + "ln_2.weight"), param(params, p + "ln_2.bias"), config.ln_eps, null, ""); // (1, d)
  return { out: add(mid, mlp(ln2, params, p + "mlp.", config, null, "")), cache: attn.cache }; // (1, d)
}

/** One new token at position T, the cache's length: its logits (V,) and the cache at T + 1. */
export function decodeStep(params: Params, config: GPTConfig, token: number, cache: Cache): DecodeStepResult {
  const d = config.d_model;
  const pos = cache[0]!.k.shape[1]!; // T: positions already cached
  if (pos + 1 > config.n_ctx) throw new Error(`position ${pos} is past the context (${config.n_ctx})`);
  if (!Number.isInteger(token) || token < 0 || token >= config.vocab_size) {
    throw new Error(`token id ${token} out of range [0, ${config.vocab_size})`);
  }
  const wte = param(params, "wte.weight"); // (V, d)
  const embed: Tensor = { shape: [1, d], data: wte.data.slice(token * d, (token + 1) * d) }; // (1, d)
  const posRow =
    config.positions === "learned"
      ? param(params, "wpe.weight").data.slice(pos * d, (pos + 1) * d)
      : sinusoidalPositions(pos + 1, d).data.slice(pos * d); // (1, d): position T's row
  let x = add(embed, { shape: [1, d], data: posRow }); // (1, d)
  const grown: Cache = [];
  for (let i = 0; i < config.n_layer; i++) {
    const step = blockStep(x, params, i, config, cache[i]!); // (1, d)
    x = step.out;
    grown.push(step.cache);
  }
  const logits = unembed(x, params, config, null, ""); // (1, V)
  return { logits: { shape: [config.vocab_size], data: logits.data }, cache: grown };
}

/** The greedy choice: the index of the largest logit, the first one on a tie (as torch.argmax). */
export function argmax(logits: Tensor): number {
  let best = 0;
  for (let j = 1; j < logits.data.length; j++) if (logits.data[j]! > logits.data[best]!) best = j;
  return best;
}

/** Prefill the prompt, then `steps` decode steps: results for steps 0 (prefill) .. `steps`.
 *  Step k (k >= 1) feeds `feed[k - 1]`, or without `feed` the greedy token of step k - 1. */
export function decode(
  params: Params,
  config: GPTConfig,
  prompt: readonly number[],
  steps: number,
  feed: readonly number[] | null = null,
): DecodeStepResult[] {
  const out = [prefill(params, config, prompt)];
  for (let k = 0; k < steps; k++) {
    const last = out[out.length - 1]!;
    const token = feed !== null ? feed[k]! : argmax(last.logits);
    out.push(decodeStep(params, config, token, last.cache));
  }
  return out;
}

// -- loading parameters (reference/parity_reference/model.py load_weights) ------------------------------------------

/** A tensor as decoded from a weights file: float32 or float64 values and a shape. */
export interface RawTensor {
  readonly shape: readonly number[];
  readonly data: Float32Array | Float64Array;
}

/** Check the decoded weights against the config and upcast them to float64.
 *  Accepts a Hugging Face GPT2LMHeadModel file too: a leading `transformer.` is dropped, and
 *  `lm_head.weight` is dropped when it equals `wte.weight` (tied). */
/** Whether every value is finite: a plain loop (`every` with a callback costs a call per value). */
function allFinite(data: Float64Array): boolean {
  for (let i = 0; i < data.length; i++) if (!Number.isFinite(data[i]!)) return false;
  return true;
}

export function loadParams(raw: ReadonlyMap<string, RawTensor>, config: GPTConfig): Map<string, Tensor> {
  const tensors = new Map<string, RawTensor>();
  for (const [k, v] of raw) tensors.set(k.startsWith("transformer.") ? k.slice("transformer.".length) : k, v);
  const head = tensors.get("lm_head.weight");
  const wte = tensors.get("wte.weight");
  if (head !== undefined && wte !== undefined && head.data.length === wte.data.length && head.data.every((v, i) => v === wte.data[i])) {
    tensors.delete("lm_head.weight");
  }
  const params = new Map<string, Tensor>();
  for (const [name, shape] of paramShapes(config)) {
    const t = tensors.get(name);
    if (t === undefined) throw new Error(`missing tensor '${name}' (expected shape [${shape.join(", ")}])`);
    if (t.shape.length !== shape.length || t.shape.some((s, i) => s !== shape[i])) {
      throw new Error(`tensor '${name}' has shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    const data = products.alloc(t.data.length); // where the matrix products can read it (`useMatrixProducts`)
    data.set(t.data); // float32 -> float64 is exact (one native copy, not an iterator)
    if (!allFinite(data)) throw new Error(`tensor '${name}' has non-finite values (NaN or Inf)`);
    params.set(name, { shape, data });
  }
  const extra = [...tensors.keys()].filter((k) => !params.has(k)).sort();
  if (extra.length > 0) throw new Error(`unexpected tensor(s) ${extra.map((k) => `'${k}'`).join(", ")}`);
  return params;
}
