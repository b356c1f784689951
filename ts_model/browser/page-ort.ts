// The onnxruntime-web backends' page: one of the fixture's ONNX graphs on onnxruntime-web's
// WebAssembly backend, in the browser.
//
// run-browser.mts serves onnxruntime-web's files under /ort/ and calls
// `parityRunOrt(base, graph, optimization)`: it fetches the graph named by the manifest
// (files.onnx.all_taps = model.onnx, files.onnx.logits = model.logits.onnx), runs every case
// (input `tokens`, int64 [T]) and returns every graph output as one safetensors file, base64, F32
// under "{case}/{output}". One thread (numThreads = 1: no worker, no SharedArrayBuffer needed).
// Whether the browser has a WebGPU adapter is returned in the metadata (`webgpu`); parity checks
// the WebAssembly backend only.

import type * as Ort from "onnxruntime-web";

import { serializeSafetensors } from "../model/safetensors.ts";
import type { TensorData } from "../model/safetensors.ts";
import { fetchBytes, fetchFixture, toBase64 } from "./fetch-fixture.ts";

const ORT_URL = "/ort/ort.wasm.min.mjs"; // a variable: esbuild and tsc leave the import to the browser

type Graph = "all_taps" | "logits";

async function webgpuStatus(): Promise<string> {
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<unknown> } }).gpu;
  if (gpu === undefined) return "no navigator.gpu";
  const timeout = new Promise<"timeout">((resolve) => setTimeout(() => resolve("timeout"), 5000));
  const adapter = await Promise.race([gpu.requestAdapter().catch(() => null), timeout]);
  if (adapter === "timeout") return "requestAdapter() did not answer";
  return adapter === null ? "no WebGPU adapter" : "adapter";
}

async function parityRunOrt(base: string, graph: Graph, optimization: "disabled" | "basic" | "extended" | "all"): Promise<string> {
  const ort = (await import(ORT_URL)) as typeof Ort;
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = "/ort/";
  ort.env.logLevel = "error";
  const { fixture, manifest } = await fetchFixture(base);
  const files = manifest["files"] as { onnx?: Partial<Record<Graph, string>> } | undefined;
  const name = files?.onnx?.[graph];
  if (typeof name !== "string") throw new Error(`the manifest names no ONNX '${graph}' graph (files.onnx.${graph})`);
  const session = await ort.InferenceSession.create(await fetchBytes(`${base}${name}`), {
    executionProviders: ["wasm"],
    graphOptimizationLevel: optimization,
  });
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
  const outputs = [...session.outputNames];
  await session.release();
  const metadata = {
    producer: "parity ts_model/browser/page-ort.ts",
    graph: name,
    outputs: JSON.stringify(outputs),
    webgpu: await webgpuStatus(),
    userAgent: navigator.userAgent,
  };
  return toBase64(serializeSafetensors(out, metadata));
}

Object.assign(globalThis, { parityRunOrt });
