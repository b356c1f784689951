// The entry point the harness calls: node ts_model/node/run.ts FIXTURE_DIR OUT.safetensors [--per-case]
//
// With --per-case, each case is written as soon as it is computed to OUT.safetensors.{i} (i the
// case's index), and dropped: memory holds one case (a GPT-2-sized fixture).
//
// Reads the fixture's manifest and weights, runs every case through ../model/model.ts in float64, and
// writes every tap of every case to one safetensors file: F64 tensors under "{case}/{tap}" in
// the manifest's order, masked attention scores as -Infinity. On any error: one line on stderr
// and exit code 2 (bad input) or 1 (anything else).
//
// The matrix products run in WebAssembly (./threads.ts, ./kernels.wat), from 1 M parameters on over
// several threads (PARITY_TS_THREADS, default the machine's available parallelism, at most 4); the
// numbers are model.ts's own, bit for bit, on any thread count.

import { FixtureError } from "../model/fixture.ts";
import { paramShapes, useMatrixProducts } from "../model/model.ts";
import type { GPTConfig } from "../model/model.ts";
import { computeAllTaps, computeCaseTaps } from "../model/taps.ts";
import { readFixture, readParams } from "./fixture-files.ts";
import { writeSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";
import { threadCount, threadedProducts } from "./threads.ts";

/** From this many parameters on, the matrix products run on several threads. */
const THREADED_PARAMETERS = 1_000_000;

function parameterCount(config: GPTConfig): number {
  let n = 0;
  for (const shape of paramShapes(config).values()) n += shape.reduce((a, b) => a * b, 1);
  return n;
}

function main(argv: readonly string[]): void {
  const perCase = argv.length === 3 && argv[2] === "--per-case";
  if (argv.length !== 2 && !perCase) {
    throw new FixtureError("usage: node ts_model/node/run.ts FIXTURE_DIR OUT.safetensors [--per-case]");
  }
  const [fixtureDir, outPath] = argv as [string, string];
  const fixture = readFixture(fixtureDir);
  const threads = parameterCount(fixture.config) >= THREADED_PARAMETERS ? threadCount() : 1;
  const engine = threadedProducts(threads);
  useMatrixProducts(engine); // before the parameters are read: they are allocated in the kernels' memory
  try {
    const params = readParams(fixture);
    const meta = { producer: "parity ts_model/node/run.ts", precision: "fp64" };
    if (perCase) {
      fixture.cases.forEach((c, i) => writeSafetensors(`${outPath}.${i}`, computeCaseTaps(fixture, params, c), meta));
      return;
    }
    writeSafetensors(outPath, computeAllTaps(fixture, params), meta);
  } finally {
    useMatrixProducts(null);
    engine.close();
  }
}

runMain("run.ts", main);
