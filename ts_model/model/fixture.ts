// A parity fixture (docs/fixture-format.md) from its parsed manifest and decoded weights file, with
// no file access: the Node entry points read the files (../node/fixture-files.ts), the browser
// fetches them (../browser/fetch-fixture.ts), and both hand the contents to these functions.

import { loadParams, parseConfig, tapNames } from "./model.ts";
import type { GPTConfig, RawTensor, Tensor } from "./model.ts";
import type { SafetensorsFile } from "./safetensors.ts";

export const FORMAT_NAME = "parity-fixture";
export const FORMAT_VERSION = 1;

export type Precision = "fp32" | "fp64";

export interface Tolerance {
  readonly atol: number;
  readonly rtol: number;
}

export interface TierTolerances {
  readonly default: Tolerance;
  readonly overrides: ReadonlyMap<string, Tolerance>;
}

export interface Case {
  readonly name: string; // the prefix of the case's keys in golden files ("{name}/{tap}")
  readonly tokens: readonly number[];
}

export interface Fixture {
  readonly root: string;
  readonly config: GPTConfig;
  readonly cases: readonly Case[];
  readonly taps: readonly string[]; // dataflow order
  readonly rows: ReadonlyMap<string, number>; // taps whose golden keeps only the last positions ("rows")
  readonly tolerances: Readonly<Record<Precision, TierTolerances>>;
  readonly files: { readonly weights: string; readonly golden: Readonly<Record<Precision, string>> };
  readonly sha256: Readonly<Record<string, string>>;
}

/** A fixture that cannot be used (bad manifest, missing or unreadable file). */
export class FixtureError extends Error {
  override name = "FixtureError";
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function plainName(v: unknown, where: string): string {
  if (typeof v !== "string" || v === "" || v.includes("/") || v.includes("\\") || v === "." || v === "..") {
    throw new FixtureError(`${where}: file name ${JSON.stringify(v)} must be a plain name inside the fixture directory`);
  }
  return v;
}

function tolerance(v: unknown, where: string): Tolerance {
  if (!isObject(v) || typeof v.atol !== "number" || typeof v.rtol !== "number" || v.atol < 0 || v.rtol < 0) {
    throw new FixtureError(`${where} must be {"atol": number >= 0, "rtol": number >= 0}`);
  }
  return { atol: v.atol, rtol: v.rtol };
}

/** Check a parsed manifest (`path` names it in errors); no file access. */
export function parseFixture(m: unknown, root: string, path: string): Fixture {
  const fail = (what: string): never => {
    throw new FixtureError(`${path}: ${what}`);
  };
  if (!isObject(m)) return fail("the manifest must be a JSON object");
  if (m.format !== FORMAT_NAME) fail(`not a parity fixture (format is ${JSON.stringify(m.format)})`);
  if (m.format_version !== FORMAT_VERSION) {
    fail(`unknown fixture format version ${JSON.stringify(m.format_version)} (this reader knows ${FORMAT_VERSION})`);
  }
  let config: GPTConfig;
  try {
    config = parseConfig(m.config);
  } catch (err) {
    return fail(`bad config: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!Array.isArray(m.cases) || m.cases.length === 0) fail("no cases");
  const cases: Case[] = [];
  for (const [i, c] of (m.cases as unknown[]).entries()) {
    if (!isObject(c) || typeof c.name !== "string" || c.name === "" || c.name.includes("/")) {
      fail(`case #${i}: needs a non-empty name without '/'`);
    }
    const { name, tokens } = c as { name: string; tokens: unknown };
    if (cases.some((other) => other.name === name)) fail(`case #${i}: name '${name}' is repeated`);
    if (!Array.isArray(tokens) || tokens.length === 0 || tokens.length > config.n_ctx) {
      fail(`case '${name}': tokens must be a list of 1 to ${config.n_ctx} ids`);
    }
    for (const t of tokens as unknown[]) {
      if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t >= config.vocab_size) {
        fail(`case '${name}': token id ${JSON.stringify(t)} out of range [0, ${config.vocab_size})`);
      }
    }
    cases.push({ name, tokens: tokens as number[] });
  }
  const taps = Array.isArray(m.taps) ? m.taps.map((t: unknown) => (isObject(t) ? t.name : undefined)) : [];
  const expected = tapNames(config.n_layer);
  if (taps.length !== expected.length || taps.some((t, i) => t !== expected[i])) {
    fail("taps do not match the model's tap list (names or order)");
  }
  const rows = new Map<string, number>();
  for (const t of m.taps as unknown[]) {
    if (!isObject(t) || t.rows === undefined) continue;
    if (typeof t.rows !== "number" || !Number.isInteger(t.rows) || t.rows < 1) fail(`tap '${String(t.name)}': rows must be a positive integer`);
    rows.set(t.name as string, t.rows as number);
  }
  if (!isObject(m.tolerances)) return fail("missing tolerances");
  const tiers = {} as Record<Precision, TierTolerances>;
  for (const p of ["fp32", "fp64"] as const) {
    const tier = m.tolerances[p];
    const overrides = new Map<string, Tolerance>();
    const raw = isObject(tier) ? (tier.overrides ?? {}) : {};
    if (!isObject(raw)) fail(`tolerances.${p}.overrides must be an object`);
    for (const [tap, v] of Object.entries(raw as Json)) {
      if (!expected.includes(tap)) fail(`tolerances.${p}.overrides: unknown tap '${tap}'`);
      overrides.set(tap, tolerance(v, `${path}: tolerances.${p}.overrides.${tap}`));
    }
    tiers[p] = { default: tolerance(tier, `${path}: tolerances.${p}`), overrides };
  }
  const files = m.files;
  if (!isObject(files) || !isObject(files.golden)) return fail("missing files.weights / files.golden");
  const golden = files.golden;
  return {
    root,
    config,
    cases,
    taps: expected,
    rows,
    tolerances: tiers,
    files: {
      weights: plainName(files.weights, `${path}: files.weights`),
      golden: {
        fp32: plainName(golden.fp32, `${path}: files.golden.fp32`),
        fp64: plainName(golden.fp64, `${path}: files.golden.fp64`),
      },
    },
    sha256: isObject(m.sha256) ? (m.sha256 as Record<string, string>) : {},
  };
}

/** The parameters of a decoded weights file (`path` names it in errors), checked and upcast to float64. */
export function paramsFrom(file: SafetensorsFile, fixture: Fixture, path: string): Map<string, Tensor> {
  const raw = new Map<string, RawTensor>();
  for (const [name, t] of file.tensors) {
    if (!(t.data instanceof Float32Array || t.data instanceof Float64Array)) {
      throw new FixtureError(`${path}: tensor '${name}' is ${t.dtype}, expected a float type`);
    }
    raw.set(name, { shape: t.shape, data: t.data });
  }
  try {
    return loadParams(raw, fixture.config);
  } catch (err) {
    throw new FixtureError(`${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
}
