// safetensors: round trips, and malformed files refused with a clear error.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { SafetensorsError, parseSafetensors, serializeSafetensors } from "../model/safetensors.ts";
import type { TensorData } from "../model/safetensors.ts";
import { readSafetensors, writeSafetensors } from "../node/safetensors-files.ts";

type Entry = { shape: number[]; data: TensorData };

const sample = (): Map<string, Entry> =>
  new Map<string, Entry>([
    ["a/f64", { shape: [2, 3], data: Float64Array.from([1.5, -Infinity, 0.1, -0, 1e-300, Math.PI]) }],
    ["b.f32", { shape: [3], data: Float32Array.from([0.1, -2, 3.25]) }],
    ["c", { shape: [2, 1], data: Int32Array.from([-7, 2147483647]) }],
    ["d", { shape: [], data: BigInt64Array.from([-(2n ** 62n)]) }],
    ["empty", { shape: [0, 4], data: new Float64Array(0) }],
  ]);

/** A file made of a raw header string and a data buffer of `dataBytes` bytes. */
function rawFile(header: string, dataBytes: number, lengthOverride?: bigint): Uint8Array {
  const h = new TextEncoder().encode(header);
  const out = new Uint8Array(8 + h.length + dataBytes);
  new DataView(out.buffer).setBigUint64(0, lengthOverride ?? BigInt(h.length), true);
  out.set(h, 8);
  return out;
}

test("round trip of every dtype, with metadata, bit for bit", () => {
  const bytes = serializeSafetensors(sample(), { producer: "test" });
  const headerLength = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.equal(headerLength % 8, 0, "header padded to 8 bytes");
  const back = parseSafetensors(bytes);
  assert.deepEqual(back.metadata, { producer: "test" });
  assert.deepEqual([...back.tensors.keys()], [...sample().keys()]);
  for (const [name, t] of sample()) {
    const u = back.tensors.get(name)!;
    assert.deepEqual(u.shape, t.shape);
    assert.equal(u.data.constructor, t.data.constructor);
    assert.deepEqual(u.data, t.data);
  }
  assert.ok(Object.is(back.tensors.get("a/f64")!.data[3], -0));
});

test("files round trip through the file system", () => {
  const dir = mkdtempSync(join(tmpdir(), "parity-st-"));
  try {
    const path = join(dir, "x.safetensors");
    writeSafetensors(path, sample());
    const back = readSafetensors(path);
    assert.equal(back.metadata, null);
    assert.deepEqual(back.tensors.get("b.f32")!.data, Float32Array.from([0.1, -2, 3.25]));
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("a header the Python safetensors library writes is read (unsorted offsets, metadata)", () => {
  const header = '{"__metadata__":{"format":"np"},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},' +
    '"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}';
  const bytes = rawFile(header, 12);
  new DataView(bytes.buffer).setFloat64(8 + header.length, 2.5, true);
  new DataView(bytes.buffer).setFloat32(8 + header.length + 8, -1, true);
  const f = parseSafetensors(bytes);
  assert.equal(f.tensors.get("x")!.data[0], 2.5);
  assert.equal(f.tensors.get("y")!.data[0], -1);
});

const malformed: [string, Uint8Array, RegExp][] = [
  ["too short", new Uint8Array(5), /too short/],
  ["header length beyond the file", rawFile("{}", 0, 1000n), /beyond the end of the file/],
  ["invalid JSON", rawFile('{"x": ', 0), /not valid UTF-8 JSON/],
  ["not an object", rawFile("[1, 2]", 0), /not a JSON object/],
  ["unknown dtype", rawFile('{"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}', 2), /unsupported dtype "BF16"/],
  ["offsets out of range", rawFile('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 4), /out of range/],
  ["begin after end", rawFile('{"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}', 4), /out of range/],
  ["shape * dtype size != byte length", rawFile('{"x":{"dtype":"F64","shape":[3],"data_offsets":[0,16]}}', 16), /needs 24 bytes/],
  [
    "overlapping tensors",
    rawFile('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12),
    /overlap/,
  ],
  ["a gap in the data", rawFile('{"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8), /gap/],
  ["trailing bytes", rawFile('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 8), /cover 4/],
  ["negative shape", rawFile('{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', 4), /shape must be/],
  ["metadata not strings", rawFile('{"__metadata__":{"a":1}}', 0), /not a string/],
];

for (const [what, bytes, message] of malformed) {
  test(`refuses a file with ${what}`, () => {
    assert.throws(() => parseSafetensors(bytes, "bad.safetensors"), (err: unknown) => {
      assert.ok(err instanceof SafetensorsError);
      assert.match(err.message, /^bad\.safetensors: /);
      assert.match(err.message, message);
      return true;
    });
  });
}

test("refuses to write a tensor whose shape does not match its data", () => {
  assert.throws(
    () => serializeSafetensors(new Map([["x", { shape: [3], data: new Float64Array(2) }]])),
    /holds 3 values, data has 2/,
  );
});
