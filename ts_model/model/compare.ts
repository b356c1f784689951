// Compare one tap of one case with its golden tensor, the harness's rule (harness/parity_harness/_compare/judge.py):
// a cell passes when |a - b| <= atol + rtol * |b|; an infinity must meet the same infinity; NaN
// fails. Pure (no Node APIs): ../node/verify-forward.mts and the learners' page (../web/) share it.

import { FixtureError } from "./fixture.ts";
import type { Tolerance } from "./fixture.ts";
import type { Tensor } from "./model.ts";
import type { SafeTensor } from "./safetensors.ts";

export interface TapResult {
  readonly ok: boolean;
  readonly maxAbs: number; // over finite cells; Infinity if an infinity or NaN is misplaced
  readonly where: string; // case and index of the worst cell
  readonly note: string; // why it failed, if it did
}

export const fmt = (x: number): string => (Number.isFinite(x) ? x.toExponential(1) : String(x));

export function unravel(flat: number, shape: readonly number[]): number[] {
  const index: number[] = [];
  for (let i = shape.length - 1; i >= 0; i--) {
    index.unshift(flat % shape[i]!);
    flat = Math.floor(flat / shape[i]!);
  }
  return index;
}

/** Compare one tap of one case; `b` is the golden side. */
export function compare(a: Tensor, b: SafeTensor, tol: Tolerance, key: string): TapResult {
  if (a.shape.length !== b.shape.length || a.shape.some((s, i) => s !== b.shape[i])) {
    return { ok: false, maxAbs: Infinity, where: key, note: `shape [${a.shape}] != golden [${b.shape}]` };
  }
  let maxAbs = 0;
  let worstAt = 0;
  let note = "";
  for (let i = 0; i < a.data.length; i++) {
    const x = a.data[i]!;
    const y = Number(b.data[i]!);
    if (Number.isNaN(y)) throw new FixtureError(`golden tensor '${key}' holds NaN (a broken fixture)`);
    let diff: number;
    if (Number.isNaN(x)) {
      diff = Infinity;
      note ||= `NaN at [${unravel(i, a.shape).join(", ")}]`;
    } else if (!Number.isFinite(x) || !Number.isFinite(y)) {
      diff = x === y ? 0 : Infinity; // an infinity matches only the same infinity
      if (diff !== 0) note ||= `${x} where the golden has ${y} at [${unravel(i, a.shape).join(", ")}]`;
    } else {
      diff = Math.abs(x - y);
      if (!(diff <= tol.atol + tol.rtol * Math.abs(y))) note ||= "tolerance exceeded";
    }
    if (diff > maxAbs) {
      maxAbs = diff;
      worstAt = i;
    }
  }
  return { ok: note === "", maxAbs, where: `${key} [${unravel(worstAt, a.shape).join(", ")}]`, note };
}
