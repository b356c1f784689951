// The decoding entry point the harness calls:
//
//     node ts_model/node/run-decode.ts FIXTURE_DIR REQUESTS.json OUT.safetensors
//
// REQUESTS.json is a list of {"name": str, "prompt": [token ids], "steps": int, "feed": [token ids] | null}.
// Each request is prefilled and decoded step by step by model.ts (`decode`, float64); for steps
// 0 (the prefill) .. steps, the output holds F64 tensors "{name}/step{k}/blocks.{i}.attn.cache_k",
// ".../cache_v" [H, T, d_head] and "{name}/step{k}/logits" [V]. A null feed decodes greedily.
// On any error: one line on stderr and exit code 2 (bad input) or 1 (anything else).

import { readFileSync } from "node:fs";

import { FixtureError } from "../model/fixture.ts";
import { decode } from "../model/model.ts";
import type { Tensor } from "../model/model.ts";
import { readFixture, readParams } from "./fixture-files.ts";
import { writeSafetensors } from "./safetensors-files.ts";
import { runMain } from "./entry.ts";

interface Request {
  readonly name: string;
  readonly prompt: readonly number[];
  readonly steps: number;
  readonly feed: readonly number[] | null;
}

function readRequests(path: string): Request[] {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf-8"));
  } catch (err) {
    throw new FixtureError(`${path}: unreadable requests (${err instanceof Error ? err.message : String(err)})`);
  }
  const ids = (v: unknown): v is number[] => Array.isArray(v) && v.every((t) => Number.isInteger(t));
  if (!Array.isArray(raw)) throw new FixtureError(`${path}: requests must be a list`);
  return raw.map((r: unknown, i: number) => {
    const q = r as Record<string, unknown>;
    if (typeof q?.name !== "string" || !ids(q.prompt) || q.prompt.length === 0 || !Number.isInteger(q.steps)
      || !(q.feed === null || ids(q.feed))) {
      throw new FixtureError(`${path}: request #${i} must be {name, prompt, steps, feed}`);
    }
    return q as unknown as Request;
  });
}

function main(argv: readonly string[]): void {
  if (argv.length !== 3) {
    throw new FixtureError("usage: node ts_model/node/run-decode.ts FIXTURE_DIR REQUESTS.json OUT.safetensors");
  }
  const [fixtureDir, requestsPath, outPath] = argv as [string, string, string];
  const fixture = readFixture(fixtureDir);
  const params = readParams(fixture);
  const out = new Map<string, Tensor>();
  for (const req of readRequests(requestsPath)) {
    decode(params, fixture.config, req.prompt, req.steps, req.feed).forEach((step, k) => {
      step.cache.forEach((block, i) => {
        out.set(`${req.name}/step${k}/blocks.${i}.attn.cache_k`, block.k);
        out.set(`${req.name}/step${k}/blocks.${i}.attn.cache_v`, block.v);
      });
      out.set(`${req.name}/step${k}/logits`, step.logits);
    });
  }
  writeSafetensors(outPath, out, { producer: "parity ts_model/node/run-decode.ts", precision: "fp64" });
}

runMain("run-decode.ts", main);
