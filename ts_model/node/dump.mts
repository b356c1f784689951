// Write a parity dump with nothing but Node (docs/dump-format.md):
//
//     node ts_model/node/dump.mts FIXTURE_DIR OUT.safetensors [BACKEND_NAME]     (default name: typescript)
//
// Runs every case through model.ts in float64 and writes every tap under "{case}/{tap}" as F64,
// with the metadata `parity compare` checks: format, backend, precision "fp64", the fixture id
// (computed here, in TypeScript), platform and version. Then, on any machine with the fixture:
//
//     parity compare OUT.safetensors
//
// On any error: one line on stderr and exit code 2 (bad input) or 1 (anything else).

import { readFileSync, realpathSync } from "node:fs";
import { basename, dirname, isAbsolute, join, relative, sep } from "node:path";

import { dumpMetadata, fixtureId } from "./dump-format.ts";
import { FixtureError } from "../model/fixture.ts";
import { computeAllTaps } from "../model/taps.ts";
import { readFixture, readParams } from "./fixture-files.ts";
import { writeSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";

/** The version of this checkout (package.json), which releases with parity. */
function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf-8")) as { version?: unknown };
  return typeof pkg.version === "string" ? pkg.version : "unknown";
}

/** An output inside the fixture directory would overwrite what the dump is judged against: refused (exit 2). */
function refuseInsideFixture(fixtureDir: string, outPath: string): void {
  let target: string;
  try {
    target = join(realpathSync(dirname(outPath)), basename(outPath));
  } catch {
    return; // its directory does not exist: writing says so
  }
  try {
    target = realpathSync(target); // an existing file, or a link: where the write lands
  } catch {
    // not there yet
  }
  const inside = relative(realpathSync(fixtureDir), target);
  if (inside !== ".." && !inside.startsWith(`..${sep}`) && !isAbsolute(inside)) {
    throw new FixtureError(
      `${outPath}: is inside the fixture directory ${fixtureDir}; a dump never overwrites what parity reads`,
    );
  }
}

function main(argv: readonly string[]): void {
  if (argv.length < 2 || argv.length > 3) {
    throw new FixtureError("usage: node ts_model/node/dump.mts FIXTURE_DIR OUT.safetensors [BACKEND_NAME]");
  }
  const [fixtureDir, outPath, backend = "typescript"] = argv as [string, string, string?];
  const fixture = readFixture(fixtureDir);
  refuseInsideFixture(fixtureDir, outPath);
  // No golden file is read: a machine that only runs the model needs manifest.json and the weights.
  const taps = computeAllTaps(fixture, readParams(fixture));
  const version = packageVersion();
  const metadata = dumpMetadata({
    backend,
    precision: "fp64",
    fixtureId: fixtureId(fixtureDir),
    parityVersion: version,
    writer: `ts_model/node/dump.mts (parity-ts-model ${version})`,
    taps: fixture.taps,
  });
  writeSafetensors(outPath, taps, metadata);
  process.stdout.write(`dump.mts: wrote ${outPath} (${backend} fp64, ${taps.size} tensors, ${metadata.fixture_id})\n`);
}

runMain("dump.mts", main);
