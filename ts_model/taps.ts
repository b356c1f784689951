// Every tap of every case of a fixture, computed by model.ts in float64: what run.ts and dump.mts
// write. Keys are "{case}/{tap}", cases in the manifest's order, taps in dataflow order.

import type { Fixture } from "./fixture.ts";
import { runWithTaps } from "./model.ts";
import type { Params, Tensor } from "./model.ts";

export function computeAllTaps(fixture: Fixture, params: Params): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const c of fixture.cases) {
    const taps = runWithTaps(params, fixture.config, c.tokens);
    for (const tap of fixture.taps) {
      const value = taps.get(tap);
      if (value === undefined) throw new Error(`case '${c.name}': the model produced no tap '${tap}'`);
      out.set(`${c.name}/${tap}`, value);
    }
  }
  return out;
}
