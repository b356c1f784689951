// The backward's entry point the harness calls:
//
//     node ts_model/node/run-grad.ts FIXTURE_DIR OUT.safetensors [--spec SPEC.json] [--grad | --train]
//
// Reads the fixture (as run.ts does) and its training spec, runs ../model/backward.ts in float64, and writes
// F64 tensors to one safetensors file: for every training case, "{case}/loss" (shape []) and "{case}/{name}.grad"
// for every gradient of the case's backward (backward order; the case's own loss, the mean over its T - 1 cells);
// then, for s = 1 .. steps, "train/step{s}/loss", "train/step{s}/grad_norm" (shape []) and "train/step{s}/{param}"
// (AdamW from the fixture's weights on the batch of the spec's cases). `--grad` writes the cases only, `--train`
// the steps only; without either, both.
//
// The spec is the manifest's `training` section; `--spec SPEC.json` gives it instead (the same fields: steps, lr,
// betas, eps, weight_decay, no_decay, cases), and wins over the manifest's. The harness always passes it
// (parity_harness/_backends/node/typescript_backend.py writes the spec it read and checked), so a fixture
// without a training section can be run too. On any error: one line on stderr and exit code 2 (bad input) or
// 1 (anything else).

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { backward, parseTrainingSpec, train } from "../model/backward.ts";
import type { TrainingSpec } from "../model/backward.ts";
import { FixtureError } from "../model/fixture.ts";
import type { Tensor } from "../model/model.ts";
import { readFixture, readParams } from "./fixture-files.ts";
import { writeSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";

const USAGE = "usage: node ts_model/node/run-grad.ts FIXTURE_DIR OUT.safetensors [--spec SPEC.json] [--grad | --train]";

function readJson(path: string, what: string): unknown {
  try {
    return JSON.parse(readFileSync(path, "utf-8"));
  } catch (err) {
    throw new FixtureError(`${path}: unreadable ${what} (${err instanceof Error ? err.message : String(err)})`);
  }
}

/** The spec from SPEC.json, else from the manifest's `training` section; FixtureError when neither has one. */
function readSpec(fixtureDir: string, specPath: string | null): TrainingSpec {
  const path = specPath ?? join(fixtureDir, "manifest.json");
  const raw = specPath !== null ? readJson(path, "training spec") : (readJson(path, "manifest") as Record<string, unknown>).training;
  if (raw === undefined) {
    throw new FixtureError(`${path}: the fixture has no training section (give one with --spec SPEC.json)`);
  }
  try {
    return parseTrainingSpec(raw);
  } catch (err) {
    throw new FixtureError(`${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

function main(argv: readonly string[]): void {
  const rest = [...argv];
  let specPath: string | null = null;
  let what: "both" | "grad" | "train" = "both";
  const positional: string[] = [];
  while (rest.length > 0) {
    const arg = rest.shift()!;
    if (arg === "--spec" && rest.length > 0) specPath = rest.shift()!;
    else if ((arg === "--grad" || arg === "--train") && what === "both") what = arg === "--grad" ? "grad" : "train";
    else if (arg.startsWith("--")) throw new FixtureError(USAGE);
    else positional.push(arg);
  }
  if (positional.length !== 2) throw new FixtureError(USAGE);
  const [fixtureDir, outPath] = positional as [string, string];
  const fixture = readFixture(fixtureDir);
  const spec = readSpec(fixtureDir, specPath);
  const tokens = spec.cases.map((name) => {
    const c = fixture.cases.find((x) => x.name === name);
    if (c === undefined) throw new FixtureError(`training: case '${name}' is not a case of the fixture`);
    if (c.tokens.length < 2) throw new FixtureError(`training: case '${name}' has one token: it has no loss`);
    return c.tokens;
  });
  const params = readParams(fixture);
  const known = new Set(params.keys());
  const unknown = spec.no_decay.filter((n) => !known.has(n));
  if (unknown.length > 0) throw new FixtureError(`training: no_decay names '${unknown[0]}', not a parameter of the model`);
  const out = new Map<string, Tensor>();
  if (what !== "train") {
    spec.cases.forEach((name, i) => {
      const one = backward(params, fixture.config, tokens[i]!);
      out.set(`${name}/loss`, { shape: [], data: Float64Array.of(one.loss) });
      for (const [key, g] of one.grads) out.set(`${name}/${key}`, g);
    });
  }
  if (what !== "grad") {
    for (const [key, value] of train(params, fixture.config, tokens, spec)) out.set(`train/${key}`, value);
  }
  writeSafetensors(outPath, out, { producer: "parity ts_model/node/run-grad.ts", precision: "fp64" });
}

runMain("run-grad.ts", main);
