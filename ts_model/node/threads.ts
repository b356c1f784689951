// The matrix products for Node: the WebAssembly kernels (./wasm-kernels.ts) on one or several threads
// (worker_threads), every array in one shared WebAssembly memory, each thread over its own range of
// output columns, the calling thread blocking (Atomics.wait) until every worker is done. Every cell is
// computed over k in the same order as model.ts's own kernels, whatever the thread count: the outputs are
// the same bit for bit (ts_model/tests/threads.test.ts, ts_model/tests/kernels.test.ts).
//
// run.ts installs it for every fixture: with PARITY_TS_THREADS threads in all (default: the machine's
// available parallelism, at most 4) from 1 M parameters on (a GPT-2-sized fixture), one thread below
// (the toy: a few thousand multiply-adds a product, no worker started). A product whose weights are not
// in the memory (past wasm32's 4 GiB) runs model.ts's JavaScript kernel on this thread.

import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";

import { SINGLE_THREAD } from "../model/model.ts";
import type { MatrixProducts, ProductKind } from "../model/model.ts";
import { WasmHeap, instantiateKernels, kernelModule } from "./wasm-kernels.ts";

/** Below this many multiply-adds a product runs on the calling thread: a hand-off costs ~0.1 ms. */
const MIN_SPLIT = 1 << 20;
const MAX_THREADS = 4;
/** The kernels' tile is 4 columns wide: every range but the last starts and ends on one. */
const TILE = 4;

/** One product's share for a worker: x, w, o are byte offsets into the shared memory; `done` is set to 1
 * (or 2 on an error) when finished. */
export interface Job {
  kind: ProductKind;
  x: number;
  w: number;
  o: number;
  T: number;
  n: number;
  m: number;
  j0: number;
  j1: number;
  done: Int32Array;
  slot: number;
}

/** What a worker is started with: the memory every array lives in, and the compiled kernels. */
export interface WorkerSetup {
  memory: WebAssembly.Memory;
  module: WebAssembly.Module;
}

/** Threads in all from PARITY_TS_THREADS (a whole number >= 1) or the machine; an unusable value throws. */
export function threadCount(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.PARITY_TS_THREADS;
  if (raw === undefined || raw === "") return Math.max(1, Math.min(MAX_THREADS, availableParallelism()));
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 1 || n > 64) {
    throw new Error(`PARITY_TS_THREADS=${JSON.stringify(raw)}: expected a whole number from 1 to 64`);
  }
  return n;
}

/** Column ranges [j0, j1) for `parts` threads, each but the last a whole number of tiles wide. */
export function columnRanges(m: number, parts: number): [number, number][] {
  const width = Math.ceil(m / parts / TILE) * TILE;
  const ranges: [number, number][] = [];
  for (let j0 = 0; j0 < m; j0 += width) ranges.push([j0, Math.min(m, j0 + width)]);
  return ranges;
}

/** The engine: MatrixProducts, `close` (ends the workers) and `counts` (products run so far, by where). */
export interface ThreadedProducts extends MatrixProducts {
  close(): void;
  readonly counts: { split: number; oneThread: number; javascript: number };
}

/** An engine with `threads` threads in all: this one and threads - 1 workers (unref'd: they never keep
 * the process alive); products of fewer than `minSplit` multiply-adds stay on this thread. */
export function threadedProducts(threads: number, minSplit = MIN_SPLIT): ThreadedProducts {
  const heap = new WasmHeap();
  const module = kernelModule();
  const kernels = instantiateKernels(heap.memory, module);
  const setup: WorkerSetup = { memory: heap.memory, module };
  const workers = Array.from({ length: Math.max(0, threads - 1) }, () => {
    const w = new Worker(new URL("./threads-worker.ts", import.meta.url), { workerData: setup });
    w.unref();
    return w;
  });
  const counts = { split: 0, oneThread: 0, javascript: 0 };
  const javascript = (kind: ProductKind, xd: Float64Array, wd: Float64Array, T: number, n: number, m: number) => {
    counts.javascript++;
    return SINGLE_THREAD.run(kind, xd, wd, T, n, m); // (T, m)
  };
  return {
    counts,
    alloc(length) {
      return heap.tryAlloc(length) ?? new Float64Array(length); // past 4 GiB: an ordinary array
    },
    run(kind, xd, wd, T, n, m) {
      if (!heap.owns(wd)) return javascript(kind, xd, wd, T, n, m); // (T, m)
      const xs = heap.owns(xd) ? xd : heap.scratch("x", xd.length);
      const os = heap.scratch("out", T * m);
      if (xs === null || os === null) return javascript(kind, xd, wd, T, n, m); // the memory is full
      if (xs !== xd) xs.set(xd);
      const [x, w, o] = [xs.byteOffset, wd.byteOffset, os.byteOffset];
      const split = workers.length > 0 && T * n * m >= minSplit;
      const ranges = split ? columnRanges(m, workers.length + 1) : [[0, m] as [number, number]];
      if (ranges.length > 1) counts.split++;
      else counts.oneThread++;
      const done = new Int32Array(new SharedArrayBuffer(4 * ranges.length));
      ranges.slice(1).forEach(([j0, j1], i) => {
        const job: Job = { kind, x, w, o, T, n, m, j0, j1, done, slot: i + 1 };
        workers[i]!.postMessage(job);
      });
      kernels[kind](x, w, o, T, n, m, ranges[0]![0], ranges[0]![1]);
      for (let slot = 1; slot < ranges.length; slot++) {
        while (Atomics.load(done, slot) === 0) Atomics.wait(done, slot, 0, 1000);
        if (Atomics.load(done, slot) !== 1) throw new Error(`matrix product worker ${slot} failed (${kind}, T=${T})`);
      }
      return os.slice(0, T * m); // (T, m): a copy, the scratch array is the next product's
    },
    close() {
      for (const w of workers) void w.terminate();
    },
  };
}
