// Fetch a parity fixture over HTTP in the browser and decode it with the same parsers Node uses.
//
// The server (run-browser.mts, or `parity serve`) exposes the fixture's files under one base URL,
// e.g. /fixture/manifest.json, /fixture/weights.safetensors. Shared by the backends' pages
// (page-model.ts, page-ort.ts) and the learners' page (ts_model/web/main.ts).

import { paramsFrom, parseFixture } from "../model/fixture.ts";
import type { Fixture } from "../model/fixture.ts";
import type { Tensor } from "../model/model.ts";
import { parseSafetensors } from "../model/safetensors.ts";
import type { SafeTensor } from "../model/safetensors.ts";

export async function fetchBytes(url: string): Promise<Uint8Array> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

export interface WebFixture {
  readonly fixture: Fixture;
  readonly manifest: Record<string, unknown>; // the raw manifest (vocab, onnx file names, ...)
}

/** The fixture's manifest, checked by parseFixture. `base` ends with "/". */
export async function fetchFixture(base: string): Promise<WebFixture> {
  const url = `${base}manifest.json`;
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const manifest = (await response.json()) as Record<string, unknown>;
  return { fixture: parseFixture(manifest, base, url), manifest };
}

/** The parameters in float64, as readParams gives them under Node. */
export async function fetchParams(base: string, fixture: Fixture): Promise<Map<string, Tensor>> {
  const url = `${base}${fixture.files.weights}`;
  return paramsFrom(parseSafetensors(await fetchBytes(url), url), fixture, url);
}

/** One golden file's tensors by "{case}/{tap}". */
export async function fetchGolden(base: string, fixture: Fixture, precision: "fp32" | "fp64"): Promise<Map<string, SafeTensor>> {
  const url = `${base}${fixture.files.golden[precision]}`;
  return parseSafetensors(await fetchBytes(url), url).tensors;
}

/** Bytes as base64, in chunks (String.fromCharCode takes a bounded number of arguments). */
export function toBase64(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}
