// The learners' page: run model.ts in this browser and show how every tap agrees with the goldens.
//
// Served by `parity serve` (the fixture's files under fixture/), bundled by esbuild
// (`run-browser.mts build`). It fetches the fixture, runs every case through runWithTaps (float64),
// compares every tap with golden.fp64 and golden.fp32 by the harness's rule (../model/compare.ts), and
// shows the verdict, each tap's largest difference and the logit lens of one case. The verdict is
// #verdict, with data-verdict="PASS" | "FAIL" | "ERROR" and data-tap naming the first diverging tap
// (what the page test reads). A failure to load or run is also logged on the console.

import { compare, fmt } from "../model/compare.ts";
import type { TapResult } from "../model/compare.ts";
import type { Fixture, Precision } from "../model/fixture.ts";
import { runWithTaps } from "../model/model.ts";
import type { Tensor } from "../model/model.ts";
import type { SafeTensor } from "../model/safetensors.ts";
import { fetchFixture, fetchGolden, fetchParams } from "../browser/fetch-fixture.ts";

const BASE = "fixture/";
const TIERS: readonly Precision[] = ["fp64", "fp32"]; // our float64 result against each golden file

interface TapRow {
  readonly tap: string;
  readonly worst: Record<Precision, TapResult>; // the worst case per tier (a failing one first)
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, text = "", cls = ""): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (text) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function byId<T extends HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (node === null) throw new Error(`the page has no #${id}`);
  return node as T;
}

/** Every tap in dataflow order, each tier's worst case over all cases. */
function checkTaps(
  fixture: Fixture,
  results: ReadonlyMap<string, Map<string, Tensor>>,
  golden: Record<Precision, Map<string, SafeTensor>>,
): TapRow[] {
  return fixture.taps.map((tap) => {
    const worst = {} as Record<Precision, TapResult>;
    for (const tier of TIERS) {
      const tol = fixture.tolerances[tier].overrides.get(tap) ?? fixture.tolerances[tier].default;
      let w: TapResult = { ok: true, maxAbs: 0, where: "", note: "" };
      for (const c of fixture.cases) {
        const key = `${c.name}/${tap}`;
        const ours = results.get(c.name)?.get(tap);
        const theirs = golden[tier].get(key);
        if (ours === undefined) throw new Error(`the model produced no tap '${tap}'`);
        if (theirs === undefined) throw new Error(`${fixture.files.golden[tier]}: no tensor '${key}'`);
        const r = compare(ours, theirs, tol, key);
        if ((!r.ok && w.ok) || (r.ok === w.ok && r.maxAbs > w.maxAbs)) w = r;
      }
      worst[tier] = w;
    }
    return { tap, worst };
  });
}

/** A tap's name that a narrow screen may break after each dot (`<wbr>`: its text stays the name). */
function tapCell(tap: string): HTMLTableCellElement {
  const td = el("td", "", "tap");
  tap.split(/(?<=\.)/).forEach((part, i) => {
    if (i > 0) td.append(el("wbr"));
    td.append(part);
  });
  return td;
}

function showTaps(rows: readonly TapRow[], firstFail: string | null): void {
  const body = byId<HTMLTableElement>("taps").tBodies[0]!;
  body.replaceChildren();
  for (const row of rows) {
    const ok = TIERS.every((t) => row.worst[t].ok);
    const tr = el("tr", "", `${ok ? "" : "fail"}${row.tap === firstFail ? " first" : ""}`.trim());
    tr.append(tapCell(row.tap));
    for (const tier of TIERS) tr.append(el("td", fmt(row.worst[tier].maxAbs), "num"));
    tr.append(el("td", ok ? "OK" : "FAIL"));
    body.append(tr);
  }
}

function argmax(data: Float64Array | Float32Array, from: number, n: number): number {
  let best = 0;
  for (let j = 1; j < n; j++) if (data[from + j]! > data[from + best]!) best = j;
  return best;
}

/** The logit lens of one case: a row per stream, a column per position, the top guess in each cell. */
function showLens(fixture: Fixture, vocab: readonly string[], taps: Map<string, Tensor>, golden: Map<string, SafeTensor>, caseName: string): void {
  const table = byId<HTMLTableElement>("lens");
  table.replaceChildren();
  const tokens = fixture.cases.find((c) => c.name === caseName)?.tokens ?? [];
  const V = fixture.config.vocab_size;
  const head = el("tr");
  head.append(el("th", "stream \\ input"));
  for (const t of tokens) head.append(el("th", vocab[t] ?? String(t)));
  table.append(head);
  for (let k = 0; k <= fixture.config.n_layer; k++) {
    const ours = taps.get(`logit_lens.${k}`);
    const theirs = golden.get(`${caseName}/logit_lens.${k}`)?.data;
    if (ours === undefined || !(theirs instanceof Float64Array || theirs instanceof Float32Array)) continue;
    const tr = el("tr");
    tr.append(el("th", k === 0 ? "embeddings" : `after block ${k - 1}`));
    tokens.forEach((_, pos) => {
      const top = argmax(ours.data, pos * V, V);
      const p = ours.data[pos * V + top]!;
      const td = el("td", vocab[top] ?? String(top));
      td.append(el("small", p.toFixed(2)));
      td.style.background = `rgba(37, 99, 235, ${(0.08 + 0.6 * p).toFixed(2)})`;
      td.title = `P(${vocab[top]}) = ${p.toPrecision(6)}`;
      if (top !== argmax(theirs, pos * V, V)) td.classList.add("differs");
      tr.append(td);
    });
    table.append(tr);
  }
}

function setVerdict(verdict: "PASS" | "FAIL" | "ERROR", text: string, tap = ""): void {
  const node = byId<HTMLParagraphElement>("verdict");
  node.textContent = text;
  node.dataset["tap"] = tap;
  node.dataset["verdict"] = verdict; // set last: the page test waits for this attribute
}

async function main(): Promise<void> {
  const { fixture, manifest } = await fetchFixture(BASE);
  const vocab = Array.isArray(manifest["vocab"]) ? (manifest["vocab"] as string[]) : [];
  byId("atol64").textContent = String(fixture.tolerances.fp64.default.atol);
  byId("atol32").textContent = String(fixture.tolerances.fp32.default.atol);
  const [params, fp64, fp32] = await Promise.all([
    fetchParams(BASE, fixture),
    fetchGolden(BASE, fixture, "fp64"),
    fetchGolden(BASE, fixture, "fp32"),
  ]);
  const started = performance.now();
  const results = new Map(fixture.cases.map((c) => [c.name, runWithTaps(params, fixture.config, c.tokens)]));
  const ms = performance.now() - started;
  const c = fixture.config;
  byId("about").textContent =
    `${fixture.cases.length} cases, ${fixture.taps.length} taps (V=${c.vocab_size}, d=${c.d_model}, L=${c.n_layer}, ` +
    `H=${c.n_head}); the model ran in ${ms.toFixed(1)} ms in ${navigator.userAgent.match(/(Headless)?Chrome\/[\d.]+|Firefox\/[\d.]+|Version\/[\d.]+ Safari/)?.[0] ?? "this browser"}.`;

  const rows = checkTaps(fixture, results, { fp64, fp32 });
  const failing = rows.find((r) => TIERS.some((t) => !r.worst[t].ok)) ?? null;
  showTaps(rows, failing?.tap ?? null);

  const select = byId<HTMLSelectElement>("case");
  for (const k of fixture.cases) select.append(new Option(k.name, k.name));
  const initial = fixture.cases.find((k) => k.name === "grammar_2") ?? fixture.cases[0]!;
  select.value = initial.name;
  const draw = (): void => showLens(fixture, vocab, results.get(select.value)!, fp64, select.value);
  select.addEventListener("change", draw);
  draw();

  const checks = rows.length * TIERS.length;
  if (failing === null) {
    setVerdict("PASS", `PASS: all ${checks} checks agree (${rows.length} taps x 2 golden files, worst over ${fixture.cases.length} cases).`);
    return;
  }
  const tier = TIERS.find((t) => !failing.worst[t].ok)!;
  const w = failing.worst[tier];
  const bad = rows.reduce((n, r) => n + TIERS.filter((t) => !r.worst[t].ok).length, 0);
  const detail = w.note && w.note !== "tolerance exceeded" ? `, ${w.note}` : "";
  setVerdict(
    "FAIL",
    `FAIL: first divergence at ${failing.tap} (fp64 vs ${tier}), ${w.where}: max |diff| ${fmt(w.maxAbs)}${detail}; ` +
      `${bad} of ${checks} checks disagree.`,
    failing.tap,
  );
}

main().catch((err: unknown) => {
  const message = err instanceof Error ? err.message : String(err);
  setVerdict("ERROR", `ERROR: ${message}`);
  console.error(`parity page: ${message}`);
});
