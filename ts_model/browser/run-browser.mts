// parity's browser driver: run the model, or onnxruntime-web, or the learners' page in headless Chrome.
//
//   node ts_model/browser/run-browser.mts typescript FIXTURE_DIR OUT.safetensors
//   node ts_model/browser/run-browser.mts onnxruntime-web FIXTURE_DIR OUT.safetensors all_taps|logits disabled|basic|extended|all [wasm|webgpu [GRAPH_FILE [CPU_NODES]]]
//   node ts_model/browser/run-browser.mts page URL [URL ...] [--screenshot OUT.png]
//   node ts_model/browser/run-browser.mts build OUT_DIR
//   node ts_model/browser/run-browser.mts session
//   node ts_model/browser/run-browser.mts launch
//   node ts_model/browser/run-browser.mts webgpu [--no-unsafe-webgpu] [CHROME_FLAG ...]
//
// `typescript` bundles page-model.ts (model/model.ts from PARITY_TS_DIR or ts_model/) with esbuild,
// serves it and the fixture's files from 127.0.0.1 (an ephemeral port), runs every case in the page
// and writes every tap, float64, to OUT (the format of ts_model/node/run.ts). `onnxruntime-web` does the
// same with one ONNX graph on onnxruntime-web's WebAssembly backend (float32 graph outputs), or on
// its WebGPU backend (argument `webgpu`: onnxruntime-web's WebGPU execution provider). GRAPH_FILE, if
// given, is the ONNX file run instead of the manifest's (served as /graph.onnx; the harness's float32 rewrite);
// CPU_NODES, comma-separated node names the WebGPU provider must leave to the CPU (its forceCpuNodeNames).
// `page` opens each URL of the learners' page (`parity serve`), waits for its verdict and prints one
// JSON line per URL: {"url", "verdict", "tap", "text"}. `build` writes the learners' page bundle.
// `session` serves many runs with one Chrome (one per `parity run`, for every browser backend): it
// reads one JSON request per line on stdin, {"id": N, "argv": ["typescript", ...]} (the arguments
// of the typescript or onnxruntime-web mode), and answers each with one line on stdout, {"id": N,
// "ok": true} or {"id": N, "ok": false, "error": "one line"}. Chrome starts with the first request,
// each request has its own PARITY_BROWSER_TIMEOUT deadline and page, a failed request closes Chrome
// (the next one starts another), and the end of stdin closes Chrome and ends the session.
// `launch` starts Chrome, opens a blank page and closes it: one browser start (benchmarks/bench.py's floor).
// `webgpu` starts the same Chrome, but without --disable-gpu (PARITY_CHROME's flag: a real GPU may show),
// without --enable-unsafe-webgpu if asked, plus CHROME_FLAGs; it opens a page on 127.0.0.1 (WebGPU
// needs a secure context) and prints one JSON line: what navigator.gpu.requestAdapter() gives, with and
// without forceFallbackAdapter, and the flags the browser had (docs/browser.md, "WebGPU").
//
// Browser: PARITY_CHROME, else @sparticuz/chromium (chrome.mts). Time: PARITY_BROWSER_TIMEOUT
// seconds for the whole run (default 120). Any trouble (no browser, a crash, a timeout, an error
// on the page's console) is one line on stderr and exit code 2; Chrome is always closed.

import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";

import { BROWSER_DIR, REPO_TS_DIR, bundle, packageDir } from "./bundle.mts";
import { BrowserTrouble, Chrome, Deadline, killAll, lastLaunchFlags, oneLine } from "./chrome.mts";
import { contentType, serve } from "./serve.mts";
import type { Resource, StaticServer } from "./serve.mts";
import type { Page } from "puppeteer-core";

const USAGE =
  "usage: run-browser.mts typescript FIXTURE_DIR OUT | onnxruntime-web FIXTURE_DIR OUT GRAPH OPTIMIZATION [wasm|webgpu [GRAPH_FILE [CPU_NODES]]] | " +
  "page URL... [--screenshot PNG] | build OUT_DIR | session | launch | webgpu [--no-unsafe-webgpu] [CHROME_FLAG...]";
const WEB_DIR = join(REPO_TS_DIR, "web");
const PAGE_HTML =
  '<!doctype html>\n<meta charset="utf-8">\n<link rel="icon" href="data:,">\n<title>parity browser backend</title>\n' +
  '<script type="module" src="/page.js"></script>\n';
// The onnxruntime-web files the page loads: the WebAssembly-only ES module, its glue, the binary;
// and the WebGPU build's module, its glue and binary (the WebGPU execution provider; read only if asked for).
const ORT_FILES = [
  "ort.wasm.min.mjs",
  "ort-wasm-simd-threaded.mjs",
  "ort-wasm-simd-threaded.wasm",
  "ort.webgpu.min.mjs",
  "ort-wasm-simd-threaded.asyncify.mjs",
  "ort-wasm-simd-threaded.asyncify.wasm",
];

class UsageError extends Error {}

/** The fixture's files a page may fetch: manifest.json and the plain names the manifest lists. */
export function fixtureResources(root: string, prefix: string): Map<string, Resource> {
  const manifestPath = join(root, "manifest.json");
  let manifest: { sha256?: Record<string, unknown> };
  try {
    manifest = JSON.parse(readFileSync(manifestPath, "utf-8")) as typeof manifest;
  } catch (err) {
    throw new BrowserTrouble(`${manifestPath}: cannot read (${err instanceof Error ? err.message : String(err)})`);
  }
  const names = ["manifest.json", ...Object.keys(manifest.sha256 ?? {})];
  const out = new Map<string, Resource>();
  for (const name of names) {
    if (!/^[A-Za-z0-9._-]+$/.test(name) || name.startsWith(".")) continue; // plain names only
    out.set(`${prefix}${name}`, { type: contentType(name), body: () => readFileSync(join(root, name)) });
  }
  return out;
}

function ortResources(): Map<string, Resource> {
  const pkg = packageDir("onnxruntime-web");
  if (pkg === null) throw new BrowserTrouble("onnxruntime-web is not installed: run `npm ci` in the parity checkout");
  const dist = join(pkg, "dist");
  return new Map(ORT_FILES.map((f) => [`/ort/${f}`, { type: contentType(f), body: () => readFileSync(join(dist, f)) }]));
}

/** Where a run gets its Chrome, and what happens to it after the run (`ok`: the run succeeded). */
interface ChromeSource {
  get(deadline: Deadline): Promise<Chrome>;
  done(chrome: Chrome, ok: boolean): Promise<void>;
}

/** One Chrome for one run: started for it, closed after it. */
const ONE_SHOT: ChromeSource = {
  get: (deadline) => Chrome.launch(deadline),
  done: (chrome) => chrome.close(),
};

/** Serve `entry`'s bundle as /page.js under a minimal page, open it, and call `call` in it. */
async function runInPage(
  entry: string,
  extra: Map<string, Resource>,
  fixtureDir: string,
  call: (chrome: Chrome, page: Page) => Promise<string>,
  source: ChromeSource,
): Promise<Uint8Array> {
  const deadline = new Deadline();
  const code = await deadline.within(bundle(entry), `bundling ${basename(entry)}`);
  const resources = new Map<string, Resource>([
    ["/", { type: contentType(".html"), body: () => PAGE_HTML }],
    ["/page.js", { type: contentType(".js"), body: () => code }],
    ...fixtureResources(resolve(fixtureDir), "/fixture/"),
    ...extra,
  ]);
  let server: StaticServer | undefined;
  let chrome: Chrome | undefined;
  let page: Page | undefined;
  let ok = false;
  try {
    server = await deadline.within(serve(resources), "starting the local server");
    chrome = await source.get(deadline);
    page = await chrome.newPage();
    await chrome.within(page.goto(`${server.origin}/`, { timeout: 0, waitUntil: "load" }), "loading the page");
    const base64 = await call(chrome, page);
    ok = true;
    return Buffer.from(base64, "base64");
  } finally {
    if (ok && page !== undefined) {
      try {
        await chrome!.within(page.close(), "closing the page");
      } catch {
        ok = false; // a Chrome that cannot close a page is not given another run
      }
    }
    if (chrome !== undefined) await source.done(chrome, ok);
    await server?.close();
  }
}

async function waitForGlobal(chrome: Chrome, page: Page, name: string): Promise<void> {
  await chrome.within(
    page.waitForFunction((n: string) => typeof (globalThis as Record<string, unknown>)[n] === "function", { timeout: 0 }, name),
    `waiting for the page's ${name}`,
  );
}

async function runTypescript(argv: readonly string[], source: ChromeSource = ONE_SHOT): Promise<void> {
  if (argv.length !== 2) throw new UsageError(USAGE);
  const [fixtureDir, out] = argv as [string, string];
  const bytes = await runInPage(join(BROWSER_DIR, "page-model.ts"), new Map(), fixtureDir, async (chrome, page) => {
    await waitForGlobal(chrome, page, "parityRunModel");
    return chrome.within(
      page.evaluate((base: string) => (globalThis as unknown as Record<string, (b: string) => Promise<string>>)["parityRunModel"]!(base), "/fixture/"),
      "running the model in the page",
    );
  }, source);
  writeFileSync(out, bytes);
}

async function runOrt(argv: readonly string[], source: ChromeSource = ONE_SHOT): Promise<void> {
  if (argv.length < 4 || argv.length > 7) throw new UsageError(USAGE);
  const [fixtureDir, out, graph, optimization, ep = "wasm", graphFile = "", cpuNodes = ""] = argv as [string, string, string, string, string?, string?, string?];
  if (graph !== "all_taps" && graph !== "logits") throw new UsageError(`GRAPH must be all_taps or logits, not ${graph}`);
  if (!["disabled", "basic", "extended", "all"].includes(optimization)) {
    throw new UsageError(`OPTIMIZATION must be disabled, basic, extended or all, not ${optimization}`);
  }
  if (ep !== "wasm" && ep !== "webgpu") throw new UsageError(`the execution provider must be wasm or webgpu, not ${ep}`);
  const extra = ortResources();
  if (graphFile) extra.set("/graph.onnx", { type: contentType(".onnx"), body: () => readFileSync(graphFile) });
  const bytes = await runInPage(join(BROWSER_DIR, "page-ort.ts"), extra, fixtureDir, async (chrome, page) => {
    await waitForGlobal(chrome, page, "parityRunOrt");
    return chrome.within(
      page.evaluate(
        (base: string, g: string, o: string, e: string, u: string, c: string) =>
          (globalThis as unknown as Record<string, (b: string, g: string, o: string, e: string, u: string, c: string) => Promise<string>>)[
            "parityRunOrt"
          ]!(base, g, o, e, u, c),
        "/fixture/",
        graph,
        optimization,
        ep,
        graphFile ? "/graph.onnx" : "",
        cpuNodes,
      ),
      `running ${graph} on onnxruntime-web (${ep})`,
    );
  }, source);
  writeFileSync(out, bytes);
}

/** One browser start and stop, nothing run: what the benchmark counts as the floor of a browser run. */
async function launchOnly(argv: readonly string[]): Promise<void> {
  if (argv.length !== 0) throw new UsageError(USAGE);
  const chrome = await Chrome.launch(new Deadline());
  try {
    const page = await chrome.newPage();
    await chrome.within(page.goto("about:blank", { timeout: 0 }), "opening a blank page");
  } finally {
    await chrome.close();
  }
}

/** The WebGPU probe: this browser's adapters, as one JSON line on stdout (see the header). */
async function probeWebgpu(argv: readonly string[]): Promise<void> {
  const drop = ["--disable-gpu", ...(argv.includes("--no-unsafe-webgpu") ? ["--enable-unsafe-webgpu"] : [])];
  const extra = argv.filter((a) => a !== "--no-unsafe-webgpu");
  if (extra.some((a) => !a.startsWith("--"))) throw new UsageError(USAGE);
  const deadline = new Deadline();
  const server = await deadline.within(serve(new Map([["/", { type: contentType(".html"), body: () => PROBE_HTML }]])), "starting the local server");
  const chrome = await Chrome.launch(deadline, { drop, extra });
  try {
    const page = await chrome.newPage();
    const warnings: string[] = [];
    page.on("console", (msg) => void warnings.push(oneLine(msg.text())));
    await chrome.within(page.goto(`${server.origin}/`, { timeout: 0, waitUntil: "load" }), "loading the page");
    const result = await chrome.within(
      page.evaluate(async () => {
        type Adapter = { features: Set<string>; info?: Record<string, unknown>; limits: Record<string, number> };
        const gpu = (navigator as unknown as { gpu?: { requestAdapter(o?: object): Promise<Adapter | null> } }).gpu;
        const out: Record<string, unknown> = { userAgent: navigator.userAgent, navigatorGpu: gpu !== undefined };
        if (gpu === undefined) return out;
        for (const [key, options] of [["adapter", {}], ["fallbackAdapter", { forceFallbackAdapter: true }]] as const) {
          const adapter = await Promise.race([gpu.requestAdapter(options), new Promise<"timeout">((r) => setTimeout(() => r("timeout"), 10000))]);
          if (adapter === null || adapter === "timeout") {
            out[key] = adapter;
            continue;
          }
          const info = adapter.info ?? {};
          out[key] = {
            vendor: info["vendor"], architecture: info["architecture"], device: info["device"], description: info["description"],
            isFallbackAdapter: info["isFallbackAdapter"], shaderF16: adapter.features.has("shader-f16"),
            features: [...adapter.features].sort(), maxBufferSize: adapter.limits["maxBufferSize"],
          };
        }
        return out;
      }),
      "asking for a WebGPU adapter",
    );
    process.stdout.write(`${JSON.stringify({ ...result, browserFlags: lastLaunchFlags(), console: warnings })}\n`);
  } finally {
    await chrome.close();
    await server.close();
  }
}

const PROBE_HTML = '<!doctype html>\n<meta charset="utf-8">\n<link rel="icon" href="data:,">\n<title>parity WebGPU probe</title>\n';

/** Many runs, one Chrome: requests on stdin, one answer per line on stdout (see the header). */
async function session(argv: readonly string[]): Promise<void> {
  if (argv.length !== 0) throw new UsageError(USAGE);
  let kept: Chrome | undefined;
  const source: ChromeSource = {
    async get(deadline) {
      if (kept?.alive) return kept.forRun(deadline);
      await kept?.close();
      kept = await Chrome.launch(deadline);
      return kept;
    },
    async done(chrome, ok) {
      if (ok) return;
      await chrome.close(); // its state after a failure is unknown: the next request starts another
      if (kept === chrome) kept = undefined;
    },
  };
  const answer = (reply: Record<string, unknown>): void => {
    process.stdout.write(`${JSON.stringify(reply)}\n`);
  };
  try {
    for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      if (!line.trim()) continue;
      let id: unknown = null;
      try {
        const request = JSON.parse(line) as { id?: unknown; argv?: unknown };
        id = request.id ?? null;
        const args = request.argv;
        if (!Array.isArray(args) || !args.every((a) => typeof a === "string") || args.length === 0) {
          throw new UsageError(`a session request needs "argv": [MODE, ...], got ${oneLine(line).slice(0, 200)}`);
        }
        const [mode, ...rest] = args as string[];
        if (mode === "typescript") await runTypescript(rest, source);
        else if (mode === "onnxruntime-web") await runOrt(rest, source);
        else throw new UsageError(`a session runs typescript or onnxruntime-web, not ${mode}`);
        answer({ id, ok: true });
      } catch (err) {
        answer({ id, ok: false, error: oneLine(err instanceof Error ? err.message : String(err)) });
      }
    }
  } finally {
    await kept?.close();
  }
}

/** The learners' page: each URL's verdict as a JSON line; optionally a screenshot of the first. */
async function checkPages(argv: readonly string[]): Promise<void> {
  const urls: string[] = [];
  let screenshot: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--screenshot") screenshot = argv[++i];
    else urls.push(argv[i]!);
  }
  if (urls.length === 0 || (argv.includes("--screenshot") && !screenshot)) throw new UsageError(USAGE);
  const deadline = new Deadline();
  const chrome = await Chrome.launch(deadline);
  try {
    for (const [i, url] of urls.entries()) {
      const page = await chrome.newPage();
      await chrome.within(page.setViewport({ width: 1000, height: 900 }), "sizing the page");
      await chrome.within(page.goto(url, { timeout: 0, waitUntil: "load" }), `loading ${url}`);
      await chrome.within(page.waitForSelector("#verdict[data-verdict]", { timeout: 0 }), `waiting for the verdict on ${url}`);
      const verdict = await chrome.within(
        page.$eval("#verdict", (el) => ({
          verdict: (el as HTMLElement).dataset["verdict"] ?? "",
          tap: (el as HTMLElement).dataset["tap"] ?? "",
          text: el.textContent ?? "",
        })),
        "reading the verdict",
      );
      process.stdout.write(`${JSON.stringify({ url, ...verdict, text: oneLine(verdict.text) })}\n`);
      if (i === 0 && screenshot !== undefined) {
        await chrome.within(page.screenshot({ path: screenshot as `${string}.png`, fullPage: true }), "taking the screenshot");
      }
      await chrome.within(page.close(), "closing the page");
    }
  } finally {
    await chrome.close();
  }
}

/** The learners' page bundle: index.html, style.css and main.js (model.ts from PARITY_TS_DIR). */
async function build(argv: readonly string[]): Promise<void> {
  if (argv.length !== 1) throw new UsageError(USAGE);
  const out = argv[0]!;
  const deadline = new Deadline();
  const code = await deadline.within(bundle(join(WEB_DIR, "main.ts")), "bundling the page");
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, "main.js"), code);
  for (const file of ["index.html", "style.css"]) copyFileSync(join(WEB_DIR, file), join(out, file));
}

async function main(argv: readonly string[]): Promise<void> {
  const [mode, ...rest] = argv;
  if (mode === "typescript") return runTypescript(rest);
  if (mode === "onnxruntime-web") return runOrt(rest);
  if (mode === "page") return checkPages(rest);
  if (mode === "build") return build(rest);
  if (mode === "session") return session(rest);
  if (mode === "launch") return launchOnly(rest);
  if (mode === "webgpu") return probeWebgpu(rest);
  throw new UsageError(USAGE);
}

// Never outlive the harness: on a signal, or when the parent process is gone (parity interrupted or
// killed), stop every browser and exit.
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
  process.once(signal, () => {
    killAll();
    process.stderr.write(`run-browser: stopped by ${signal}\n`);
    process.exit(2);
  });
}
process.on("uncaughtException", (err) => {
  killAll();
  process.stderr.write(`run-browser: ${oneLine(err instanceof Error ? err.message : String(err))}\n`);
  process.exit(2);
});
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) {
    killAll();
    process.exit(2);
  }
}, 500).unref();

try {
  await main(process.argv.slice(2));
} catch (err) {
  process.stderr.write(`run-browser: ${oneLine(err instanceof Error ? err.message : String(err))}\n`);
  process.exitCode = 2;
}
process.exit(); // nothing may keep the process alive after the browser is closed
