// Decode and encode safetensors files (https://github.com/huggingface/safetensors), no dependencies.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}   (optional, strings only)
// then the data buffer; offsets are relative to its start. Tensors are little-endian, row-major,
// and tile the buffer exactly (contiguous, no overlap, no gap). Supported dtypes: F32, F64, I32,
// I64. A malformed file is refused with a SafetensorsError naming the problem. Bytes in, bytes out:
// reading and writing files is ../node/safetensors-files.ts.

export type DType = "F32" | "F64" | "I32" | "I64";
export type TensorData = Float32Array | Float64Array | Int32Array | BigInt64Array;

export interface SafeTensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly data: TensorData;
}

export interface SafetensorsFile {
  readonly tensors: Map<string, SafeTensor>;
  readonly metadata: Record<string, string> | null;
}

export class SafetensorsError extends Error {
  override name = "SafetensorsError";
}

const ITEM_SIZE: Record<DType, number> = { F32: 4, F64: 8, I32: 4, I64: 8 };
const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const MAX_HEADER = 100_000_000; // the Rust reference implementation's limit

function isDType(s: unknown): s is DType {
  return typeof s === "string" && Object.hasOwn(ITEM_SIZE, s);
}

function arrayFor(dtype: DType, buffer: ArrayBuffer): TensorData {
  switch (dtype) {
    case "F32":
      return new Float32Array(buffer);
    case "F64":
      return new Float64Array(buffer);
    case "I32":
      return new Int32Array(buffer);
    case "I64":
      return new BigInt64Array(buffer);
  }
}

function dtypeOf(data: TensorData): DType {
  if (data instanceof Float32Array) return "F32";
  if (data instanceof Float64Array) return "F64";
  if (data instanceof Int32Array) return "I32";
  return "I64";
}

/** Swap the byte order of each item in place (only needed on a big-endian host). */
function swapBytes(bytes: Uint8Array, itemSize: number): void {
  for (let i = 0; i < bytes.length; i += itemSize) bytes.subarray(i, i + itemSize).reverse();
}

function isNonNegInt(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

/** Decode a whole safetensors file. `source` names it in error messages. */
export function parseSafetensors(bytes: Uint8Array, source = "safetensors"): SafetensorsFile {
  const fail = (what: string): never => {
    throw new SafetensorsError(`${source}: ${what}`);
  };
  if (bytes.length < 8) fail(`file of ${bytes.length} bytes is too short for the 8-byte header length`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = view.getBigUint64(0, true);
  if (n > BigInt(bytes.length - 8)) fail(`header length ${n} is beyond the end of the file (${bytes.length} bytes)`);
  if (n > BigInt(MAX_HEADER)) fail(`header length ${n} exceeds ${MAX_HEADER} bytes`);
  const headerEnd = 8 + Number(n);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, headerEnd)));
  } catch (err) {
    fail(`header is not valid UTF-8 JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) fail("header is not a JSON object");
  const dataLength = bytes.length - headerEnd;
  let metadata: Record<string, string> | null = null;
  const entries: { name: string; dtype: DType; shape: number[]; begin: number; end: number }[] = [];
  for (const [name, info] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (typeof info !== "object" || info === null || Array.isArray(info)) fail("__metadata__ is not an object");
      for (const [k, v] of Object.entries(info as Record<string, unknown>)) {
        if (typeof v !== "string") fail(`__metadata__ value of '${k}' is not a string`);
      }
      metadata = { ...(info as Record<string, string>) };
      continue;
    }
    if (typeof info !== "object" || info === null || Array.isArray(info)) fail(`tensor '${name}': entry is not an object`);
    const { dtype, shape, data_offsets: offsets } = info as Record<string, unknown>;
    if (!isDType(dtype)) fail(`tensor '${name}': unsupported dtype ${JSON.stringify(dtype)} (F32, F64, I32, I64 only)`);
    if (!Array.isArray(shape) || !shape.every(isNonNegInt)) fail(`tensor '${name}': shape must be a list of non-negative integers`);
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isNonNegInt)) {
      fail(`tensor '${name}': data_offsets must be [begin, end], non-negative integers`);
    }
    const [begin, end] = offsets as [number, number];
    if (begin > end || end > dataLength) {
      fail(`tensor '${name}': data_offsets [${begin}, ${end}] out of range (data buffer is ${dataLength} bytes)`);
    }
    const dims = shape as number[];
    const expected = dims.reduce((a, b) => a * b, 1) * ITEM_SIZE[dtype as DType];
    if (expected !== end - begin) {
      fail(`tensor '${name}': shape [${dims.join(", ")}] of ${dtype} needs ${expected} bytes, data_offsets give ${end - begin}`);
    }
    entries.push({ name, dtype: dtype as DType, shape: dims, begin, end });
  }
  // The tensors must tile the data buffer: sorted by offset, each starts where the previous ends.
  const sorted = [...entries].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  for (const e of sorted) {
    if (e.begin < cursor) fail(`tensor '${e.name}': data_offsets [${e.begin}, ${e.end}] overlap another tensor`);
    if (e.begin > cursor) fail(`tensor '${e.name}': gap in the data buffer before offset ${e.begin}`);
    cursor = e.end;
  }
  if (cursor !== dataLength) fail(`data buffer is ${dataLength} bytes but the tensors cover ${cursor}`);
  const tensors = new Map<string, SafeTensor>();
  for (const e of entries) {
    // An owned, aligned copy (Buffer#slice would return a view into a shared pool).
    const copy = new Uint8Array(bytes.subarray(headerEnd + e.begin, headerEnd + e.end));
    if (!LITTLE_ENDIAN_HOST) swapBytes(copy, ITEM_SIZE[e.dtype]);
    tensors.set(e.name, { dtype: e.dtype, shape: e.shape, data: arrayFor(e.dtype, copy.buffer) });
  }
  return { tensors, metadata };
}

/** Encode tensors (in the map's order) and optional string metadata as a safetensors file. */
export function serializeSafetensors(
  tensors: ReadonlyMap<string, { readonly shape: readonly number[]; readonly data: TensorData }>,
  metadata: Record<string, string> | null = null,
): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata !== null) header["__metadata__"] = metadata;
  let offset = 0;
  for (const [name, t] of tensors) {
    if (name === "__metadata__") throw new SafetensorsError("'__metadata__' cannot be a tensor name");
    const dtype = dtypeOf(t.data);
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) {
      throw new SafetensorsError(`tensor '${name}': shape [${t.shape.join(", ")}] holds ${count} values, data has ${t.data.length}`);
    }
    header[name] = { dtype, shape: [...t.shape], data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  let headerBytes = new TextEncoder().encode(json);
  const pad = (8 - (headerBytes.length % 8)) % 8; // data starts 8-byte aligned
  if (pad > 0) {
    json += " ".repeat(pad);
    headerBytes = new TextEncoder().encode(json);
  }
  const out = new Uint8Array(8 + headerBytes.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const t of tensors.values()) {
    const raw = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    out.set(raw, at);
    if (!LITTLE_ENDIAN_HOST) swapBytes(out.subarray(at, at + raw.length), t.data.BYTES_PER_ELEMENT);
    at += raw.length;
  }
  return out;
}
