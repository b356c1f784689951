// The threaded WebAssembly matrix products (../node/threads.ts) against model.ts's one-thread
// JavaScript engine: the same bits, on shapes that leave remainders (T not a multiple of 4, odd m, a
// range narrower than a tile), and the model's taps the same through either engine.

import assert from "node:assert/strict";
import { test } from "node:test";

import { SINGLE_THREAD, runWithTaps, useMatrixProducts, paramShapes } from "../model/model.ts";
import type { GPTConfig, ProductKind, Tensor } from "../model/model.ts";
import { columnRanges, threadCount, threadedProducts } from "../node/threads.ts";
import { sameBits, values } from "./test-values.ts";

test("column ranges cover [0, m) once, in order, every width but the last a multiple of the 4-column tile", () => {
  for (const [m, parts] of [[1, 2], [7, 2], [50257, 2], [3072, 3], [10, 4], [5, 8]] as const) {
    const ranges = columnRanges(m, parts);
    assert.equal(ranges[0]![0], 0);
    assert.equal(ranges.at(-1)![1], m);
    ranges.forEach(([j0, j1], i) => {
      assert.ok(j1 > j0, `empty range ${j0}..${j1}`);
      if (i > 0) assert.equal(j0, ranges[i - 1]![1]);
      if (i < ranges.length - 1) assert.equal((j1 - j0) % 4, 0);
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
        const split = engine.counts.split;
        const many = engine.run(kind, x, w, T, n, m);
        assert.equal(engine.counts.split, split + (T * n * m >= 1 << 20 ? 1 : 0), `${kind} ${T}x${n}x${m} split or not`);
        assert.ok(sameBits(one, many), `${kind} ${T}x${n}x${m}: threaded result differs`);
      }
    }
    assert.equal(engine.counts.javascript, 0);
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

test("weights outside the kernels' memory run model.ts's JavaScript kernel, with the same result", () => {
  const engine = threadedProducts(1);
  try {
    const [T, n, m] = [5, 33, 70];
    const x = values(T * n, 3);
    const w = values(n * m, 4); // an ordinary array, as alloc gives past wasm32's 4 GiB
    const inMemory = engine.alloc(n * m);
    inMemory.set(w);
    for (const kind of ["linear", "linearTransposed"] as ProductKind[]) {
      assert.ok(sameBits(engine.run(kind, x, w, T, n, m), engine.run(kind, x, inMemory, T, n, m)), kind);
    }
    assert.deepEqual(engine.counts, { split: 0, oneThread: 2, javascript: 2 });
  } finally {
    engine.close();
  }
});
