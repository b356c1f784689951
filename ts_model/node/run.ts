// The entry point the harness calls: node ts_model/node/run.ts FIXTURE_DIR OUT.safetensors [--per-case]
//
// With --per-case, each case is written as soon as it is computed to OUT.safetensors.{i} (i the
// case's index), and dropped: memory holds one case (a GPT-2-sized fixture).
//
// Reads the fixture's manifest and weights, runs every case through ../model/model.ts in float64, and
// writes every tap of every case to one safetensors file: F64 tensors under "{case}/{tap}" in
// the manifest's order, masked attention scores as -Infinity. On any error: one line on stderr
// and exit code 2 (bad input) or 1 (anything else).

import { FixtureError } from "../model/fixture.ts";
import { computeAllTaps, computeCaseTaps } from "../model/taps.ts";
import { readFixture, readParams } from "./fixture-files.ts";
import { writeSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";

function main(argv: readonly string[]): void {
  const perCase = argv.length === 3 && argv[2] === "--per-case";
  if (argv.length !== 2 && !perCase) {
    throw new FixtureError("usage: node ts_model/node/run.ts FIXTURE_DIR OUT.safetensors [--per-case]");
  }
  const [fixtureDir, outPath] = argv as [string, string];
  const fixture = readFixture(fixtureDir);
  const params = readParams(fixture);
  const meta = { producer: "parity ts_model/node/run.ts", precision: "fp64" };
  if (perCase) {
    fixture.cases.forEach((c, i) => writeSafetensors(`${outPath}.${i}`, computeCaseTaps(fixture, params, c), meta));
    return;
  }
  writeSafetensors(outPath, computeAllTaps(fixture, params), meta);
}

runMain("run.ts", main);
