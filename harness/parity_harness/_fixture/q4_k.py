"""A Q4_K quantizer in NumPy: float32 rows to ggml's `block_q4_K` bytes (the `gguf` package has none).

A block holds 256 values in 144 bytes (ggml-common.h): `ggml_half d; ggml_half dmin; uint8_t scales[12];
uint8_t qs[128]`. Its 8 sub-blocks of 32 values each have a 6-bit scale `sc` and a 6-bit min `m`, packed in
`scales` as ggml's `get_scale_min_k4` reads them; a value is `d*sc*q - dmin*m` with `q` in 0..15, and `qs` holds,
for each 64-value chunk `j`, `q[64j+l]` in byte `l`'s low nibble and `q[64j+32+l]` in its high one.

The search is ggml's reference `quantize_row_q4_K_ref` (ggml-quants.c; what `ggml_quantize_chunk` runs without
an importance matrix), vectorized over every sub-block at once: `make_qkx2_quants` (weights `rms(x) + |x|`; 21
candidate scales `(14 + 0.1 i)/(max - min)`, each refit by weighted least squares, the lowest weighted squared
error kept; as in ggml, the candidates after a refit start from the refit's min), then `d = max(scale)/63` and
`dmin = max(min)/63` as float16, the 6-bit codes rounded against them, and every `q` re-rounded against the
stored scale and min. The arithmetic is ggml's: float32, rounding to nearest with ties to even (`nearest_int`),
every sum added in ggml's order (NumPy's pairwise sums round differently, and a near-tie then picks another
candidate). So the bytes are ggml's own, block for block (tests/fixture/test_q4_k.py checks them against
llama-cpp-python's libggml-base); a sub-block whose 6-bit scale rounds to 0 keeps the search's codes, as ggml's
do (they dequantize to the same value, `-dmin*m`).

Deterministic (no randomness; a block depends on its own 256 values only). An all-zero block is all-zero bytes
(`d = dmin = 0`, `q = 0`, no division by zero). Where ggml would store an infinite float16 `d` or `dmin` (a
sub-block range beyond ~6e7) they are clamped to float16's largest finite value, so every block dequantizes to
finite values (such values saturate). Non-finite inputs, and rows not a multiple of 256 values, are refused
(`ValueError`).
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # values per block
BLOCK_BYTES = 144  # 2 (d) + 2 (dmin) + 12 (scales) + 128 (qs)
_SUB = 32  # values per sub-block
_NMAX = 15  # largest 4-bit code
_F16_MAX = np.float32(np.finfo(np.float16).max)


def _nearest(values: np.ndarray, top: int) -> np.ndarray:
    """Round to nearest (ties to even, as ggml's `nearest_int`) and clip to 0..top, as uint8."""
    codes: np.ndarray = np.clip(np.rint(values), 0, top).astype(np.uint8)
    return codes


def _sum(values: np.ndarray) -> np.ndarray:
    """values [32, n] -> [n]: the sum over the first axis in ggml's order, one float32 addition at a time, written
    out (NumPy's sum over a row is pairwise: another rounding, which turns near-ties into other choices)."""
    total: np.ndarray = values[0].copy()  # [n]
    for row in values[1:]:
        total += row
    return total


def _make_qkx2_quants(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's `make_qkx2_quants(32, 15, x, weights, ..., rmin=-1, rdelta=0.1, nstep=20, use_mad=false)` on every
    sub-block at once. x: float32 [32, n], a sub-block per column (so that every sum runs in ggml's order).
    Returns (scale [n], min [n] >= 0, q uint8 [32, n]), x ~= scale*q - min."""
    f32 = np.float32
    weights = np.sqrt(_sum(x * x) / f32(_SUB)) + np.abs(x)  # [32, n]
    lo = np.minimum(x.min(axis=0), f32(0))  # [n]
    hi = x.max(axis=0)  # [n]
    flat = hi == lo  # [n]: every q = 0, the value is the min
    sum_w = _sum(weights)  # [n]
    sum_x = _sum(weights * x)  # [n]

    iscale = f32(_NMAX) / np.where(flat, f32(1), hi - lo)  # [n]
    scale = f32(1) / iscale  # [n]
    mins = lo  # [n], <= 0 (ggml's `min`; returned negated)
    q = _nearest(iscale * (x - lo), _NMAX)  # [32, n]
    best = _sum(weights * np.square(scale * q.astype(f32) + mins - x))  # [n]
    for step in range(21):
        # as ggml: the candidates are taken from the min kept so far (a refit moves it), not the data's
        span = hi - mins  # [n]
        usable = ~flat & (span > 0)  # [n]
        iscale = (f32(-1) + f32(0.1) * f32(step) + f32(_NMAX)) / np.where(usable, span, f32(1))  # [n]
        codes = _nearest(iscale * (x - mins), _NMAX)  # [32, n]
        cand = codes.astype(f32)  # [32, n]
        wq = weights * cand  # [32, n]
        sum_l = _sum(wq)  # [n]
        sum_l2 = _sum(wq * cand)  # [n]
        sum_xl = _sum(wq * x)  # [n]
        det = sum_w * sum_l2 - sum_l * sum_l  # [n]
        fits = det > 0  # [n]
        safe_det = np.where(fits, det, f32(1))  # [n]
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_det  # [n]
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_det  # [n]
        positive = this_min > 0  # [n]: a min above 0 is not allowed; refit the scale alone
        this_scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, f32(1)), this_scale)  # [n]
        this_min = np.where(positive, f32(0), this_min)  # [n]
        err = _sum(weights * np.square(this_scale * cand + this_min - x))  # [n]
        take = usable & fits & (err < best)  # [n]
        best = np.where(take, err, best)
        scale = np.where(take, this_scale, scale)
        mins = np.where(take, this_min, mins)
        q = np.where(take, codes, q)  # [32, n]
    scale = np.where(flat, f32(0), scale)  # [n]
    q = np.where(flat, np.uint8(0), q)  # [32, n]
    return scale.astype(f32), (-mins).astype(f32), q


def _super_scale(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block: the float16 super-scale max/63 (clamped finite) and the 6-bit codes of its 8 sub-values.
    values: float32 [nb, 8], >= 0. Returns (d float16 [nb], codes uint8 [nb, 8])."""
    f32 = np.float32
    top = np.maximum(values.max(axis=-1), f32(0))  # [nb]
    inv = np.where(top > 0, f32(63) / np.where(top > 0, top, f32(1)), f32(0))  # [nb]
    codes = np.clip(np.rint(inv[:, None] * values), 0, 63).astype(np.uint8)  # [nb, 8]
    d = np.minimum(top / f32(63), _F16_MAX).astype(np.float16)  # [nb]
    return d, codes


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """float32 [..., k] (k a multiple of 256) -> uint8 [..., k // 256 * 144], ggml's `block_q4_K` bytes, which
    `gguf.quants.dequantize(data, GGMLQuantizationType.Q4_K)` and llama.cpp read back."""
    x = np.asarray(rows, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK_K:
        raise ValueError(f"q4_k: a row of {x.shape[-1] if x.ndim else 0} values is not a multiple of {QK_K}")
    if not np.isfinite(x).all():
        raise ValueError("q4_k: the values to quantize are not all finite")
    lead = x.shape[:-1]
    nb = x.size // QK_K
    sub = x.reshape(nb * 8, _SUB)  # [nb*8, 32]
    scale, mins, first = _make_qkx2_quants(np.ascontiguousarray(sub.T))  # [nb*8], [nb*8], [32, nb*8]
    d, ls = _super_scale(scale.reshape(nb, 8))  # [nb], [nb, 8]
    dmin, lm = _super_scale(mins.reshape(nb, 8))  # [nb], [nb, 8]

    # every q against the stored scale and min: x ~= (d*sc)*q - dmin*m
    sub_d = (d.astype(np.float32)[:, None] * ls.astype(np.float32)).reshape(nb * 8, 1)  # [nb*8, 1]
    sub_m = (dmin.astype(np.float32)[:, None] * lm.astype(np.float32)).reshape(nb * 8, 1)  # [nb*8, 1]
    # a sub-block whose scale is stored as 0 (d*sc = 0: all-zero or flat, or tiny next to the block's largest)
    # keeps the search's codes, as ggml does: they dequantize to the same -dmin*m (0 for an all-zero block)
    live = sub_d != 0  # [nb*8, 1]
    codes = _nearest((sub + sub_m) / np.where(live, sub_d, np.float32(1)), _NMAX)  # [nb*8, 32]
    q = np.where(live, codes, first.T)  # [nb*8, 32]

    out = np.empty((nb, BLOCK_BYTES), dtype=np.uint8)  # [nb, 144]
    out[:, 0:2] = d.astype("<f2").reshape(nb, 1).view(np.uint8)
    out[:, 2:4] = dmin.astype("<f2").reshape(nb, 1).view(np.uint8)
    # scales[12], as get_scale_min_k4 reads them: j < 4 in bytes j (sc) and j+4 (m), low 6 bits;
    # j >= 4 split: low 4 bits in byte j+4 (sc low nibble, m high nibble), high 2 bits in bytes j-4 and j (top bits)
    out[:, 4:8] = (ls[:, :4] & 63) | ((ls[:, 4:] >> 4) << 6)
    out[:, 8:12] = (lm[:, :4] & 63) | ((lm[:, 4:] >> 4) << 6)
    out[:, 12:16] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    # qs[128]: chunk j of 64 values -> 32 bytes, q[64j+l] low nibble, q[64j+32+l] high nibble
    chunks = q.reshape(nb, 4, 2, _SUB)  # [nb, 4, 2, 32]
    out[:, 16:] = (chunks[:, :, 0, :] | (chunks[:, :, 1, :] << 4)).reshape(nb, 128)
    return out.reshape(*lead, x.shape[-1] // QK_K * BLOCK_BYTES)
