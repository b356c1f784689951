// The dump format's TypeScript side: RFC 8785 canonical JSON, the fixture id, the metadata.

import assert from "node:assert/strict";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { DUMP_FORMAT, canonicalJson, dumpMetadata, fixtureId } from "../node/dump-format.ts";

const TOY = new URL("../../fixtures/toy", import.meta.url).pathname;

test("canonical JSON sorts keys at every depth, drops whitespace, writes numbers as JavaScript does", () => {
  assert.equal(canonicalJson({ b: [1e-5, 8.0, "é\n"], a: { d: true, c: null } }), '{"a":{"c":null,"d":true},"b":[0.00001,8,"é\\n"]}');
  assert.throws(() => canonicalJson(Number.NaN), /no JSON form/);
});

test("the fixture id depends on the weights and cases, not on the goldens or tolerances", () => {
  const dir = mkdtempSync(join(tmpdir(), "parity-id-"));
  try {
    cpSync(TOY, dir, { recursive: true });
    const original = fixtureId(dir);
    assert.match(original, /^sha256:[0-9a-f]{64}$/);
    const manifestPath = join(dir, "manifest.json");
    const manifest = JSON.parse(readFileSync(manifestPath, "utf-8"));
    manifest.tolerances.fp32.atol = 1;
    writeFileSync(manifestPath, JSON.stringify(manifest, null, 3)); // another layout too
    writeFileSync(join(dir, "golden.fp32.safetensors"), "not read");
    assert.equal(fixtureId(dir), original);
    manifest.cases[0].tokens[0] = (manifest.cases[0].tokens[0] + 1) % manifest.config.vocab_size;
    writeFileSync(manifestPath, JSON.stringify(manifest));
    assert.notEqual(fixtureId(dir), original);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the metadata holds every required key, as strings", () => {
  const meta = dumpMetadata({ backend: "x", precision: "fp64", fixtureId: "sha256:0", parityVersion: "0.1.0", writer: "t", taps: ["logits", "probs"] });
  assert.equal(meta.format, DUMP_FORMAT);
  for (const key of ["format_version", "backend", "precision", "fixture_id", "platform", "parity_version"]) {
    assert.equal(typeof meta[key], "string", key);
  }
  assert.equal(meta.taps, "logits,probs");
});
