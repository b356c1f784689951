// Read and write safetensors files from Node: the file side of the pure ../model/safetensors.ts.

import { randomBytes } from "node:crypto";
import { readFileSync, realpathSync, renameSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";

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

/**
 * Encode tensors (in the map's order) and metadata, and write them to `path` as parity writes every file: to a
 * temporary file beside it, renamed over it, so a crash leaves the old file or the new one, never a truncated
 * one. A target that is not a regular file (`/dev/null`, a FIFO) is written as it is, never replaced.
 */
export function writeSafetensors(
  path: string,
  tensors: ReadonlyMap<string, { readonly shape: readonly number[]; readonly data: TensorData }>,
  metadata: Record<string, string> | null = null,
): void {
  const bytes = serializeSafetensors(tensors, metadata);
  const existing = statSync(path, { throwIfNoEntry: false });
  if (existing !== undefined && !existing.isFile()) {
    writeFileSync(path, bytes);
    return;
  }
  const real = existing !== undefined ? realpathSync(path) : path; // a link: the file it points to is replaced
  const tmp = join(dirname(real), `.${basename(real).slice(0, 64)}.parity-tmp-${randomBytes(4).toString("hex")}`);
  try {
    writeFileSync(tmp, bytes, { flag: "wx" });
    renameSync(tmp, real);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // never created, or already renamed
    }
    throw err;
  }
}
