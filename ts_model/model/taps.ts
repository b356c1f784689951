// Every tap of every case of a fixture, computed by model.ts in float64: what ../node/run.ts and
// ../node/dump.mts write. Keys are "{case}/{tap}", cases in the manifest's order, taps in dataflow order. A tap with
// "rows" in the manifest keeps only its last positions, as the golden does (docs/fixture-format.md).

import { GPT2, rowsAxis } from "./families.ts";
import type { Case, Fixture } from "./fixture.ts";
import { forward, runWithTaps } from "./model.ts";
import type { Params, Taps, Tensor } from "./model.ts";

/** The rows kept of probs and every logit_lens.k when they all agree (else null: compute every position). */
export function lensRows(fixture: Fixture): number | null {
  const lens = fixture.taps.filter((t) => t === "probs" || t.startsWith("logit_lens."));
  const rows = new Set(lens.map((t) => fixture.rows.get(t) ?? null));
  return rows.size === 1 ? [...rows][0]! : null;
}

/** The last `rows` positions of a tap on its position axis (the family's table: axis 1 of attention scores and
 *  patterns, else 0). */
function cutRows(tap: string, value: Tensor, rows: number | undefined, T: number): Tensor {
  const axis = rowsAxis(GPT2, tap);
  if (axis === null || rows === undefined || rows >= T || value.shape[axis] !== T) return value;
  const outer = value.shape.slice(0, axis).reduce((a, b) => a * b, 1);
  const inner = value.shape.slice(axis + 1).reduce((a, b) => a * b, 1);
  const shape = value.shape.map((s, i) => (i === axis ? rows : s));
  const data = new Float64Array(outer * rows * inner);
  for (let o = 0; o < outer; o++) {
    data.set(value.data.subarray((o * T + T - rows) * inner, (o * T + T) * inner), o * rows * inner);
  }
  return { shape, data };
}

/** Every tap of one case, in dataflow order, keyed "{case}/{tap}". */
export function computeCaseTaps(fixture: Fixture, params: Params, c: Case): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  const rows = lensRows(fixture);
  let taps: Taps;
  if (rows === null) {
    taps = runWithTaps(params, fixture.config, c.tokens);
  } else {
    taps = new Map(); // probs and the logit lens for the last `rows` positions only
    forward(params, fixture.config, c.tokens, taps, rows);
  }
  for (const tap of fixture.taps) {
    const value = taps.get(tap);
    if (value === undefined) throw new Error(`case '${c.name}': the model produced no tap '${tap}'`);
    out.set(`${c.name}/${tap}`, cutRows(tap, value, fixture.rows.get(tap), c.tokens.length));
  }
  return out;
}

export function computeAllTaps(fixture: Fixture, params: Params): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const c of fixture.cases) {
    for (const [key, value] of computeCaseTaps(fixture, params, c)) out.set(key, value);
  }
  return out;
}
