// The entry point the harness calls: node ts_model/run.ts FIXTURE_DIR OUT.safetensors
//
// Reads the fixture's manifest and weights, runs every case through model.ts in float64, and
// writes every tap of every case to one safetensors file: F64 tensors under "{case}/{tap}" in
// the manifest's order, masked attention scores as -Infinity. On any error: one line on stderr
// and exit code 2 (bad input) or 1 (anything else).

import { readFixture, readParams, FixtureError } from "./fixture.ts";
import { SafetensorsError, writeSafetensors } from "./safetensors.ts";
import { computeAllTaps } from "./taps.ts";

function main(argv: readonly string[]): void {
  if (argv.length !== 2) {
    throw new FixtureError("usage: node ts_model/run.ts FIXTURE_DIR OUT.safetensors");
  }
  const [fixtureDir, outPath] = argv as [string, string];
  const fixture = readFixture(fixtureDir);
  const out = computeAllTaps(fixture, readParams(fixture));
  writeSafetensors(outPath, out, { producer: "parity ts_model/run.ts", precision: "fp64" });
}

try {
  main(process.argv.slice(2));
} catch (err) {
  const message = (err instanceof Error ? err.message : String(err)).replace(/\s+/g, " ");
  process.stderr.write(`run.ts: ${message}\n`);
  process.exitCode = err instanceof FixtureError || err instanceof SafetensorsError ? 2 : 1;
}
