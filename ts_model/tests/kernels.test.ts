// The WebAssembly kernels (../node/kernels.wat) against model.ts's JavaScript kernels, bit for bit, on
// shapes and column ranges that reach every tail (rows and columns not a multiple of 4, n = 1, a range
// inside a tile); the committed bytes (kernels-wasm.ts) against their source; the heap's allocator.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { PRODUCT_KERNELS } from "../model/model.ts";
import type { ProductKind } from "../model/model.ts";
import { KERNELS_WASM_BASE64, KERNELS_WAT_SHA256 } from "../node/kernels-wasm.ts";
import { WasmHeap, instantiateKernels } from "../node/wasm-kernels.ts";
import { values } from "./test-values.ts";

const WAT = fileURLToPath(new URL("../node/kernels.wat", import.meta.url));

test("each kernel gives model.ts's bits on every tail, writing only its columns", () => {
  const heap = new WasmHeap();
  const kernels = instantiateKernels(heap.memory);
  const shapes: [number, number, number, number, number][] = [
    [1, 1, 1, 0, 1], [1, 8, 12, 0, 12], [4, 3, 5, 1, 4], [5, 8, 13, 0, 13], [7, 9, 11, 2, 9],
    [9, 17, 35, 3, 34], [13, 8, 32, 0, 32], [16, 64, 50, 4, 48], [3, 5, 7, 6, 7],
  ];
  let checked = 0;
  for (const kind of ["linear", "linearTransposed"] as ProductKind[]) {
    for (const [T, n, m, j0, j1] of shapes) {
      const x = heap.tryAlloc(T * n)!;
      const w = heap.tryAlloc(n * m)!;
      const o = heap.tryAlloc(T * m)!;
      x.set(values(T * n, T * 7 + n));
      w.set(values(n * m, m * 5 + 1));
      o.fill(0.5); // cells outside [j0, j1) must keep it
      const expected = new Float64Array(T * m); // zeros: model.ts's kernels add into it
      PRODUCT_KERNELS[kind](x.slice(), w.slice(), expected, T, n, m, j0, j1);
      kernels[kind](x.byteOffset, w.byteOffset, o.byteOffset, T, n, m, j0, j1);
      for (let t = 0; t < T; t++) {
        for (let j = 0; j < m; j++) {
          const want = j >= j0 && j < j1 ? expected[t * m + j]! : 0.5;
          assert.ok(Object.is(o[t * m + j], want), `${kind} ${T}x${n}x${m} [${j0}, ${j1}) cell (${t}, ${j})`);
          checked++;
        }
      }
    }
  }
  assert.equal(checked, 2 * shapes.reduce((sum, [T, , m]) => sum + T * m, 0)); // every cell, both kinds
});

test("kernels-wasm.ts was assembled from kernels.wat as it is", () => {
  const sha = createHash("sha256").update(readFileSync(WAT, "utf8")).digest("hex");
  assert.equal(KERNELS_WAT_SHA256, sha, "kernels.wat changed: run `npm run build:kernels`");
  assert.ok(WebAssembly.validate(Buffer.from(KERNELS_WASM_BASE64, "base64")));
});

const wabtInstalled = (() => {
  try {
    createRequire(import.meta.url).resolve("wabt");
    return true;
  } catch {
    return false;
  }
})();

test("kernels-wasm.ts holds exactly the bytes wabt assembles", {
  skip: wabtInstalled ? false : "the wabt package is not installed (`npm ci` installs it); the sha256 test still runs",
}, async () => {
  const { assemble, generated } = await import("../node/build-kernels.mts");
  const wat = readFileSync(WAT, "utf8");
  const committed = readFileSync(fileURLToPath(new URL("../node/kernels-wasm.ts", import.meta.url)), "utf8");
  assert.equal(committed, generated(wat, await assemble(wat)));
});

test("the heap hands out aligned zeros it owns, reuses scratch, and says null past 4 GiB", () => {
  const heap = new WasmHeap();
  const a = heap.tryAlloc(3)!;
  const b = heap.tryAlloc(5)!;
  assert.equal(b.byteOffset % 16, 0);
  assert.ok(b.byteOffset >= a.byteOffset + 24);
  assert.ok(b.every((v) => v === 0));
  assert.ok(heap.owns(a) && heap.owns(b) && !heap.owns(new Float64Array(3)) && !heap.owns(a.subarray(1)));
  const s = heap.scratch("x", 10)!;
  assert.equal(heap.scratch("x", 8), s);
  assert.ok(heap.scratch("x", 11)!.length >= 20);
  assert.equal(heap.tryAlloc(2 ** 29), null); // 4 GiB on top of what is in use
});
