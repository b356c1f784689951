// The threaded matrix products (../node/threads.ts) against the one-thread engine: the same bits, on
// shapes that leave remainders (T not a multiple of 4, odd m, a range of one column), and the model's
// taps the same through either engine.

import assert from "node:assert/strict";
import { test } from "node:test";

import { SINGLE_THREAD, runWithTaps, useMatrixProducts, paramShapes } from "../model/model.ts";
import type { GPTConfig, ProductKind, Tensor } from "../model/model.ts";
import { columnRanges, threadCount, threadedProducts } from "../node/threads.ts";

/** Deterministic values in [-1, 1) with many significant bits (a 32-bit LCG). */
function values(length: number, seed: number): Float64Array {
  const out = new Float64Array(length);
  let s = seed >>> 0;
  for (let i = 0; i < length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1 + s / 2 ** 53;
  }
  return out;
}

function sameBits(a: Float64Array, b: Float64Array): boolean {
  return a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

test("column ranges cover [0, m) once, in order, every width but the last even", () => {
  for (const [m, parts] of [[1, 2], [7, 2], [50257, 2], [3072, 3], [10, 4], [5, 8]] as const) {
    const ranges = columnRanges(m, parts);
    assert.equal(ranges[0]![0], 0);
    assert.equal(ranges.at(-1)![1], m);
    ranges.forEach(([j0, j1], i) => {
      assert.ok(j1 > j0, `empty range ${j0}..${j1}`);
      if (i > 0) assert.equal(j0, ranges[i - 1]![1]);
      if (i < ranges.length - 1) assert.equal((j1 - j0) % 2, 0);
    });
    assert.ok(ranges.length <= parts);
  }
});

test("threaded products equal one thread's bit for bit, remainders included", () => {
  const engine = threadedProducts(3);
  try {
    const shapes: [number, number, number][] = [[128, 96, 301], [7, 64, 4097], [1, 1024, 1025], [5, 257, 1500]];
    for (const kind of ["linear", "linearTransposed"] as ProductKind[]) {
      for (const [T, n, m] of shapes) {
        const x = values(T * n, T + n);
        const w = engine.alloc(n * m);
        w.set(values(n * m, m));
        const one = SINGLE_THREAD.run(kind, x, w, T, n, m);
        const many = engine.run(kind, x, w, T, n, m);
        assert.ok(T * n * m < 1 << 20 || many.buffer instanceof SharedArrayBuffer, `${kind} ${T}x${n}x${m} was not split`);
        assert.ok(sameBits(one, many), `${kind} ${T}x${n}x${m}: threaded result differs`);
      }
    }
  } finally {
    engine.close();
  }
});

test("the model's taps are the same through the threaded engine", () => {
  const config: GPTConfig = { vocab_size: 600, n_ctx: 16, d_model: 64, n_layer: 1, n_head: 2, d_mlp: 256,
    positions: "sinusoidal", ln_eps: 1e-5, causal: true };
  const tokens = [1, 5, 9, 2, 599, 0, 3, 7, 11];
  const taps = (alloc: (n: number) => Float64Array): Map<string, Tensor> => {
    const params = new Map<string, Tensor>();
    let seed = 1;
    for (const [name, shape] of paramShapes(config)) {
      const n = shape.reduce((a, b) => a * b, 1);
      const data = alloc(n);
      data.set(values(n, seed++).map((v) => v * 0.2));
      params.set(name, { shape, data });
    }
    return runWithTaps(params, config, tokens);
  };
  const one = taps(SINGLE_THREAD.alloc);
  const engine = threadedProducts(2, 0); // every product split, however small
  useMatrixProducts(engine); // and the parameters allocated in shared memory
  try {
    const many = taps(engine.alloc);
    assert.deepEqual([...many.keys()], [...one.keys()]);
    for (const [name, value] of one) assert.ok(sameBits(value.data, many.get(name)!.data), `tap ${name} differs`);
  } finally {
    useMatrixProducts(null);
    engine.close();
  }
});

test("PARITY_TS_THREADS: a whole number from 1 to 64, else a clear error", () => {
  assert.equal(threadCount({ PARITY_TS_THREADS: "3" }), 3);
  assert.ok(threadCount({}) >= 1 && threadCount({}) <= 4);
  for (const bad of ["0", "-1", "2.5", "many", "65"]) {
    assert.throws(() => threadCount({ PARITY_TS_THREADS: bad }), /PARITY_TS_THREADS=.*whole number from 1 to 64/);
  }
});
