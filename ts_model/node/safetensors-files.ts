// Read and write safetensors files from Node: the file side of the pure ../model/safetensors.ts.

import { readFileSync, writeFileSync } from "node:fs";

import { SafetensorsError, parseSafetensors, serializeSafetensors } from "../model/safetensors.ts";
import type { SafetensorsFile, TensorData } from "../model/safetensors.ts";

/** Read and decode the safetensors file at `path`; SafetensorsError if unreadable or malformed. */
export function readSafetensors(path: string): SafetensorsFile {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (err) {
    throw new SafetensorsError(`${path}: cannot read (${err instanceof Error ? err.message : String(err)})`);
  }
  return parseSafetensors(bytes, path);
}

/** Encode tensors (in the map's order) and metadata, and write them to `path`. */
export function writeSafetensors(
  path: string,
  tensors: ReadonlyMap<string, { readonly shape: readonly number[]; readonly data: TensorData }>,
  metadata: Record<string, string> | null = null,
): void {
  writeFileSync(path, serializeSafetensors(tensors, metadata));
}
