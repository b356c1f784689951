// Bundle browser code with esbuild, in memory: the model from PARITY_TS_DIR, no Node module.
//
// The browser entry points (page-model.ts, page-ort.ts, ../web/main.ts) import the model's files
// (`../model/model.ts`, `../model/fixture.ts`, ...) from this repository's ts_model/model/. When
// PARITY_TS_DIR names another directory (a patched copy of ts_model/, as the mutant tests make),
// those imports are redirected to the same file names in its model/, so the browser runs exactly
// the model the typescript backend runs. Browser code needs no Node module: the model is pure
// (ts_model/model/tsconfig.json), so an import of `node:*` is a bundling error naming the importer.
// Paths starting with `/ort/` stay external: the page imports onnxruntime-web from the local server.

import { existsSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";

import * as esbuild from "esbuild";

export const BROWSER_DIR = import.meta.dirname; // ts_model/browser
export const REPO_TS_DIR = dirname(BROWSER_DIR); // ts_model
const REPO_MODEL_DIR = join(REPO_TS_DIR, "model"); // ts_model/model

/** node_modules/NAME of this checkout (Node's lookup: up from ts_model/browser/), or null. */
export function packageDir(name: string): string | null {
  for (let dir = BROWSER_DIR; ; dir = dirname(dir)) {
    const candidate = join(dir, "node_modules", name);
    if (existsSync(join(candidate, "package.json"))) return candidate;
    if (dirname(dir) === dir) return null;
  }
}

/** The directory holding model/model.ts: PARITY_TS_DIR, else this repository's ts_model/. */
export function modelDir(): string {
  const override = process.env["PARITY_TS_DIR"];
  return override ? resolve(override) : REPO_TS_DIR;
}

function redirectPlugin(models: string): esbuild.Plugin {
  return {
    name: "parity-model-dir",
    setup(build) {
      build.onResolve({ filter: /^node:/ }, (args) => ({
        errors: [{ text: `${args.path} imported by ${args.importer}: browser code cannot import Node modules` }],
      }));
      build.onResolve({ filter: /^\/ort\// }, (args) => ({ path: args.path, external: true }));
      build.onResolve({ filter: /^\.\.?\/.*\.ts$/ }, (args) => {
        const target = resolve(args.resolveDir, args.path);
        if (dirname(target) !== REPO_MODEL_DIR || models === REPO_TS_DIR) return undefined;
        const moved = join(models, "model", basename(target));
        if (!existsSync(moved)) return { errors: [{ text: `${moved}: not found (PARITY_TS_DIR=${models})` }] };
        return { path: moved };
      });
    },
  };
}

/** One ES module for the browser: `entry` and everything it imports. */
export async function bundle(entry: string): Promise<string> {
  let result: esbuild.BuildResult<{ write: false }>;
  try {
    result = await esbuild.build({
      entryPoints: [entry],
      bundle: true,
      write: false,
      format: "esm",
      platform: "browser",
      target: "es2023",
      logLevel: "silent",
      plugins: [redirectPlugin(modelDir())],
    });
  } catch (err) {
    const failure = err as { errors?: { text: string; location?: { file: string; line: number } | null }[] };
    const first = failure.errors?.[0];
    const where = first?.location ? `${first.location.file}:${first.location.line}: ` : "";
    throw new Error(`esbuild cannot bundle ${basename(entry)}: ${where}${first?.text ?? String(err)}`);
  }
  return result.outputFiles[0]!.text;
}
