// The WebAssembly matrix products (kernels.wat, assembled in kernels-wasm.ts) and the memory they work
// in: one shared WebAssembly.Memory, which every thread's instance of the module imports, and a bump
// allocator over it for the parameters and the products' scratch arrays.
//
// The kernels compute each output cell as model.ts's linearColumns and linearTransposedColumns do, bit
// for bit (kernels.wat's header says how); two cells per 128-bit vector and 4 x 4 tiles of cells held in
// registers make them 3 to 5 times as fast as the JavaScript ones at GPT-2 size.

import { KERNELS_WASM_BASE64 } from "./kernels-wasm.ts";

const PAGE_BYTES = 65536;
/** wasm32's limit: 65536 pages, 4 GiB. */
const MAX_PAGES = 65536;

/** One product over columns [j0, j1); x, w and o are byte offsets into the memory. */
export type Kernel = (x: number, w: number, o: number, T: number, n: number, m: number, j0: number, j1: number) => void;

/** The module's two kernels, named as model.ts's ProductKind. */
export interface Kernels {
  linear: Kernel;
  linearTransposed: Kernel;
}

let compiled: WebAssembly.Module | null = null;

/** The compiled module (compiled once per thread). */
export function kernelModule(): WebAssembly.Module {
  compiled ??= new WebAssembly.Module(Buffer.from(KERNELS_WASM_BASE64, "base64"));
  return compiled;
}

/** An instance of the kernels over `memory`. */
export function instantiateKernels(memory: WebAssembly.Memory, module: WebAssembly.Module = kernelModule()): Kernels {
  const exports = new WebAssembly.Instance(module, { env: { memory } }).exports;
  return { linear: exports.linear as Kernel, linearTransposed: exports.linearTransposed as Kernel };
}

/** Float64 arrays in one shared memory. Nothing is freed: the parameters live as long as the process,
 * and the scratch arrays are reused, a larger one taken when a product needs it. */
export class WasmHeap {
  readonly memory = new WebAssembly.Memory({ initial: 1, maximum: MAX_PAGES, shared: true });
  private top = 0; // bytes handed out
  private readonly owned = new WeakSet<Float64Array>();
  private readonly scratchArrays = new Map<string, Float64Array>();

  /** `length` zeros in the memory, or null when the memory cannot grow that far (wasm32's 4 GiB). */
  tryAlloc(length: number): Float64Array | null {
    const start = Math.ceil(this.top / 16) * 16;
    const end = start + length * Float64Array.BYTES_PER_ELEMENT;
    const have = this.memory.buffer.byteLength;
    if (end > have) {
      const pages = Math.ceil((end - have) / PAGE_BYTES);
      if (have / PAGE_BYTES + pages > MAX_PAGES) return null;
      try {
        this.memory.grow(pages);
      } catch {
        return null; // the system refused the memory
      }
    }
    this.top = end;
    const array = new Float64Array(this.memory.buffer, start, length);
    this.owned.add(array);
    return array;
  }

  /** Whether `a` is one of this heap's arrays (its byteOffset is then an address in the memory). */
  owns(a: Float64Array): boolean {
    return this.owned.has(a);
  }

  /** An array of at least `length` in the memory under `name`, its contents left over from its last use;
   * null when the memory is full. */
  scratch(name: string, length: number): Float64Array | null {
    const have = this.scratchArrays.get(name);
    if (have !== undefined && have.length >= length) return have;
    const made = this.tryAlloc(Math.max(length, 2 * (have?.length ?? 0)));
    if (made !== null) this.scratchArrays.set(name, made);
    return made;
  }
}
