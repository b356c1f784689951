// What the tests of the matrix products share: deterministic inputs, and a bit-for-bit comparison.

/** Deterministic values in [-1, 1) with many significant bits (a 32-bit LCG). */
export function values(length: number, seed: number): Float64Array {
  const out = new Float64Array(length);
  let s = seed >>> 0;
  for (let i = 0; i < length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1 + s / 2 ** 53;
  }
  return out;
}

/** Whether two arrays hold the same bits (NaN payloads and -0 included). */
export function sameBits(a: Float64Array, b: Float64Array): boolean {
  return a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}
