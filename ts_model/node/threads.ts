// The matrix products on several threads (Node's worker_threads): model.ts's kernels, each thread over
// its own range of output columns, the arrays shared (SharedArrayBuffer), the calling thread blocking
// (Atomics.wait) until every worker is done. Every cell is computed by the same kernel, over k in the
// same order, as on one thread: the outputs are the same bit for bit (ts_model/tests/threads.test.ts).
//
// run.ts installs it for a fixture of 1 M parameters or more (a GPT-2-sized one), with
// PARITY_TS_THREADS threads in all (default: the machine's available parallelism, at most 4); the
// toy, a few thousand multiply-adds a product, stays on one thread and starts no worker.

import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";

import { PRODUCT_KERNELS, SINGLE_THREAD } from "../model/model.ts";
import type { MatrixProducts, ProductKind } from "../model/model.ts";

/** Below this many multiply-adds a product runs on the calling thread: a hand-off costs ~0.1 ms. */
const MIN_SPLIT = 1 << 20;
const MAX_THREADS = 4;

/** One product's share for a worker: the arrays are shared, `done` is set to 1 (or 2 on an error) when finished. */
export interface Job {
  kind: ProductKind;
  xd: Float64Array;
  wd: Float64Array;
  od: Float64Array;
  T: number;
  n: number;
  m: number;
  j0: number;
  j1: number;
  done: Int32Array;
  slot: number;
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

function shared(length: number): Float64Array {
  return new Float64Array(new SharedArrayBuffer(length * Float64Array.BYTES_PER_ELEMENT));
}

function isShared(a: Float64Array): boolean {
  return a.buffer instanceof SharedArrayBuffer;
}

/** Column ranges [j0, j1) for `parts` threads, each but the last of an even width (the 2-word tile). */
export function columnRanges(m: number, parts: number): [number, number][] {
  const width = Math.ceil(m / parts / 2) * 2;
  const ranges: [number, number][] = [];
  for (let j0 = 0; j0 < m; j0 += width) ranges.push([j0, Math.min(m, j0 + width)]);
  return ranges;
}

/** An engine with `threads` threads in all: this one and threads - 1 workers (unref'd: they never keep
 * the process alive); products of fewer than `minSplit` multiply-adds stay on this thread. `close` ends
 * the workers. */
export function threadedProducts(threads: number, minSplit = MIN_SPLIT): MatrixProducts & { close(): void } {
  const workers = Array.from({ length: Math.max(0, threads - 1) }, () => {
    const w = new Worker(new URL("./threads-worker.ts", import.meta.url));
    w.unref();
    return w;
  });
  return {
    alloc: shared,
    run(kind, xd, wd, T, n, m) {
      const ranges = columnRanges(m, workers.length + 1);
      if (workers.length === 0 || T * n * m < minSplit || ranges.length < 2 || !isShared(wd)) {
        return SINGLE_THREAD.run(kind, xd, wd, T, n, m); // (T, m)
      }
      const xs = isShared(xd) ? xd : shared(xd.length);
      if (xs !== xd) xs.set(xd);
      const od = shared(T * m); // (T, m)
      const done = new Int32Array(new SharedArrayBuffer(4 * ranges.length));
      ranges.slice(1).forEach(([j0, j1], i) => {
        const job: Job = { kind, xd: xs, wd, od, T, n, m, j0, j1, done, slot: i + 1 };
        workers[i]!.postMessage(job);
      });
      PRODUCT_KERNELS[kind](xs, wd, od, T, n, m, ranges[0]![0], ranges[0]![1]);
      for (let slot = 1; slot < ranges.length; slot++) {
        while (Atomics.load(done, slot) === 0) Atomics.wait(done, slot, 0, 1000);
        if (Atomics.load(done, slot) !== 1) throw new Error(`matrix product worker ${slot} failed (${kind}, T=${T})`);
      }
      return od;
    },
    close() {
      for (const w of workers) void w.terminate();
    },
  };
}
