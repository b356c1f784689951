// The typescript-browser backend's page: every case of the fixture through model.ts, in the browser.
//
// run-browser.mts opens a page that loads this bundle, then calls `parityRunModel(base)`: it
// fetches the fixture from the local server, runs runWithTaps on every case (float64, JavaScript
// numbers, the browser's own Math), and returns every tap as one safetensors file, base64-encoded,
// F64 under "{case}/{tap}" in the manifest's order: what ts_model/node/run.ts writes under Node.

import { computeAllTaps } from "../model/taps.ts";
import { serializeSafetensors } from "../model/safetensors.ts";
import { fetchFixture, fetchParams, toBase64 } from "./fetch-fixture.ts";

async function parityRunModel(base: string): Promise<string> {
  const { fixture } = await fetchFixture(base);
  const params = await fetchParams(base, fixture);
  const out = computeAllTaps(fixture, params);
  const metadata = { producer: "parity ts_model/browser/page-model.ts", precision: "fp64", userAgent: navigator.userAgent };
  return toBase64(serializeSafetensors(out, metadata));
}

Object.assign(globalThis, { parityRunModel });
