;; The matrix products of ../model/model.ts (linearColumns, linearTransposedColumns) in WebAssembly with
;; 128-bit SIMD, for Node. Every output cell is computed as model.ts computes it, bit for bit: a sum that
;; starts at +0 and adds x * w for k = 0, 1, ..., n - 1 in order, each product and each sum rounded to
;; float64 (f64x2.mul, then f64x2.add: no fused multiply-add). The two lanes of a vector are two cells,
;; never two terms of one cell's sum.
;;
;; Pointers are byte offsets into the one shared memory (imported); matrices are row-major float64.
;; This is the source; kernels-wasm.ts holds its assembled bytes. After an edit, `npm run build:kernels`
;; (ts_model/node/build-kernels.mts, with the wabt package) writes kernels-wasm.ts again, and
;; ts_model/tests/kernels.test.ts fails until it has.
(module
  (import "env" "memory" (memory 1 65536 shared))

  ;; ---- linear: o (T, m) = x (T, n) @ w (n, m), columns [j0, j1) ----

  ;; 4 rows x 4 columns: xp = &x[t, 0], wp = &w[0, j], op = &o[t, j]; n8, m8: row strides in bytes.
  (func $lin_4x4 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32) (param $n8 i32) (param $m8 i32)
    (local $k i32) (local $u v128) (local $v v128) (local $s v128)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $b0 v128) (local $b1 v128) (local $b2 v128) (local $b3 v128)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $u (v128.load (local.get $wp)))
      (local.set $v (v128.load offset=16 (local.get $wp)))
      (local.set $s (v128.load64_splat (local.get $xp)))
      (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul (local.get $s) (local.get $u))))
      (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul (local.get $s) (local.get $v))))
      (local.set $s (v128.load64_splat (i32.add (local.get $xp) (local.get $n8))))
      (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul (local.get $s) (local.get $u))))
      (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul (local.get $s) (local.get $v))))
      (local.set $s (v128.load64_splat (i32.add (local.get $xp) (i32.shl (local.get $n8) (i32.const 1)))))
      (local.set $a2 (f64x2.add (local.get $a2) (f64x2.mul (local.get $s) (local.get $u))))
      (local.set $b2 (f64x2.add (local.get $b2) (f64x2.mul (local.get $s) (local.get $v))))
      (local.set $s (v128.load64_splat (i32.add (local.get $xp) (i32.mul (local.get $n8) (i32.const 3)))))
      (local.set $a3 (f64x2.add (local.get $a3) (f64x2.mul (local.get $s) (local.get $u))))
      (local.set $b3 (f64x2.add (local.get $b3) (f64x2.mul (local.get $s) (local.get $v))))
      (local.set $wp (i32.add (local.get $wp) (local.get $m8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    (v128.store (local.get $op) (local.get $a0))
    (v128.store offset=16 (local.get $op) (local.get $b0))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (v128.store (local.get $op) (local.get $a1))
    (v128.store offset=16 (local.get $op) (local.get $b1))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (v128.store (local.get $op) (local.get $a2))
    (v128.store offset=16 (local.get $op) (local.get $b2))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (v128.store (local.get $op) (local.get $a3))
    (v128.store offset=16 (local.get $op) (local.get $b3)))

  ;; 1 row x 4 columns.
  (func $lin_1x4 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32) (param $m8 i32)
    (local $k i32) (local $s v128) (local $a v128) (local $b v128)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $s (v128.load64_splat (local.get $xp)))
      (local.set $a (f64x2.add (local.get $a) (f64x2.mul (local.get $s) (v128.load (local.get $wp)))))
      (local.set $b (f64x2.add (local.get $b) (f64x2.mul (local.get $s) (v128.load offset=16 (local.get $wp)))))
      (local.set $wp (i32.add (local.get $wp) (local.get $m8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    (v128.store (local.get $op) (local.get $a))
    (v128.store offset=16 (local.get $op) (local.get $b)))

  ;; 1 row x 1 column, scalar.
  (func $lin_1x1 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32) (param $m8 i32)
    (local $k i32) (local $a f64)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $a (f64.add (local.get $a) (f64.mul (f64.load (local.get $xp)) (f64.load (local.get $wp)))))
      (local.set $wp (i32.add (local.get $wp) (local.get $m8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    (f64.store (local.get $op) (local.get $a)))

  ;; Columns [j0, j1) of o = x @ w: four columns at a time (the strip of w they read stays in cache
  ;; while every row of x passes over it), four rows at a time within them.
  (func (export "linear") (param $x i32) (param $w i32) (param $o i32) (param $T i32) (param $n i32) (param $m i32)
    (param $j0 i32) (param $j1 i32)
    (local $j i32) (local $t i32) (local $n8 i32) (local $m8 i32) (local $width i32)
    (local.set $n8 (i32.shl (local.get $n) (i32.const 3)))
    (local.set $m8 (i32.shl (local.get $m) (i32.const 3)))
    (local.set $j (local.get $j0))
    (block $j_done (loop $j_loop
      (br_if $j_done (i32.ge_u (local.get $j) (local.get $j1)))
      (local.set $width (select (i32.const 4) (i32.const 1)
        (i32.le_u (i32.add (local.get $j) (i32.const 4)) (local.get $j1))))
      (local.set $t (i32.const 0))
      (block $t_done (loop $t_loop
        (br_if $t_done (i32.ge_u (local.get $t) (local.get $T)))
        (if (i32.eq (local.get $width) (i32.const 4))
          (then
            (if (i32.le_u (i32.add (local.get $t) (i32.const 4)) (local.get $T))
              (then
                (call $lin_4x4
                  (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $n8)))
                  (i32.add (local.get $w) (i32.shl (local.get $j) (i32.const 3)))
                  (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (local.get $t) (local.get $m)) (local.get $j)) (i32.const 3)))
                  (local.get $n) (local.get $n8) (local.get $m8))
                (local.set $t (i32.add (local.get $t) (i32.const 4))))
              (else
                (call $lin_1x4
                  (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $n8)))
                  (i32.add (local.get $w) (i32.shl (local.get $j) (i32.const 3)))
                  (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (local.get $t) (local.get $m)) (local.get $j)) (i32.const 3)))
                  (local.get $n) (local.get $m8))
                (local.set $t (i32.add (local.get $t) (i32.const 1))))))
          (else
            (call $lin_1x1
              (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $n8)))
              (i32.add (local.get $w) (i32.shl (local.get $j) (i32.const 3)))
              (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (local.get $t) (local.get $m)) (local.get $j)) (i32.const 3)))
              (local.get $n) (local.get $m8))
            (local.set $t (i32.add (local.get $t) (i32.const 1)))))
        (br $t_loop)))
      (local.set $j (i32.add (local.get $j) (local.get $width)))
      (br $j_loop))))

  ;; ---- linearTransposed: o (T, m) = x (T, n) @ w^T for w (m, n), columns [j0, j1) ----

  ;; 4 rows x 4 words: xp = &x[t, 0], wp = &w[j, 0], op = &o[t, j]. The lanes are two rows: [x[t, k], x[t+1, k]].
  (func $lt_4x4 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32) (param $n8 i32) (param $m8 i32)
    (local $k i32) (local $p v128) (local $q v128) (local $s v128)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $b0 v128) (local $b1 v128) (local $b2 v128) (local $b3 v128)
    (local $x2 i32) (local $w2 i32)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $x2 (i32.add (local.get $xp) (i32.shl (local.get $n8) (i32.const 1))))
      (local.set $p (f64x2.replace_lane 1 (v128.load64_splat (local.get $xp))
        (f64.load (i32.add (local.get $xp) (local.get $n8)))))
      (local.set $q (f64x2.replace_lane 1 (v128.load64_splat (local.get $x2))
        (f64.load (i32.add (local.get $x2) (local.get $n8)))))
      (local.set $s (v128.load64_splat (local.get $wp)))
      (local.set $a0 (f64x2.add (local.get $a0) (f64x2.mul (local.get $p) (local.get $s))))
      (local.set $b0 (f64x2.add (local.get $b0) (f64x2.mul (local.get $q) (local.get $s))))
      (local.set $s (v128.load64_splat (i32.add (local.get $wp) (local.get $n8))))
      (local.set $a1 (f64x2.add (local.get $a1) (f64x2.mul (local.get $p) (local.get $s))))
      (local.set $b1 (f64x2.add (local.get $b1) (f64x2.mul (local.get $q) (local.get $s))))
      (local.set $w2 (i32.add (local.get $wp) (i32.shl (local.get $n8) (i32.const 1))))
      (local.set $s (v128.load64_splat (local.get $w2)))
      (local.set $a2 (f64x2.add (local.get $a2) (f64x2.mul (local.get $p) (local.get $s))))
      (local.set $b2 (f64x2.add (local.get $b2) (f64x2.mul (local.get $q) (local.get $s))))
      (local.set $s (v128.load64_splat (i32.add (local.get $w2) (local.get $n8))))
      (local.set $a3 (f64x2.add (local.get $a3) (f64x2.mul (local.get $p) (local.get $s))))
      (local.set $b3 (f64x2.add (local.get $b3) (f64x2.mul (local.get $q) (local.get $s))))
      (local.set $wp (i32.add (local.get $wp) (i32.const 8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    ;; a_i holds rows t, t+1 of word j+i; b_i rows t+2, t+3
    (f64.store (local.get $op) (f64x2.extract_lane 0 (local.get $a0)))
    (f64.store offset=8 (local.get $op) (f64x2.extract_lane 0 (local.get $a1)))
    (f64.store offset=16 (local.get $op) (f64x2.extract_lane 0 (local.get $a2)))
    (f64.store offset=24 (local.get $op) (f64x2.extract_lane 0 (local.get $a3)))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (f64.store (local.get $op) (f64x2.extract_lane 1 (local.get $a0)))
    (f64.store offset=8 (local.get $op) (f64x2.extract_lane 1 (local.get $a1)))
    (f64.store offset=16 (local.get $op) (f64x2.extract_lane 1 (local.get $a2)))
    (f64.store offset=24 (local.get $op) (f64x2.extract_lane 1 (local.get $a3)))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (f64.store (local.get $op) (f64x2.extract_lane 0 (local.get $b0)))
    (f64.store offset=8 (local.get $op) (f64x2.extract_lane 0 (local.get $b1)))
    (f64.store offset=16 (local.get $op) (f64x2.extract_lane 0 (local.get $b2)))
    (f64.store offset=24 (local.get $op) (f64x2.extract_lane 0 (local.get $b3)))
    (local.set $op (i32.add (local.get $op) (local.get $m8)))
    (f64.store (local.get $op) (f64x2.extract_lane 1 (local.get $b0)))
    (f64.store offset=8 (local.get $op) (f64x2.extract_lane 1 (local.get $b1)))
    (f64.store offset=16 (local.get $op) (f64x2.extract_lane 1 (local.get $b2)))
    (f64.store offset=24 (local.get $op) (f64x2.extract_lane 1 (local.get $b3))))

  ;; 1 row x 4 words. The lanes are two words: [w[j, k], w[j+1, k]].
  (func $lt_1x4 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32) (param $n8 i32)
    (local $k i32) (local $s v128) (local $a v128) (local $b v128) (local $w2 i32)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $s (v128.load64_splat (local.get $xp)))
      (local.set $w2 (i32.add (local.get $wp) (i32.shl (local.get $n8) (i32.const 1))))
      (local.set $a (f64x2.add (local.get $a) (f64x2.mul (local.get $s)
        (f64x2.replace_lane 1 (v128.load64_splat (local.get $wp)) (f64.load (i32.add (local.get $wp) (local.get $n8)))))))
      (local.set $b (f64x2.add (local.get $b) (f64x2.mul (local.get $s)
        (f64x2.replace_lane 1 (v128.load64_splat (local.get $w2)) (f64.load (i32.add (local.get $w2) (local.get $n8)))))))
      (local.set $wp (i32.add (local.get $wp) (i32.const 8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    (v128.store (local.get $op) (local.get $a))
    (v128.store offset=16 (local.get $op) (local.get $b)))

  ;; 1 row x 1 word, scalar.
  (func $lt_1x1 (param $xp i32) (param $wp i32) (param $op i32) (param $n i32)
    (local $k i32) (local $a f64)
    (block $done (loop $k_loop
      (br_if $done (i32.ge_u (local.get $k) (local.get $n)))
      (local.set $a (f64.add (local.get $a) (f64.mul (f64.load (local.get $xp)) (f64.load (local.get $wp)))))
      (local.set $wp (i32.add (local.get $wp) (i32.const 8)))
      (local.set $xp (i32.add (local.get $xp) (i32.const 8)))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $k_loop)))
    (f64.store (local.get $op) (local.get $a)))

  ;; Columns (words) [j0, j1) of o = x @ w^T: four rows of x at a time (they stay in cache), four words
  ;; within them; the rows left over one at a time.
  (func (export "linearTransposed") (param $x i32) (param $w i32) (param $o i32) (param $T i32) (param $n i32)
    (param $m i32) (param $j0 i32) (param $j1 i32)
    (local $j i32) (local $t i32) (local $n8 i32) (local $m8 i32) (local $rows i32) (local $r i32)
    (local.set $n8 (i32.shl (local.get $n) (i32.const 3)))
    (local.set $m8 (i32.shl (local.get $m) (i32.const 3)))
    (local.set $t (i32.const 0))
    (block $t_done (loop $t_loop
      (br_if $t_done (i32.ge_u (local.get $t) (local.get $T)))
      (local.set $rows (select (i32.const 4) (i32.const 1)
        (i32.le_u (i32.add (local.get $t) (i32.const 4)) (local.get $T))))
      (local.set $j (local.get $j0))
      (block $j_done (loop $j_loop
        (br_if $j_done (i32.ge_u (local.get $j) (local.get $j1)))
        (if (i32.le_u (i32.add (local.get $j) (i32.const 4)) (local.get $j1))
          (then
            (if (i32.eq (local.get $rows) (i32.const 4))
              (then
                (call $lt_4x4
                  (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $n8)))
                  (i32.add (local.get $w) (i32.mul (local.get $j) (local.get $n8)))
                  (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (local.get $t) (local.get $m)) (local.get $j)) (i32.const 3)))
                  (local.get $n) (local.get $n8) (local.get $m8)))
              (else
                (call $lt_1x4
                  (i32.add (local.get $x) (i32.mul (local.get $t) (local.get $n8)))
                  (i32.add (local.get $w) (i32.mul (local.get $j) (local.get $n8)))
                  (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (local.get $t) (local.get $m)) (local.get $j)) (i32.const 3)))
                  (local.get $n) (local.get $n8))))
            (local.set $j (i32.add (local.get $j) (i32.const 4))))
          (else
            ;; a word left over: each of the block's rows alone
            (local.set $r (i32.const 0))
            (block $r_done (loop $r_loop
              (br_if $r_done (i32.ge_u (local.get $r) (local.get $rows)))
              (call $lt_1x1
                (i32.add (local.get $x) (i32.mul (i32.add (local.get $t) (local.get $r)) (local.get $n8)))
                (i32.add (local.get $w) (i32.mul (local.get $j) (local.get $n8)))
                (i32.add (local.get $o) (i32.shl (i32.add (i32.mul (i32.add (local.get $t) (local.get $r)) (local.get $m)) (local.get $j)) (i32.const 3)))
                (local.get $n))
              (local.set $r (i32.add (local.get $r) (i32.const 1)))
              (br $r_loop)))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))))
        (br $j_loop)))
      (local.set $t (i32.add (local.get $t) (local.get $rows)))
      (br $t_loop))))
)
