// The error function in float64, for the exact GELU (JavaScript has no Math.erf).
//
// The algorithm and coefficients are those of Sun's fdlibm `s_erf.c` (the erf of FreeBSD, musl,
// OpenBSD and Java's StrictMath lineage), whose notice is kept below. fdlibm states an error
// below 1 ulp over the whole range; ts_model/tests/erf.test.ts checks it against Python's
// math.erf at 100+ points, including each breakpoint of the piecewise approximation.
//
// ====================================================
// Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
//
// Developed at SunPro, a Sun Microsystems, Inc. business.
// Permission to use, copy, modify, and distribute this
// software is freely granted, provided that this notice
// is preserved.
// ====================================================
//
// Method, for |x| (erf is odd: erf(-x) = -erf(x)):
//   [0, 2^-28):        erf(x) = x + x * efx                      (efx = 2/sqrt(pi) - 1)
//   [2^-28, 0.84375):  erf(x) = x + x * P(x^2) / Q(x^2)
//   [0.84375, 1.25):   erf(x) = erx + P1(s) / Q1(s), s = |x| - 1  (erx = erf(1) rounded to 24 bits)
//   [1.25, 1/0.35):    erf(x) = 1 - exp(-x^2 - 0.5625 + R1(z) / S1(z)) / x,  z = 1/x^2
//   [1/0.35, 6):       erf(x) = 1 - exp(-x^2 - 0.5625 + R2(z) / S2(z)) / x
//   [6, inf]:          erf(x) = 1 (to within 1e-300)
// In the last two rational pieces -x^2 is split as -s^2 + (s - x)(s + x), s = x with its low 32
// bits zeroed, so that s^2 is exact and exp's argument keeps its precision.

const EFX = 1.28379167095512586316e-1;
const EFX8 = 1.02703333676410069053e0;
const ERX = 8.45062911510467529297e-1;
const TINY = 1e-300;

// erf on [0, 0.84375]: x + x * P(z) / Q(z), z = x^2.
const PP0 = 1.28379167095512558561e-1;
const PP1 = -3.25042107247001499370e-1;
const PP2 = -2.84817495755985104766e-2;
const PP3 = -5.77027029648944159157e-3;
const PP4 = -2.37630166566501626084e-5;
const QQ1 = 3.97917223959155352819e-1;
const QQ2 = 6.50222499887672944485e-2;
const QQ3 = 5.08130628187576562776e-3;
const QQ4 = 1.32494738004321644526e-4;
const QQ5 = -3.96022827877536812320e-6;

// erf on [0.84375, 1.25]: erx + P1(s) / Q1(s), s = |x| - 1.
const PA0 = -2.36211856075265944077e-3;
const PA1 = 4.14856118683748331666e-1;
const PA2 = -3.72207876035701323847e-1;
const PA3 = 3.18346619901161753674e-1;
const PA4 = -1.10894694282396677476e-1;
const PA5 = 3.54783043256182359371e-2;
const PA6 = -2.16637559486879084300e-3;
const QA1 = 1.06420880400844228286e-1;
const QA2 = 5.40397917702171048937e-1;
const QA3 = 7.18286544141962662868e-2;
const QA4 = 1.26171219808761642112e-1;
const QA5 = 1.36370839120290507362e-2;
const QA6 = 1.19844998467991074170e-2;

// erfc on [1.25, 1/0.35]: R1(z) / S1(z), z = 1/x^2.
const RA0 = -9.86494403484714822705e-3;
const RA1 = -6.93858572707181764372e-1;
const RA2 = -1.05586262253232909814e1;
const RA3 = -6.23753324503260060396e1;
const RA4 = -1.62396669462573470355e2;
const RA5 = -1.84605092906711035994e2;
const RA6 = -8.12874355063065934246e1;
const RA7 = -9.81432934416914548592e0;
const SA1 = 1.96512716674392571292e1;
const SA2 = 1.37657754143519042600e2;
const SA3 = 4.34565877475229228821e2;
const SA4 = 6.45387271733267880336e2;
const SA5 = 4.29008140027567833386e2;
const SA6 = 1.08635005541779435134e2;
const SA7 = 6.57024977031928170135e0;
const SA8 = -6.04244152148580987438e-2;

// erfc on [1/0.35, 6]: R2(z) / S2(z), z = 1/x^2.
const RB0 = -9.86494292470009928597e-3;
const RB1 = -7.99283237680523006574e-1;
const RB2 = -1.77579549177547519889e1;
const RB3 = -1.60636384855821916062e2;
const RB4 = -6.37566443368389627722e2;
const RB5 = -1.02509513161107724954e3;
const RB6 = -4.83519191608651397019e2;
const SB1 = 3.03380607434824582924e1;
const SB2 = 3.25792512996573918826e2;
const SB3 = 1.53672958608443695994e3;
const SB4 = 3.19985821950859553908e3;
const SB5 = 2.55305040643316442583e3;
const SB6 = 4.74528541206955367215e2;
const SB7 = -2.24409524465858183362e1;

// One float64 seen as two 32-bit words, to read the high word (sign, exponent, top of the
// mantissa) and to clear the low one, as fdlibm does. The word order follows the platform's.
const f64 = new Float64Array(1);
const u32 = new Uint32Array(f64.buffer);
const HI = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1 ? 1 : 0; // little-endian: word 1
const LO = 1 - HI;

function highWord(x: number): number {
  f64[0] = x;
  return u32[HI];
}

function withLowWordCleared(x: number): number {
  f64[0] = x;
  u32[LO] = 0;
  return f64[0];
}

/** erf(x) = 2/sqrt(pi) * integral from 0 to x of exp(-t^2) dt, to within 1 ulp (fdlibm). */
export function erf(x: number): number {
  const hx = highWord(x);
  const ix = hx & 0x7fffffff; // |x|'s high word: the branches below compare magnitudes
  const negative = hx >>> 31 === 1;
  if (ix >= 0x7ff00000) {
    // NaN stays NaN; erf(+-inf) = +-1.
    return Number.isNaN(x) ? x : negative ? -1 : 1;
  }
  if (ix < 0x3feb0000) {
    // |x| < 0.84375
    if (ix < 0x3e300000) {
      // |x| < 2^-28: erf(x) = 2/sqrt(pi) * x to within an ulp
      if (ix < 0x00800000) return 0.125 * (8.0 * x + EFX8 * x); // avoids underflow for subnormal x
      return x + EFX * x;
    }
    const z = x * x;
    const r = PP0 + z * (PP1 + z * (PP2 + z * (PP3 + z * PP4)));
    const s = 1 + z * (QQ1 + z * (QQ2 + z * (QQ3 + z * (QQ4 + z * QQ5))));
    return x + x * (r / s);
  }
  if (ix < 0x3ff40000) {
    // 0.84375 <= |x| < 1.25
    const s = Math.abs(x) - 1;
    const p = PA0 + s * (PA1 + s * (PA2 + s * (PA3 + s * (PA4 + s * (PA5 + s * PA6)))));
    const q = 1 + s * (QA1 + s * (QA2 + s * (QA3 + s * (QA4 + s * (QA5 + s * QA6)))));
    return negative ? -ERX - p / q : ERX + p / q;
  }
  if (ix >= 0x40180000) {
    // |x| >= 6: erf(x) = +-1 (1 - 1e-300 rounds to 1)
    return negative ? TINY - 1 : 1 - TINY;
  }
  const ax = Math.abs(x);
  const s = 1 / (ax * ax);
  let r: number;
  let q: number;
  if (ix < 0x4006db6e) {
    // 1.25 <= |x| < 1/0.35 ~ 2.857
    r = RA0 + s * (RA1 + s * (RA2 + s * (RA3 + s * (RA4 + s * (RA5 + s * (RA6 + s * RA7))))));
    q = 1 + s * (SA1 + s * (SA2 + s * (SA3 + s * (SA4 + s * (SA5 + s * (SA6 + s * (SA7 + s * SA8)))))));
  } else {
    // 1/0.35 <= |x| < 6
    r = RB0 + s * (RB1 + s * (RB2 + s * (RB3 + s * (RB4 + s * (RB5 + s * RB6)))));
    q = 1 + s * (SB1 + s * (SB2 + s * (SB3 + s * (SB4 + s * (SB5 + s * (SB6 + s * SB7))))));
  }
  const z = withLowWordCleared(ax); // z * z is exact
  const e = Math.exp(-z * z - 0.5625) * Math.exp((z - ax) * (z + ax) + r / q);
  return negative ? e / ax - 1 : 1 - e / ax;
}
