// What a browser bundle gets in place of node:fs, node:crypto and node:path (see bundle.mts).
//
// model.ts needs none of them; fixture.ts and safetensors.ts import them for their file-reading
// functions, which the browser code never calls: it fetches the bytes and uses the pure parsers
// (parseFixture, parseSafetensors, paramsFrom). Calling a stub is a bug, said loudly.

function unavailable(name: string): () => never {
  return () => {
    throw new Error(`${name} is not available in the browser`);
  };
}

export const readFileSync = unavailable("node:fs readFileSync");
export const writeFileSync = unavailable("node:fs writeFileSync");
export const createHash = unavailable("node:crypto createHash");

/** node:path's join for the few places that build a file name for an error message. */
export function join(...parts: string[]): string {
  return parts.filter((p) => p !== "").join("/");
}

export const resolve = join;
