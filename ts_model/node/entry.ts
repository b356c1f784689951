// What every Node entry point of ts_model/node/ (run.ts, run-decode.ts, dump.mts, verify-forward.mts) does
// with its arguments and its errors: one line on stderr naming the script, exit code 2 for bad input
// (an unreadable or inconsistent fixture or safetensors file), 1 for anything else.

import { FixtureError } from "../model/fixture.ts";
import { SafetensorsError } from "../model/safetensors.ts";

/** Run `main` on the command-line arguments; a number it returns becomes the exit code. */
export function runMain(script: string, main: (argv: string[]) => number | void): void {
  try {
    const code = main(process.argv.slice(2));
    if (typeof code === "number") process.exitCode = code;
  } catch (err) {
    const message = (err instanceof Error ? err.message : String(err)).replace(/\s+/g, " ");
    process.stderr.write(`${script}: ${message}\n`);
    process.exitCode = err instanceof FixtureError || err instanceof SafetensorsError ? 2 : 1;
  }
}
