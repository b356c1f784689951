// Read a parity fixture directory (docs/fixture-format.md) from Node: the manifest, the weights,
// the golden files' sha256. Shared by run.ts, run-decode.ts, dump.mts and verify-forward.mts; the
// checks themselves are the pure ../model/fixture.ts.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { FixtureError, paramsFrom, parseFixture } from "../model/fixture.ts";
import type { Fixture } from "../model/fixture.ts";
import type { Tensor } from "../model/model.ts";
import { readSafetensors } from "./safetensors-files.ts";

/** Read and check manifest.json of the fixture in `root`. */
export function readFixture(root: string): Fixture {
  const path = join(root, "manifest.json");
  let m: unknown;
  try {
    m = JSON.parse(readFileSync(path, "utf-8"));
  } catch (err) {
    const code = (err as { code?: string }).code;
    const what = code === "ENOENT" ? "file not found" : `not valid JSON (${err instanceof Error ? err.message : String(err)})`;
    throw new FixtureError(`${path}: ${what}`);
  }
  return parseFixture(m, root, path);
}

/** The fixture's files whose sha256 differs from the manifest's (or that it does not list). */
export function hashMismatches(fixture: Fixture): string[] {
  const names = [fixture.files.weights, fixture.files.golden.fp32, fixture.files.golden.fp64];
  return names.filter((name) => {
    const want = fixture.sha256[name];
    if (typeof want !== "string") return true;
    const got = createHash("sha256").update(readFileSync(join(fixture.root, name))).digest("hex");
    return got !== want;
  });
}

/** The parameters, float32 in the file, checked against the config and upcast to float64. */
export function readParams(fixture: Fixture): Map<string, Tensor> {
  const path = join(fixture.root, fixture.files.weights);
  return paramsFrom(readSafetensors(path), fixture, path);
}
