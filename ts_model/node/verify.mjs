// The Node-only check, runnable by any Node: `node ts_model/node/verify.mjs [FIXTURE_DIR]`.
//
// Plain JavaScript on purpose: it starts on the Node most systems have (Debian 12's Node 20), and
// where that Node cannot run TypeScript it says so in one line (exit 2) instead of a stack trace.
// Running .ts files needs Node >= 22.18 (or >= 23.6), where type stripping is on by default.
// Otherwise it runs verify-forward.mts, which compares model.ts with the fixture's golden files.

const NEEDS = "Node >= 22.18 with type stripping on";
const HINT = "use the Node that pip installs: `pip install 'parity-harness[node]'` then `parity verify-ts`";

try {
  await import("./verify-forward.mts");
} catch (error) {
  if (error && error.code === "ERR_UNKNOWN_FILE_EXTENSION") {
    console.error(`verify: error: this Node (${process.version}) cannot run the TypeScript model; it needs ${NEEDS}: ${HINT}`);
    process.exitCode = 2;
  } else {
    throw error;
  }
}
