// The globals the model's files may use beyond ECMAScript 2023 (./tsconfig.json has `"lib": ["es2023"]`
// and `"types": []`): the WHATWG Encoding API, which every runtime the model runs in has (Node, the
// browsers, Deno, Bun). Declared here, as much of it as safetensors.ts uses, so that anything else a
// runtime adds (Node's `process`, `Buffer`, `node:*`; the DOM's `document`, `fetch`) is a type error
// in the model. The repository's tsconfig.json leaves this file out: there the DOM and @types/node
// declare the same names in full.

interface TextDecoder {
  decode(input?: Uint8Array): string;
}
declare var TextDecoder: {
  new (label?: string, options?: { fatal?: boolean; ignoreBOM?: boolean }): TextDecoder;
};

interface TextEncoder {
  encode(input?: string): Uint8Array<ArrayBuffer>;
}
declare var TextEncoder: {
  new (): TextEncoder;
};
