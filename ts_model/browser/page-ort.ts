// The onnxruntime-web backends' page: one of the fixture's ONNX graphs on onnxruntime-web's
// WebAssembly backend, or on its WebGPU backend, in the browser.
//
// run-browser.mts serves onnxruntime-web's files under /ort/ and calls
// `parityRunOrt(base, graph, optimization, ep, graphUrl, cpuNodes)`: it fetches the graph named by the manifest
// (files.onnx.all_taps = model.onnx, files.onnx.logits = model.logits.onnx), runs every case
// (input `tokens`, int64 [T]) and returns every graph output as one safetensors file, base64, F32
// under "{case}/{output}". One thread (numThreads = 1: no worker, no SharedArrayBuffer needed).
// (or `graphUrl`, when not empty). ep "wasm": ort.wasm.min.mjs, executionProviders ["wasm"].
// ep "webgpu": ort.webgpu.min.mjs (the build with onnxruntime's WebGPU execution provider),
// executionProviders ["webgpu"]. No adapter is an error, never a quiet run on the CPU; the adapter
// is described in the metadata (`webgpu_adapter`). onnxruntime always adds its CPU provider for the
// nodes that have no WebGPU kernel: their names, from onnxruntime's own log of the partitioning, go
// into the metadata too (`cpu_nodes`); `cpuNodes` (comma-separated names) are put there on purpose
// (the WebGPU provider's option forceCpuNodeNames). Outputs are read back to the CPU (the default output location).

import type * as Ort from "onnxruntime-web";

import { serializeSafetensors } from "../model/safetensors.ts";
import type { TensorData } from "../model/safetensors.ts";
import { fetchBytes, fetchFixture, toBase64 } from "./fetch-fixture.ts";

// Variables: esbuild and tsc leave the import to the browser.
const ORT_URL: Record<Ep, string> = { wasm: "/ort/ort.wasm.min.mjs", webgpu: "/ort/ort.webgpu.min.mjs" };

type Graph = "all_taps" | "logits";
type Ep = "wasm" | "webgpu";

interface AdapterLike {
  readonly features: ReadonlySet<string>;
  readonly info?: { vendor: string; architecture: string; device: string; description: string; isFallbackAdapter?: boolean };
  readonly isFallbackAdapter?: boolean;
}

/** The adapter `navigator.gpu.requestAdapter()` gives, described (JSON), or an Error saying why there is none. */
async function webgpuAdapter(): Promise<string> {
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<AdapterLike | null> } }).gpu;
  if (gpu === undefined) throw new Error("no WebGPU in this browser: navigator.gpu is undefined");
  const timeout = new Promise<"timeout">((resolve) => setTimeout(() => resolve("timeout"), 10000));
  const adapter = await Promise.race([gpu.requestAdapter(), timeout]);
  if (adapter === "timeout") throw new Error("no WebGPU adapter: navigator.gpu.requestAdapter() did not answer in 10 s");
  if (adapter === null) throw new Error("no WebGPU adapter: navigator.gpu.requestAdapter() returned null");
  const info = adapter.info;
  return JSON.stringify({
    vendor: info?.vendor ?? "",
    architecture: info?.architecture ?? "",
    device: info?.device ?? "",
    description: info?.description ?? "",
    isFallbackAdapter: info?.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null,
    features: [...adapter.features].sort(),
  });
}

/**
 * The session, created with onnxruntime's log at level info, and the nodes its WebGPU provider found
 * no kernel for (they run on the CPU provider). onnxruntime logs through console.error, which fails
 * a run (chrome.mts), so the console is captured while the session is created, then restored.
 */
async function createLogged(
  ort: typeof Ort,
  bytes: Uint8Array,
  options: Ort.InferenceSession.SessionOptions,
): Promise<{ session: Ort.InferenceSession; onCpu: string[] }> {
  const lines: string[] = [];
  const saved = { error: console.error, warn: console.warn, log: console.log, info: console.info };
  for (const key of Object.keys(saved) as (keyof typeof saved)[]) {
    console[key] = (...args: unknown[]) => void lines.push(args.map(String).join(" "));
  }
  ort.env.logLevel = "info";
  let session: Ort.InferenceSession;
  try {
    session = await ort.InferenceSession.create(bytes, { ...options, logSeverityLevel: 1 });
  } catch (err) {
    const last = lines.filter((l) => !/\[[IV]:onnxruntime/.test(l)).slice(-3).join(" | ");
    throw new Error(`${err instanceof Error ? err.message : String(err)}${last ? ` (log: ${last})` : ""}`);
  } finally {
    Object.assign(console, saved);
    ort.env.logLevel = "error";
  }
  const onCpu = new Set<string>();
  for (const line of lines) {
    const m = /webgpu kernel not found in registries for Op type: (\S+) node name: (\S+)/.exec(line);
    if (m) onCpu.add(`${m[1]} ${m[2]}`);
  }
  return { session, onCpu: [...onCpu] };
}

async function parityRunOrt(
  base: string,
  graph: Graph,
  optimization: "disabled" | "basic" | "extended" | "all",
  ep: Ep = "wasm",
  graphUrl = "",
  cpuNodes = "",
): Promise<string> {
  const adapter = ep === "webgpu" ? await webgpuAdapter() : "";
  const ort = (await import(ORT_URL[ep])) as typeof Ort;
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = "/ort/";
  ort.env.logLevel = "error";
  const { fixture, manifest } = await fetchFixture(base);
  const files = manifest["files"] as { onnx?: Partial<Record<Graph, string>> } | undefined;
  const name = files?.onnx?.[graph];
  if (typeof name !== "string") throw new Error(`the manifest names no ONNX '${graph}' graph (files.onnx.${graph})`);
  const bytes = await fetchBytes(graphUrl || `${base}${name}`);
  const started = performance.now();
  const forced = cpuNodes.split(",").filter((n) => n !== "");
  const provider = ep === "webgpu" && forced.length > 0 ? { name: "webgpu", forceCpuNodeNames: forced } : ep;
  const options: Ort.InferenceSession.SessionOptions = { executionProviders: [provider], graphOptimizationLevel: optimization };
  const { session, onCpu } =
    ep === "webgpu" ? await createLogged(ort, bytes, options) : { session: await ort.InferenceSession.create(bytes, options), onCpu: [] };
  const created = performance.now();
  const out = new Map<string, { shape: readonly number[]; data: TensorData }>();
  for (const c of fixture.cases) {
    const tokens = new ort.Tensor("int64", BigInt64Array.from(c.tokens, (t) => BigInt(t)), [c.tokens.length]);
    const results = await session.run({ tokens });
    for (const output of session.outputNames) {
      const value = results[output];
      if (value === undefined || !(value.data instanceof Float32Array)) {
        throw new Error(`case '${c.name}': output '${output}' is missing or not float32`);
      }
      out.set(`${c.name}/${output}`, { shape: value.dims.map(Number), data: value.data });
    }
  }
  const ran = performance.now();
  const outputs = [...session.outputNames];
  await session.release();
  const metadata = {
    producer: "parity ts_model/browser/page-ort.ts",
    graph: name,
    outputs: JSON.stringify(outputs),
    executionProvider: ep,
    seconds: JSON.stringify({ session: (created - started) / 1000, cases: (ran - created) / 1000 }),
    ...(ep === "webgpu" ? { webgpu_adapter: adapter, cpu_nodes: JSON.stringify(onCpu), forced_cpu_nodes: JSON.stringify(forced) } : {}),
    userAgent: navigator.userAgent,
  };
  return toBase64(serializeSafetensors(out, metadata));
}

Object.assign(globalThis, { parityRunOrt });
