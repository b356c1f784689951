// A short-lived static server on 127.0.0.1 (an ephemeral port) for one browser run.
//
// It answers only the exact paths it was given (a Map from URL path to content): no directory
// listing, no path is ever joined to a file system path, so nothing outside them can be read.
// Every response carries the cross-origin isolation headers, so WebAssembly needs nothing more.

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

export interface Resource {
  readonly type: string; // Content-Type
  readonly body: () => Uint8Array | string; // read when asked for
}

export interface StaticServer {
  readonly origin: string; // http://127.0.0.1:PORT
  close(): Promise<void>;
}

export const CONTENT_TYPES: Readonly<Record<string, string>> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
  ".safetensors": "application/octet-stream",
  ".onnx": "application/octet-stream",
  ".png": "image/png",
};

export function contentType(name: string): string {
  const dot = name.lastIndexOf(".");
  return (dot >= 0 ? CONTENT_TYPES[name.slice(dot)] : undefined) ?? "application/octet-stream";
}

export async function serve(resources: ReadonlyMap<string, Resource>): Promise<StaticServer> {
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://127.0.0.1").pathname;
    const resource = req.method === "GET" || req.method === "HEAD" ? resources.get(path) : undefined;
    if (resource === undefined) {
      res.writeHead(404, { "Content-Type": "text/plain" }).end("not found\n");
      return;
    }
    let body: Uint8Array | string;
    try {
      body = resource.body();
    } catch (err) {
      res.writeHead(500, { "Content-Type": "text/plain" }).end(`${err instanceof Error ? err.message : String(err)}\n`);
      return;
    }
    res.writeHead(200, {
      "Content-Type": resource.type,
      "Cache-Control": "no-store",
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin",
    });
    res.end(req.method === "HEAD" ? undefined : body);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    origin: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
