// The parity dump format (docs/dump-format.md) from TypeScript: the fixture id and the metadata.
//
// fixture_id = "sha256:" + hex sha256 of the canonical JSON (RFC 8785) of
//   {"cases": [{"name", "tokens"}, ...], "config": manifest.config, "vocab": manifest.vocab,
//    "weights_sha256": hex sha256 of the weights file's bytes}
// In JavaScript RFC 8785 is JSON.stringify with every object's keys sorted (by UTF-16 code units,
// which is what Array#sort does with strings): numbers and strings are already written its way.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { arch, platform, release } from "node:os";
import { join } from "node:path";

export const DUMP_FORMAT = "parity-dump";
export const DUMP_FORMAT_VERSION = "1";

type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** RFC 8785 canonical JSON: sorted keys, no whitespace, ECMAScript number and string forms. */
export function canonicalJson(value: JsonValue): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k]!)}`).join(",")}}`;
  }
  if (typeof value === "number" && !Number.isFinite(value)) throw new Error(`${value} has no JSON form`);
  return JSON.stringify(value);
}

const sha256 = (bytes: Uint8Array | string): string => createHash("sha256").update(bytes).digest("hex");

/** The id of the fixture in `root`, from its manifest.json and weights file as written. */
export function fixtureId(root: string): string {
  const manifest = JSON.parse(readFileSync(join(root, "manifest.json"), "utf-8")) as {
    config: JsonValue;
    vocab: string[];
    cases: { name: string; tokens: number[] }[];
    files: { weights: string };
  };
  const doc: JsonValue = {
    cases: manifest.cases.map((c) => ({ name: c.name, tokens: c.tokens })),
    config: manifest.config,
    vocab: manifest.vocab,
    weights_sha256: sha256(readFileSync(join(root, manifest.files.weights))),
  };
  return `sha256:${sha256(canonicalJson(doc))}`;
}

/** Where the dump was computed: OS, release, CPU architecture, Node version. */
export function platformText(): string {
  return `${platform()} ${release()} ${arch()}; Node ${process.version}`;
}

export interface DumpInfo {
  readonly backend: string;
  readonly precision: "fp32" | "fp64";
  readonly fixtureId: string;
  readonly parityVersion: string;
  readonly writer: string;
  readonly taps?: readonly string[]; // the taps it declares; omitted: the taps it holds
}

/** The safetensors `__metadata__` of a dump. */
export function dumpMetadata(info: DumpInfo): Record<string, string> {
  const meta: Record<string, string> = {
    format: DUMP_FORMAT,
    format_version: DUMP_FORMAT_VERSION,
    backend: info.backend,
    precision: info.precision,
    fixture_id: info.fixtureId,
    platform: platformText(),
    parity_version: info.parityVersion,
    writer: info.writer,
  };
  if (info.taps !== undefined) meta.taps = info.taps.join(",");
  return meta;
}
