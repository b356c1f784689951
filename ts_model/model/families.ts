// Model families as data: each tap's name, shape, axes, rows axis, bounds and layer, read from the family's table
// (reference/parity_reference/families/{family}.json, here as the generated family-{family}.ts). The mirror of
// reference/parity_reference/families.py's questions the model asks: the tap list and the axis `rows` cuts.

import { GPT2_FAMILY } from "./family-gpt2.ts";

/** One row of a family's table: a tap pattern ("blocks.{i}.attn.hook_q") and its facts. */
export interface TapSpec {
  readonly name: string;
  readonly shape: readonly (number | string)[];
  readonly axes: readonly string[];
  readonly rows: string | null;
  readonly bounds: string | null;
  readonly layer: string | null;
  readonly sublayer: string | null;
}

/** A family's table: what each placeholder counts over ({"i": "n_layer", "k": "n_layer + 1"}) and its taps. */
export interface FamilyTable {
  readonly family: string;
  readonly indices: Readonly<Record<string, string>>;
  readonly taps: readonly TapSpec[];
}

/** The lesson's family: the one model.ts implements. */
export const GPT2 = GPT2_FAMILY;

function placeholder(name: string): string | null {
  const match = /\{([a-z])\}/.exec(name);
  return match === null ? null : match[1]!;
}

/** How many values a placeholder takes: "n_layer" or "n_layer + 1", for a model of `nLayer` blocks. */
function count(expr: string, nLayer: number): number {
  const match = /^n_layer(?: \+ (\d+))?$/.exec(expr);
  if (match === null) throw new Error(`a family index over ${JSON.stringify(expr)} is not n_layer [+ k]`);
  return nLayer + Number(match[1] ?? 0);
}

/** Every tap name for a model of `nLayer` blocks, in dataflow order: a run of taps with one placeholder repeats
 *  together, block by block (families.py `Family.tap_names`). */
export function familyTapNames(family: FamilyTable, nLayer: number): string[] {
  const names: string[] = [];
  const taps = family.taps;
  for (let start = 0; start < taps.length; ) {
    const v = placeholder(taps[start]!.name);
    let end = start + 1;
    while (end < taps.length && placeholder(taps[end]!.name) === v) end++;
    const group = taps.slice(start, end);
    if (v === null) {
      names.push(...group.map((t) => t.name));
    } else {
      for (let n = 0; n < count(family.indices[v]!, nLayer); n++) {
        names.push(...group.map((t) => t.name.replace(`{${v}}`, String(n))));
      }
    }
    start = end;
  }
  return names;
}

/** The table row of a concrete tap name ("blocks.1.attn.hook_q" is "blocks.{i}.attn.hook_q"). */
export function tapSpec(family: FamilyTable, tap: string): TapSpec {
  for (const spec of family.taps) {
    const pattern = spec.name.split(/\{[a-z]\}/).map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("(0|[1-9][0-9]*)");
    if (new RegExp(`^${pattern}$`).test(tap)) return spec;
  }
  throw new Error(`tap '${tap}' is not a tap of the ${family.family} family`);
}

/** The axis a fixture's `rows` cuts (the position axis), or null when rows cannot cut the tap. */
export function rowsAxis(family: FamilyTable, tap: string): number | null {
  const spec = tapSpec(family, tap);
  return spec.rows === null ? null : spec.axes.indexOf(spec.rows);
}
