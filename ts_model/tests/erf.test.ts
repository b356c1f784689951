// erf against CPython's math.erf (tests/erf-reference.ts) across its range, in ulps.

import assert from "node:assert/strict";
import { test } from "node:test";

import { erf } from "../model/erf.ts";
import { ERF_REFERENCE } from "./erf-reference.ts";

/** Distance in units in the last place between two finite float64s (0 if equal). */
function ulps(a: number, b: number): number {
  const view = new DataView(new ArrayBuffer(8));
  const ordered = (x: number): bigint => {
    view.setFloat64(0, x);
    const bits = view.getBigInt64(0);
    return bits < 0n ? -(bits & 0x7fffffffffffffffn) : bits; // sign-magnitude -> two's complement order
  };
  const d = ordered(a) - ordered(b);
  return Number(d < 0n ? -d : d);
}

test("erf is within 2 ulp of math.erf at every reference point", () => {
  let worst = 0;
  let worstX = 0;
  for (const [x, want] of ERF_REFERENCE) {
    const got = erf(x);
    const u = ulps(got, want);
    if (u > worst) [worst, worstX] = [u, x];
    assert.ok(u <= 2, `erf(${x}) = ${got}, math.erf gives ${want} (${u} ulp apart)`);
  }
  assert.ok(ERF_REFERENCE.length > 250);
  console.log(`# erf: worst ${worst} ulp (at x = ${worstX}) over ${ERF_REFERENCE.length} points`);
});

test("erf is odd and exact at the special points", () => {
  for (const [x] of ERF_REFERENCE) assert.equal(erf(-x), -erf(x));
  assert.equal(erf(0), 0);
  assert.ok(Object.is(erf(-0), -0));
  assert.equal(erf(Infinity), 1);
  assert.equal(erf(-Infinity), -1);
  assert.ok(Number.isNaN(erf(NaN)));
});

test("erf is monotonic across the fdlibm breakpoints", () => {
  for (const bp of [0.84375, 1.25, 1 / 0.35, 6]) {
    let prev = erf(bp * (1 - 1e-6));
    for (let k = -5; k <= 5; k++) {
      const v = erf(bp * (1 + k * 1e-7));
      assert.ok(v >= prev, `erf not monotonic near ${bp}`);
      prev = v;
    }
  }
});
