// A standalone check of the TypeScript model against a fixture's golden files, Node only:
//
//     node ts_model/node/verify-forward.mts [FIXTURE_DIR]        (default: the repository's fixtures/toy)
//
// Runs every case through model.ts (float64) and compares every tap with
//   fp64 tier: golden.fp64 (PyTorch float64) at the manifest's fp64 tolerance,
//   fp32 tier: golden.fp32 (PyTorch float32) at the manifest's fp32 tolerance (our float64 result).
// A cell passes when |a - b| <= atol + rtol * |b|; an infinity must meet the same infinity; NaN
// fails. One line per tier and tap (worst over cases), then a verdict.
// Exit codes: 0 every tap agrees, 1 some tap disagrees, 2 bad input (unreadable or changed fixture).

import { join, resolve } from "node:path";

import { compare, fmt } from "../model/compare.ts";
import type { TapResult } from "../model/compare.ts";
import { FixtureError } from "../model/fixture.ts";
import type { Fixture, Precision } from "../model/fixture.ts";
import type { SafeTensor } from "../model/safetensors.ts";
import { computeCaseTaps } from "../model/taps.ts";
import { hashMismatches, readFixture, readParams } from "./fixture-files.ts";
import { readSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";

function goldenTensors(fixture: Fixture, precision: Precision): Map<string, SafeTensor> {
  const path = join(fixture.root, fixture.files.golden[precision]);
  const tensors = readSafetensors(path).tensors;
  const dtype = precision === "fp64" ? "F64" : "F32";
  for (const c of fixture.cases) {
    for (const tap of fixture.taps) {
      const t = tensors.get(`${c.name}/${tap}`);
      if (t === undefined) throw new FixtureError(`${path}: missing golden tensor '${c.name}/${tap}'`);
      if (t.dtype !== dtype) throw new FixtureError(`${path}: golden tensor '${c.name}/${tap}' is ${t.dtype}, expected ${dtype}`);
    }
  }
  return tensors;
}

function main(argv: readonly string[]): number {
  if (argv.length > 1 || argv[0] === "-h" || argv[0] === "--help") {
    process.stderr.write("usage: node ts_model/node/verify-forward.mts [FIXTURE_DIR]\n");
    return 2;
  }
  const root = argv[0] ?? join(import.meta.dirname, "..", "..", "fixtures", "toy");
  const fixture = readFixture(root);
  const c = fixture.config;
  console.log(
    `verify-forward: ${resolve(root)}: ${fixture.cases.length} cases, ${fixture.taps.length} taps ` +
      `(V=${c.vocab_size} d=${c.d_model} L=${c.n_layer} H=${c.n_head} ${c.positions} positions)`,
  );
  const changed = hashMismatches(fixture);
  for (const name of changed) {
    console.log(`WARNING: ${name}: sha256 differs from the manifest (the file changed since it was written)`);
  }
  const params = readParams(fixture);
  const started = performance.now();
  // Every tap of every case (a tap with "rows" cut to its last positions, as the golden keeps it).
  const results = new Map(fixture.cases.map((k) => [k.name, computeCaseTaps(fixture, params, k)]));
  const elapsed = performance.now() - started;

  const failures: string[] = [];
  let checks = 0;
  for (const precision of ["fp64", "fp32"] as const) {
    const golden = goldenTensors(fixture, precision);
    const tiers = fixture.tolerances[precision];
    let tierWorst = 0;
    for (const tap of fixture.taps) {
      const tol = tiers.overrides.get(tap) ?? tiers.default;
      let worst: TapResult = { ok: true, maxAbs: 0, where: "", note: "" };
      let ok = true;
      for (const k of fixture.cases) {
        const key = `${k.name}/${tap}`;
        const ours = results.get(k.name)!.get(key);
        if (ours === undefined) throw new Error(`the model produced no tap '${tap}'`);
        const r = compare(ours, golden.get(key)!, tol, key);
        ok &&= r.ok;
        // Report the worst case, a failing one before any passing one.
        if ((!r.ok && worst.ok) || (r.ok === worst.ok && r.maxAbs > worst.maxAbs)) worst = r;
      }
      checks++;
      tierWorst = Math.max(tierWorst, worst.maxAbs);
      const line = `${precision}  ${tap.padEnd(34)} ${ok ? "OK  " : "FAIL"}  max|diff| = ${fmt(worst.maxAbs)}`;
      if (ok) {
        console.log(line);
      } else {
        failures.push(`${precision} ${tap}`);
        const detail = worst.note === "tolerance exceeded" ? "" : `: ${worst.note}`;
        console.log(`${line} at ${worst.where} (atol ${tol.atol}, rtol ${tol.rtol})${detail}`);
      }
    }
    console.log(`${precision}  worst over all taps: ${fmt(tierWorst)}`);
  }
  console.log(`model time: ${elapsed.toFixed(1)} ms for ${fixture.cases.length} cases`);
  if (failures.length > 0) {
    console.log(`verify-forward: FAILED, ${failures.length} of ${checks} checks disagree; first diverging: ${failures[0]}`);
    return 1;
  }
  if (changed.length > 0) {
    console.log(`verify-forward: every tap agrees, but ${changed.join(", ")} changed since the manifest: regenerate it`);
    return 2;
  }
  console.log(`verify-forward: OK, ${checks} checks agree`);
  return 0;
}

runMain("verify-forward", main);
