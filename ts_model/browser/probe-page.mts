// The learners' page (`parity serve`) as a learner sees it: its verdict and its layout, one JSON line per load.
//
//   node ts_model/browser/probe-page.mts URL [--width PX] [--screenshot OUT.png]
//
// Opens URL in Chrome (chrome.mts: PARITY_CHROME or the packaged Chromium; PARITY_BROWSER_TIMEOUT
// bounds the whole run) with a viewport PX wide (default 1000), waits for the verdict and prints
// {"verdict", "tap", "text", "width", "scrollWidth", "numbers", "wrapped"}: the viewport's width, the
// document's (`document.documentElement.scrollWidth`: more than the width is a page wider than the
// screen), how many numbers the page's tables hold, and those the browser broke over more than one
// line (a text node whose line boxes have more than one top). Then, for
// every line read on stdin, it reloads the page and prints the same again (what a learner does after
// editing model.ts); the end of stdin closes Chrome. Trouble is one line on stderr and exit code 2.
// tests/backends/test_learners_page.py drives it.

import { createInterface } from "node:readline";

import { Chrome, Deadline, killAll, oneLine } from "./chrome.mts";
import type { Page } from "puppeteer-core";

const USAGE = "usage: probe-page.mts URL [--width PX] [--screenshot OUT.png]";

interface Seen {
  verdict: string;
  tap: string;
  text: string;
  width: number;
  scrollWidth: number;
  numbers: number;
  wrapped: string[];
}

async function look(chrome: Chrome, page: Page): Promise<Seen> {
  await chrome.within(page.waitForSelector("#verdict[data-verdict]", { timeout: 0 }), "waiting for the verdict");
  return chrome.within(
    page.evaluate(() => {
      const verdict = document.getElementById("verdict")!;
      const NUMBER = /^[-+]?(\d[\d.,]*(e[-+]?\d+)?|\d*\.\d+(e[-+]?\d+)?|-|NaN|[-+]?Infinity)$/i;
      const wrapped: string[] = [];
      let numbers = 0;
      const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node !== null; node = walker.nextNode()) {
        const text = (node.textContent ?? "").trim();
        if (!NUMBER.test(text) || node.parentElement?.closest("table") == null) continue;
        numbers++;
        const range = document.createRange();
        range.selectNodeContents(node);
        const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (tops.size > 1) wrapped.push(text);
      }
      return {
        verdict: verdict.dataset["verdict"] ?? "",
        tap: verdict.dataset["tap"] ?? "",
        text: verdict.textContent ?? "",
        width: window.innerWidth,
        scrollWidth: document.documentElement.scrollWidth,
        numbers,
        wrapped,
      };
    }),
    "measuring the page",
  );
}

async function main(argv: readonly string[]): Promise<void> {
  let url: string | undefined;
  let width = 1000;
  let screenshot: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--width") width = Number(argv[++i]);
    else if (argv[i] === "--screenshot") screenshot = argv[++i];
    else if (url === undefined) url = argv[i];
    else throw new Error(USAGE);
  }
  if (url === undefined || !(width > 0) || (argv.includes("--screenshot") && !screenshot)) throw new Error(USAGE);
  const chrome = await Chrome.launch(new Deadline());
  try {
    const page = await chrome.newPage();
    await chrome.within(page.setViewport({ width, height: 800, isMobile: width < 600, hasTouch: width < 600 }), "sizing the page");
    await chrome.within(page.goto(url, { timeout: 0, waitUntil: "load" }), `loading ${url}`);
    const print = async (): Promise<void> => {
      const seen = await look(chrome, page);
      process.stdout.write(`${JSON.stringify({ ...seen, text: oneLine(seen.text) })}\n`);
    };
    await print();
    if (screenshot !== undefined) {
      await chrome.within(page.screenshot({ path: screenshot as `${string}.png`, fullPage: true }), "taking the screenshot");
    }
    for await (const _line of createInterface({ input: process.stdin })) {
      await chrome.within(page.reload({ timeout: 0, waitUntil: "load" }), `reloading ${url}`);
      await print();
    }
  } finally {
    await chrome.close();
  }
}

for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
  process.once(signal, () => {
    killAll();
    process.exit(2);
  });
}
try {
  await main(process.argv.slice(2));
} catch (err) {
  process.stderr.write(`probe-page: ${oneLine(err instanceof Error ? err.message : String(err))}\n`);
  process.exitCode = 2;
}
process.exit();
