// Find, start and always stop a headless Chrome for parity's browser backends and page test.
//
// Which browser: PARITY_CHROME (a Chrome or Chromium executable, e.g. /usr/bin/chromium), else the
// Chromium inside the npm package @sparticuz/chromium, unpacked once into
// node_modules/.cache/parity/chromium-<version>/ (atomically: unpacked beside it, then renamed).
//
// Chrome is started here, as a plain child of this Node process (not through puppeteer.launch,
// which starts it in a process group of its own): when the harness kills this process group on a
// timeout, Chrome goes with it. puppeteer-core then connects over the DevTools WebSocket that
// Chrome prints on stderr. The network is closed to the outside, so every background service that
// would try to reach it is switched off.
//
// Every wait is bounded by a Deadline (PARITY_BROWSER_TIMEOUT seconds for the whole run, or for
// one request of a session: `deadline` is replaced per request), and is raced against Chrome
// exiting and against an error on the page's console: each is a BrowserTrouble with one line for the user.

import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

import puppeteer from "puppeteer-core";
import type { Browser, Page } from "puppeteer-core";

import { packageDir } from "./bundle.mts";

/** Anything that stops a browser run: printed as one line, exit code 2. */
export class BrowserTrouble extends Error {
  override name = "BrowserTrouble";
}

export const DEFAULT_TIMEOUT_S = 120;

/** The whole run's time budget: PARITY_BROWSER_TIMEOUT seconds (default 120) from now. */
export class Deadline {
  readonly seconds: number;
  readonly end: number;

  constructor(raw: string | undefined = process.env["PARITY_BROWSER_TIMEOUT"]) {
    const value = raw === undefined || raw === "" ? DEFAULT_TIMEOUT_S : Number(raw);
    if (!(value > 0) || !Number.isFinite(value)) {
      throw new BrowserTrouble(`PARITY_BROWSER_TIMEOUT=${JSON.stringify(raw)} must be a positive number of seconds`);
    }
    this.seconds = value;
    this.end = Date.now() + value * 1000;
  }

  remainingMs(): number {
    return Math.max(0, this.end - Date.now());
  }

  /** `promise`, or a BrowserTrouble naming `what` when the budget runs out first. */
  async within<T>(promise: Promise<T>, what: string, also: readonly Promise<never>[] = []): Promise<T> {
    promise.catch(() => {}); // if it fails after the race is decided, that is not an unhandled rejection
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new BrowserTrouble(`timed out after ${this.seconds} s (PARITY_BROWSER_TIMEOUT) ${what}`)),
        this.remainingMs(),
      );
    });
    try {
      return await Promise.race([promise, timeout, ...also]);
    } finally {
      clearTimeout(timer);
    }
  }
}

// Background services that would try the network (closed here) and only slow the start.
const QUIET_FLAGS = [
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
  "--disable-default-apps",
  "--disable-extensions",
  "--no-default-browser-check",
  "--metrics-recording-only",
  "--mute-audio",
];

// WebGPU on a machine without a GPU: Chromium offers its SwiftShader (Vulkan on the CPU) adapter to
// WebGPU only with this flag; without it navigator.gpu.requestAdapter() returns null (docs/browser.md, "WebGPU").
const WEBGPU_FLAG = "--enable-unsafe-webgpu";

interface Executable {
  readonly path: string;
  readonly args: readonly string[]; // the flags this browser needs (headless mode, sandbox, ...)
  readonly env: Readonly<Record<string, string>>;
}

function isRoot(): boolean {
  return typeof process.getuid === "function" && process.getuid() === 0;
}

/** PARITY_CHROME, checked: an executable file. */
function systemChrome(path: string): Executable {
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new BrowserTrouble(`PARITY_CHROME=${path} is not an executable file`);
  }
  return { path, args: ["--headless", "--disable-gpu", WEBGPU_FLAG, ...(isRoot() ? ["--no-sandbox"] : [])], env: {} };
}

/** The Chromium of @sparticuz/chromium, unpacked once into node_modules/.cache/parity/. */
async function packagedChromium(): Promise<Executable> {
  const pkg = packageDir("@sparticuz/chromium");
  if (pkg === null) {
    throw new BrowserTrouble(
      "no browser found: set PARITY_CHROME to a Chrome or Chromium executable, or run `npm ci` in the parity checkout (it installs @sparticuz/chromium)",
    );
  }
  const version = (JSON.parse(readFileSync(join(pkg, "package.json"), "utf-8")) as { version: string }).version;
  const cacheRoot = join(dirname(dirname(pkg)), ".cache", "parity"); // node_modules/.cache/parity
  const dir = join(cacheRoot, `chromium-${version}`);
  const { default: chromium } = await import("@sparticuz/chromium");
  if (!existsSync(join(dir, "chromium"))) {
    mkdirSync(cacheRoot, { recursive: true });
    const staging = mkdtempSync(join(cacheRoot, `chromium-${version}.partial-`));
    const saved = process.env["TMPDIR"];
    process.env["TMPDIR"] = staging; // the package unpacks into os.tmpdir()
    try {
      await chromium.executablePath();
    } finally {
      if (saved === undefined) delete process.env["TMPDIR"];
      else process.env["TMPDIR"] = saved;
    }
    writeFileSync(
      join(staging, "fonts.conf"),
      `<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n  <dir>${dir}/fonts</dir>\n` +
        `  <dir>/usr/share/fonts</dir>\n  <cachedir>${dir}/fonts-cache</cachedir>\n</fontconfig>\n`,
    );
    try {
      renameSync(staging, dir);
    } catch {
      rmSync(staging, { recursive: true, force: true }); // another run unpacked it first
    }
  }
  // chromium.args: the package's flags (headless shell, no sandbox, single process, SwiftShader).
  return { path: join(dir, "chromium"), args: [...chromium.args, WEBGPU_FLAG], env: { FONTCONFIG_FILE: join(dir, "fonts.conf") } };
}

const live = new Set<ChildProcess>(); // browsers started and not yet stopped
let lastArgs: readonly string[] = []; // the flags of the last browser started (before the quiet ones)

/** The flags the last `Chrome.launch` started the browser with, before QUIET_FLAGS and the profile's. */
export function lastLaunchFlags(): readonly string[] {
  return lastArgs;
}

/** Kill every browser this process started (on a signal, or when the harness that ran us is gone). */
export function killAll(): void {
  for (const proc of live) killTree(proc);
  live.clear();
}

export async function findBrowser(): Promise<Executable> {
  const override = process.env["PARITY_CHROME"];
  return override ? systemChrome(override) : packagedChromium();
}

/** A running Chrome, connected. `close()` always leaves no process behind. */
export class Chrome {
  readonly browser: Browser;
  deadline: Deadline; // the current run's (a session sets each request's own)
  readonly exited: Promise<never>; // rejects when Chrome exits before `close()`
  pageErrors: Promise<never>; // rejects on the first error on any page's console (since `forRun`)
  private readonly proc: ChildProcess;
  private readonly profile: string;
  private readonly expectExit: () => void; // from now on, Chrome exiting is not a crash
  private failPage: (err: BrowserTrouble) => void = () => {};
  private closing = false;

  private constructor(
    browser: Browser,
    proc: ChildProcess,
    profile: string,
    deadline: Deadline,
    exited: Promise<never>,
    expectExit: () => void,
  ) {
    this.browser = browser;
    this.expectExit = expectExit;
    this.proc = proc;
    this.profile = profile;
    this.deadline = deadline;
    this.exited = exited;
    this.pageErrors = this.newPageErrors();
  }

  private newPageErrors(): Promise<never> {
    const errors = new Promise<never>((_, reject) => {
      this.failPage = reject;
    });
    errors.catch(() => {}); // observed through `race`; never an unhandled rejection
    return errors;
  }

  /** Ready for another run of a session: its own deadline, and no page error of an earlier run counts. */
  forRun(deadline: Deadline): this {
    this.deadline = deadline;
    this.pageErrors = this.newPageErrors();
    return this;
  }

  /** Start Chrome (see the module comment) and connect to it, within the deadline. `flags`: the WebGPU
   * probe's (run-browser.mts webgpu): flags to leave out of the usual ones, and more flags. */
  static async launch(deadline: Deadline, flags: { drop?: readonly string[]; extra?: readonly string[] } = {}): Promise<Chrome> {
    const found = await deadline.within(findBrowser(), "unpacking the browser");
    const exe = { ...found, args: [...found.args.filter((a) => !(flags.drop ?? []).includes(a)), ...(flags.extra ?? [])] };
    lastArgs = exe.args;
    // PARITY_BROWSER_TAG goes into the profile's name: the test suite finds leftover browsers by it.
    const tag = (process.env["PARITY_BROWSER_TAG"] ?? "").replace(/[^A-Za-z0-9_-]/g, "");
    const profile = mkdtempSync(join(tmpdir(), `parity-chrome-${tag ? `${tag}-` : ""}`));
    const args = [
      ...exe.args,
      ...QUIET_FLAGS,
      "--remote-debugging-port=0",
      "--remote-debugging-address=127.0.0.1",
      `--user-data-dir=${profile}`,
      "about:blank",
    ];
    let proc: ChildProcess;
    try {
      proc = spawn(exe.path, args, {
        stdio: ["ignore", "ignore", "pipe"],
        env: { ...process.env, ...exe.env },
        detached: false, // the same process group as this script: killed together
      });
    } catch (err) {
      rmSync(profile, { recursive: true, force: true });
      throw new BrowserTrouble(`cannot start ${exe.path}: ${err instanceof Error ? err.message : String(err)}`);
    }
    live.add(proc);
    proc.once("exit", () => live.delete(proc));
    const tail: string[] = []; // Chrome's last stderr lines, for the error message
    let endpoint: ((url: string) => void) | undefined;
    const ready = new Promise<string>((resolve) => {
      endpoint = resolve;
    });
    let buffered = "";
    proc.stderr!.setEncoding("utf-8");
    proc.stderr!.on("data", (chunk: string) => {
      buffered += chunk;
      const lines = buffered.split("\n");
      buffered = lines.pop() ?? "";
      for (const line of lines) {
        const match = /DevTools listening on (ws:\/\/\S+)/.exec(line);
        if (match) endpoint?.(match[1]!);
        else if (line.trim()) tail.push(line.trim());
        if (tail.length > 20) tail.shift();
      }
    });
    let expected = false; // set once we stop it: its exit is then no crash
    const exited = new Promise<never>((_, reject) => {
      const fail = (what: string): void => {
        if (expected) return;
        const last = tail.length > 0 ? `: ${tail[tail.length - 1]}` : "";
        reject(new BrowserTrouble(`the browser (${exe.path}) ${what}${last}`));
      };
      proc.once("error", (err) => fail(`could not start (${err.message})`));
      proc.once("exit", (code, signal) => fail(signal ? `was killed by ${signal}` : `exited with code ${code}`));
    });
    exited.catch(() => {});
    const stop = (): void => {
      expected = true;
      killTree(proc);
      rmSync(profile, { recursive: true, force: true });
    };
    try {
      const url = await deadline.within(ready, "waiting for the browser to start", [exited]);
      const browser = await deadline.within(
        puppeteer.connect({ browserWSEndpoint: url, protocolTimeout: Math.max(1000, deadline.seconds * 1000), defaultViewport: null }),
        "connecting to the browser",
        [exited],
      );
      return new Chrome(browser, proc, profile, deadline, exited, () => {
        expected = true;
      });
    } catch (err) {
      stop();
      throw err;
    }
  }

  /** True while Chrome runs and has not been closed: a session may give it another request. */
  get alive(): boolean {
    return !this.closing && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** A new page whose console errors, uncaught exceptions and failed requests fail the run. */
  async newPage(): Promise<Page> {
    const page = await this.within(this.browser.newPage(), "opening a page");
    page.on("console", (msg) => {
      if (msg.type() === "error") this.failPage(new BrowserTrouble(`error on the page's console: ${oneLine(msg.text())}`));
    });
    page.on("pageerror", (err) => {
      this.failPage(new BrowserTrouble(`uncaught error on the page: ${oneLine(err instanceof Error ? err.message : String(err))}`));
    });
    page.on("requestfailed", (req) => {
      this.failPage(new BrowserTrouble(`the page could not load ${req.url()}: ${req.failure()?.errorText ?? "failed"}`));
    });
    return page;
  }

  /** `promise` within the deadline, failing early if Chrome exits or the page reports an error. */
  within<T>(promise: Promise<T>, what: string): Promise<T> {
    return this.deadline.within(promise, what, [this.exited, this.pageErrors]);
  }

  /** Disconnect, then kill Chrome if it is still there, and remove its profile. Never throws. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.expectExit();
    const gone = new Promise<void>((resolve) => {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) resolve();
      else this.proc.once("exit", () => resolve());
    });
    try {
      await Promise.race([this.browser.close(), new Promise((resolve) => setTimeout(resolve, 3000))]);
    } catch {
      // already gone: killed below if not
    }
    killTree(this.proc); // Chrome if it did not quit, and any helper process left behind
    await Promise.race([gone, new Promise((resolve) => setTimeout(resolve, 5000))]);
    rmSync(this.profile, { recursive: true, force: true });
  }
}

/** Every process below `pid` (Linux /proc; empty elsewhere), read while the tree is intact. */
function descendants(pid: number): number[] {
  let entries: string[];
  try {
    entries = readdirSync("/proc").filter((e) => /^\d+$/.test(e));
  } catch {
    return [];
  }
  const children = new Map<number, number[]>();
  for (const entry of entries) {
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf-8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // the process ended meanwhile
    }
  }
  const out: number[] = [];
  const todo = [pid];
  while (todo.length > 0) {
    for (const child of children.get(todo.pop()!) ?? []) {
      out.push(child);
      todo.push(child);
    }
  }
  return out;
}

/** SIGKILL a process and everything below it (a browser's helpers, a wrapper script's children). */
export function killTree(proc: ChildProcess): void {
  // Only while it runs: the pid of a process that ended may already belong to another one.
  if (proc.pid === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
  const below = descendants(proc.pid);
  proc.kill("SIGKILL");
  for (const pid of below) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}

export function oneLine(text: string): string {
  return text.replace(/\s+/g, " ").trim();
}
