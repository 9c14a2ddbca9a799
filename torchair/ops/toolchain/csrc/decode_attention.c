/* Decode attention on the CPU: one query token per (batch, kv head) row attends to its KV window.
 *
 * The native half of torchair/ops/attention/cpu/decode.py (which prepares the arguments: the query
 * is already scaled, int8 antiquant scales folded in, the windows computed). Built on first use by
 * torchair/ops/toolchain/native.py with the host compiler (-O3 -march=native -fopenmp) and called
 * through ctypes, which releases the GIL.
 *
 * Per row r = b * nkv + h (b-major) the G query heads of kv head h read each K and V row once:
 *   scores  S[g][n] = q[g] . k[n]            positions x heads register tile, fp32 FMAs,
 *                                            one transposing tree reduction per tile
 *   softmax          running max / sum per head (float32)
 *   output  acc[g]  += p[g][n] * v[n]         heads x dims register tile
 * Work items are (sequence b, split of its window) pairs run on nthreads OpenMP threads; an item
 * computes every kv head of b in one pass, tile by tile (fused_*): a tile's K rows (all kv heads
 * of a position together: in BSH / BSND one contiguous run), scores, softmax and V rows, with the
 * rows a few positions on prefetched, so K and V stream side by side while the tile computes.
 * Larger query-head groups (G x D > 512) and bfloat16 K/V with the AVX512-BF16 dot product
 * (qkdot_*) go chunk by chunk instead (attend, see chunked()): the scores of a chunk, its softmax,
 * then its output. Splits of one row are merged with their maxima at the end; results depend on
 * the shapes and the number of splits only, never on the thread that ran an item.
 * K/V elements are float32, bfloat16, float16 or int8 (converted to float32 in registers).
 * Positions are addressed densely (base + b*sb + h*sh + p*sp) or through a block table
 * (base + table[b][p/bs]*sblk + h*sh + (p%bs)*sp); the head dimension must be contiguous and a
 * multiple of 16.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>

/* VW floats per vector: 16 (one zmm) where the target has AVX-512, else 8 (one ymm). The tiles
 * below keep VW accumulators live; with 16-float vectors on an AVX2 target every accumulator
 * would take two of its 16 ymm registers and the tiles would spill (measured ~10x slower). */
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float v16 __attribute__((vector_size(4 * VW)));
typedef float v16u __attribute__((vector_size(4 * VW), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(4 * VW)));
typedef uint16_t vh16u __attribute__((vector_size(2 * VW), aligned(2)));
typedef uint32_t vu16 __attribute__((vector_size(4 * VW)));
typedef _Float16 vf16u __attribute__((vector_size(2 * VW), aligned(2)));
typedef int8_t vb16u __attribute__((vector_size(VW), aligned(1)));

enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_F16 = 2, KIND_I8 = 3 };
#ifndef KAHEAD
#define KAHEAD 16
#endif
#define CH 256          /* positions per chunk: S is G x CH floats */
#define MAX_G 64
#define MAX_D 512

static inline v16 load_f32(const void *p) { return *(const v16u *)p; }
static inline v16 load_bf16(const void *p) {
    vu16 w = __builtin_convertvector(*(const vh16u *)p, vu16) << 16;
    return (v16)w;
}
static inline v16 load_f16(const void *p) {
    return __builtin_convertvector(*(const vf16u *)p, v16);
}
static inline v16 load_i8(const void *p) { return __builtin_convertvector(*(const vb16u *)p, v16); }

static inline v16 vsel(vi16 m, v16 a, v16 b) { return (v16)((m & (vi16)a) | (~m & (vi16)b)); }
static inline v16 vmax(v16 a, v16 b) { return vsel(a > b, a, b); }

/* exp(x) for x <= 0, exactly 0 below -87: 2^(x log2 e) = 2^n 2^f with n = round(x log2 e),
 * the degree-6 Taylor polynomial of 2^f on [-0.5, 0.5] (relative error < 2e-7) and 2^n put in the
 * exponent bits. */
static inline v16 vexp(v16 x) {
    const v16 zero = {0};
    vi16 tiny = x < zero - 87.0f;
    x = vsel(tiny, zero, x);
    v16 t = x * 1.4426950408889634f;
    vi16 ni = __builtin_convertvector(t - 0.5f, vi16); /* t <= 0: truncation rounds to nearest */
    v16 f = t - __builtin_convertvector(ni, v16);
    v16 p = zero + 1.540353039e-04f;
    p = p * f + 1.333355815e-03f;
    p = p * f + 9.618129108e-03f;
    p = p * f + 5.550410866e-02f;
    p = p * f + 2.402265070e-01f;
    p = p * f + 6.931471806e-01f;
    p = p * f + 1.000000000e+00f;
    p = p * (v16)((ni + 127) << 23);
    return vsel(tiny, zero, p);
}

static inline float hmax(v16 v) {
    float m = v[0];
    for (int i = 1; i < VW; i++) m = v[i] > m ? v[i] : m;
    return m;
}
static inline float hsum(v16 v) { float s = 0; for (int i = 0; i < VW; i++) s += v[i]; return s; }

/* VW vectors -> one vector of their horizontal sums, lane j = sum of x[j]: a tree of VW - 1
 * shuffle-add steps (the inputs are taken in bit-reversed order, which the tree undoes). */
#define RED(a, b, s) (__builtin_shuffle(a, b, M1_##s) + __builtin_shuffle(a, b, M2_##s))
#if VW == 16
static inline v16 reduce16(const v16 *x) {
    static const vi16 M1_8 = {0,1,2,3,4,5,6,7,16,17,18,19,20,21,22,23};
    static const vi16 M2_8 = {8,9,10,11,12,13,14,15,24,25,26,27,28,29,30,31};
    static const vi16 M1_4 = {0,1,2,3,16,17,18,19,8,9,10,11,24,25,26,27};
    static const vi16 M2_4 = {4,5,6,7,20,21,22,23,12,13,14,15,28,29,30,31};
    static const vi16 M1_2 = {0,1,16,17,4,5,20,21,8,9,24,25,12,13,28,29};
    static const vi16 M2_2 = {2,3,18,19,6,7,22,23,10,11,26,27,14,15,30,31};
    static const vi16 M1_1 = {0,16,2,18,4,20,6,22,8,24,10,26,12,28,14,30};
    static const vi16 M2_1 = {1,17,3,19,5,21,7,23,9,25,11,27,13,29,15,31};
    static const int rev[16] = {0,8,4,12,2,10,6,14,1,9,5,13,3,11,7,15};
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = RED(x[rev[2 * i]], x[rev[2 * i + 1]], 8);
    for (int i = 0; i < 4; i++) b[i] = RED(a[2 * i], a[2 * i + 1], 4);
    for (int i = 0; i < 2; i++) c[i] = RED(b[2 * i], b[2 * i + 1], 2);
    return RED(c[0], c[1], 1);
}
#else
static inline v16 reduce16(const v16 *x) {
    static const vi16 M1_4 = {0,1,2,3,8,9,10,11};
    static const vi16 M2_4 = {4,5,6,7,12,13,14,15};
    static const vi16 M1_2 = {0,1,8,9,4,5,12,13};
    static const vi16 M2_2 = {2,3,10,11,6,7,14,15};
    static const vi16 M1_1 = {0,8,2,10,4,12,6,14};
    static const vi16 M2_1 = {1,9,3,11,5,13,7,15};
    static const int rev[8] = {0,4,2,6,1,5,3,7};
    v16 b[4], c[2];
    for (int i = 0; i < 4; i++) b[i] = RED(x[rev[2 * i]], x[rev[2 * i + 1]], 4);
    for (int i = 0; i < 2; i++) c[i] = RED(b[2 * i], b[2 * i + 1], 2);
    return RED(c[0], c[1], 1);
}
#endif

typedef struct {
    const float *q;          /* [rows, G, D] float32; scores = (q . k + bias) * scale */
    const float *bias;       /* [rows, G], or NULL */
    float scale;
    int bf16_dot;            /* q holds bfloat16 values: bf16 K may use bf16 dot products */
    const char *k, *v;       /* base pointers */
    int kind, esize;         /* K/V element kind and size in bytes */
    int64_t sb, sh, sp;      /* element strides: batch (dense) or block (paged), head, position */
    const int64_t *table;    /* [B, max_blocks] int64, or NULL */
    const int32_t *table32;  /* ... or int32 (torch_npu's block_table dtype); both NULL: dense */
    int64_t table_stride, block_size;
    const int64_t *lo, *hi;  /* [B] attended window */
    const uint8_t *mask;     /* [B, mask_stride] 1 = masked out, or NULL */
    int64_t mask_stride;
    int rows, nkv, G, D, splits;
    float *part_m, *part_l, *part_acc; /* [rows * splits, G (, D)] partial results */
    int cw, sw;              /* positions per chunk; floats per row of scores (cw rounded to 16) */
} args_t;

/* Byte offset of sequence b's position p, kv head 0, from the K (or V: same strides) base. */
static inline int64_t row_off(const args_t *a, int b, int64_t p) {
    int64_t off;
    if (a->table || a->table32) {
        int64_t at = b * a->table_stride + p / a->block_size;
        int64_t blk = a->table32 ? a->table32[at] : a->table[at];
        off = blk * a->sb + (p % a->block_size) * a->sp;
    } else {
        off = b * a->sb + p * a->sp;
    }
    return off * a->esize;
}

/* Prefetch of one line, into L1 or (l2) into L2 only. Into L2 the prefetches do not hold the
 * core's L1 miss buffers while the line comes from DRAM: faster where the kernel streams more
 * than it computes per line (measured with the KV from memory: the chunked kernel 0.71-0.91x the
 * time, the one-pass kernel with one query head per kv head 0.76-0.91x), slower where it computes
 * more (the one-pass kernel at GQA 4:1 and 8:1, 1.1-1.15x). */
static inline __attribute__((always_inline)) void prefetch_line(const char *p, int l2) {
    if (l2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p);
}

/* prefetch the K or V rows of `heads` kv heads at p (kv head h's row is p + h * sh elements) */
static inline __attribute__((always_inline)) void prefetch_heads(const args_t *a, const char *p,
                                                                 int heads, int l2) {
    const int row_bytes = a->D * a->esize;
    const int64_t hs = a->sh * a->esize;
    for (int hh = 0; hh < heads; hh++, p += hs)
        for (int o = 0; o < row_bytes; o += 64) prefetch_line(p + o, l2);
}

/* Only positions of a row's window [lo, hi) are ever addressed. Positions the mask drops are
 * read by qk (their scores are then replaced by -FLT_MAX before the max, so NaN/inf K there
 * never reaches the softmax) but never by pv (their V rows are skipped).
 *
 * A chunk's rows are addressed as base + off[n] + h * sh * esize: off[n] is the chunk's position
 * n, kv head 0 (row_off, computed once per chunk). qk computes the scores of all kv heads tile
 * by tile, so that K is read position by position, every kv head of a position together (one
 * contiguous run in BSH / BSND), and S holds all heads' scores: S[h * G + g][n], rows of sw
 * floats. Shared by the qk tile definitions below (macros: they expand inside them, with NB and
 * GB compile-time constants of each instantiation).
 * TILE_ROWS: the K rows of kv head 0 at positions n .. n + NB - 1 (past w: position n again,
 * harmless), prefetches of all heads' V rows at those positions (read by pv after the chunk's
 * scores) and of all heads' K rows KAHEAD positions ahead.
 * STORE_SCORES: the tile's reduced scores (lane i * GB + j: position n + i, head g0 + j) into
 * Sh[g][n]. */
#define TILE_ROWS(kr)                                                                             \
    for (int i = 0; i < NB; i++) kr[i] = a->k + off[n + i < w ? n + i : n];                       \
    for (int i = 0; i < NB && n + i < w; i++) prefetch_heads(a, a->v + off[n + i], a->nkv, 1);    \
    for (int i = n + KAHEAD; i < n + KAHEAD + NB && i < w; i++)                                   \
        prefetch_heads(a, a->k + off[i], a->nkv, 1);
#define STORE_SCORES(s, GB)                                                                       \
    for (int i = 0; i < NB && n + i < w; i++)                                                     \
        for (int j = 0; j < GB; j++) Sh[(int64_t)(g0 + j) * sw + n + i] = s[i * GB + j];

/* One register tile of scores, shared by both kernels: lane i * GB + j = q[g0 + j] . (the K row at
 * rows[i] + roff), NB = VW / GB rows, VW accumulators over d, one reduce16 (a statement
 * expression of the tile's vector). With NB <= 4 rows the K vectors are pinned in
 * registers (PIN: an empty asm the compiler cannot see through): GCC otherwise reloads each one
 * for every head of the group, two loads per FMA (measured on the 2-core EPYC, 1 thread, K/V in
 * cache, GQA 4:1: 8-10% faster at head dim 64 and 128, results bit-identical; 8:1 unchanged;
 * with 8 or 16 rows pinning spills, 1:1 was 11-16% slower). */
#if defined(__x86_64__) && VW == 16
#define PIN(x) __asm__("" : "+v"(x))
#elif defined(__x86_64__)
#define PIN(x) __asm__("" : "+x"(x))
#elif defined(__aarch64__)
#define PIN(x) __asm__("" : "+w"(x))
#else
#define PIN(x) ((void)0)
#endif
#define SCORE_TILE(LOAD, GB, NB, rows, roff, q, g0, D) ({                                         \
    v16 t_[VW];                                                                                   \
    for (int j = 0; j < VW; j++) t_[j] = (v16){0};                                                \
    for (int d = 0; d < (D); d += VW) {                                                           \
        v16 x[NB];                                                                                \
        for (int i = 0; i < (NB); i++) {                                                          \
            x[i] = LOAD((rows)[i] + (roff), d);                                                   \
            if ((NB) <= 4) PIN(x[i]);                                                             \
        }                                                                                         \
        for (int j = 0; j < (GB); j++) {                                                          \
            v16 qq = load_f32((q) + (int64_t)((g0) + j) * (D) + d);                               \
            for (int i = 0; i < (NB); i++) t_[i * (GB) + j] += qq * x[i];                         \
        }                                                                                         \
    }                                                                                             \
    reduce16(t_);                                                                                 \
})

/* Register tiles, instantiated per K/V element kind (LOAD) and head-group width GB (1, 2, 4, 8):
 *   qk: NB = 16 / GB positions x GB heads, 16 accumulators over d, one reduce16 per tile;
 *   pv: GB heads x DT = min(16 / GB, D / 16) vectors of d, 16 accumulators over positions. */
#define DEFINE_TILES(NAME, LOAD, GB)                                                              \
static void qk_##NAME##_##GB(const args_t *a, const float *qs, const int64_t *off, int w,         \
                             float *S, int sw) {                                                  \
    enum { NB = VW / GB };                                                                        \
    const int D = a->D, G = a->G;                                                                 \
    const int64_t hs = a->sh * a->esize;                                                          \
    for (int n = 0; n < w; n += NB) {                                                             \
        const char *k0[NB];                                                                       \
        TILE_ROWS(k0)                                                                             \
        for (int h = 0; h < a->nkv; h++) for (int g0 = 0; g0 < G; g0 += GB) {                     \
        const float *q = qs + (int64_t)h * G * D;                                                 \
        float *Sh = S + (int64_t)h * G * sw;                                                      \
        v16 s = SCORE_TILE(LOAD, GB, NB, k0, h * hs, q, g0, D);                                   \
        STORE_SCORES(s, GB)                                                                       \
        }                                                                                         \
    }                                                                                             \
}                                                                                                 \
static void pv_##NAME##_##GB(const args_t *a, const char *vb, const int64_t *off, int w, int g0,  \
                             const float *S, int sw, const uint8_t *drop, float *acc) {           \
    enum { DT = VW / GB > 1 ? VW / GB : 1 };                                                      \
    const int D = a->D;                                                                           \
    for (int d0 = 0; d0 < D; d0 += VW * DT) {                                                     \
        int nd = (D - d0) / VW < DT ? (D - d0) / VW : DT;                                         \
        v16 r[GB][DT];                                                                            \
        for (int j = 0; j < GB; j++) for (int t = 0; t < DT; t++) r[j][t] = (v16){0};             \
        if (nd == DT) {                                                                           \
            for (int n = 0; n < w; n++) {                                                         \
                if (drop && drop[n]) continue;                                                    \
                const char *vr = vb + off[n];                                                     \
                v16 x[DT];                                                                        \
                for (int t = 0; t < DT; t++) x[t] = LOAD(vr, d0 + VW * t);                        \
                for (int j = 0; j < GB; j++) {                                                    \
                    float p = S[(int64_t)(g0 + j) * sw + n];                                      \
                    for (int t = 0; t < DT; t++) r[j][t] += p * x[t];                             \
                }                                                                                 \
            }                                                                                     \
        } else {                                                                                  \
            for (int n = 0; n < w; n++) {                                                         \
                if (drop && drop[n]) continue;                                                    \
                const char *vr = vb + off[n];                                                     \
                for (int t = 0; t < nd; t++) {                                                    \
                    v16 x = LOAD(vr, d0 + VW * t);                                                \
                    for (int j = 0; j < GB; j++) r[j][t] += S[(int64_t)(g0 + j) * sw + n] * x;    \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        for (int j = 0; j < GB; j++)                                                              \
            for (int t = 0; t < nd; t++)                                                          \
                *(v16u *)(acc + (int64_t)(g0 + j) * D + d0 + VW * t) += r[j][t];                  \
    }                                                                                             \
}

#ifndef AHEAD_BYTES
/* how far ahead the one-pass kernel prefetches K and V, in bytes of a position's rows (all kv
 * heads), rounded to whole positions, at least one tile. Measured on the 2-core EPYC (cold KV,
 * batch 8, GQA 4:1, float32), us per call: 4 positions ahead against 8 at head dim 64 (2 KiB):
 * 98-125 against 101-130, also 2-3% in cache; at dim 128 4 (4 KiB) against 8: 246 against 260;
 * at dim 32 8 (2 KiB) against 4: 113-114 against 116-118. */
#define AHEAD_BYTES 2048
#endif
/* max of lanes l and l ^ k: combines the lanes of one head across a tile's positions */
#if VW == 16
static const vi16 XOR_1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
static const vi16 XOR_2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
static const vi16 XOR_4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
static const vi16 XOR_8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
static const vi16 LANE_POS[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
                                 {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7},
                                 {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                 {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}};
#else
static const vi16 XOR_1 = {1, 0, 3, 2, 5, 4, 7, 6};
static const vi16 XOR_2 = {2, 3, 0, 1, 6, 7, 4, 5};
static const vi16 XOR_4 = {4, 5, 6, 7, 0, 1, 2, 3};
static const vi16 XOR_8 = {0, 1, 2, 3, 4, 5, 6, 7};  /* never taken at 8 lanes (k < VW) */
static const vi16 LANE_POS[4] = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 2, 2, 3, 3},
                                 {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0}};
#endif
static inline int any_gt(v16 x, v16 y) {
    vi16 gt = x > y;
    vi16 z = {0};
    return memcmp(&gt, &z, sizeof gt) != 0;
}
static inline v16 xor_max(v16 x, int k) {
    const vi16 m = k == 1 ? XOR_1 : k == 2 ? XOR_2 : k == 4 ? XOR_4 : XOR_8;
    return vmax(x, __builtin_shuffle(x, m));
}

#ifndef SPREAD_BYTES
/* A tile whose K and V rows take at most SPREAD_BYTES has its prefetch spread over its work in
 * four parts (prefetch_part); a larger one, whose arithmetic per byte is small (few query heads
 * per kv head), prefetches all at once. Measured on the 2-core EPYC, float32, KV read from
 * memory, 2 threads, against one burst per tile: GQA 4:1 D 64 BSH 0.63-0.72x at batch 1-8 and
 * 0.88x BNSD, 8:1 0.94x, MHA D 64 (16 KiB tiles) 0.91x; MHA with 8 kv heads of D 32 (32 KiB
 * tiles) 1.07-1.10x, so tiles that large keep the burst. */
#define SPREAD_BYTES 16384
#endif
/* Part q (0..3) of a tile's prefetch of positions [f0, f1) of sequence b: K's first and second
 * half, then V's. Dense rows with every kv head of a position adjacent (run: bytes of one
 * position) split by bytes, other layouts by positions. Always inlined: a call inside the tile
 * would spill its vector registers (measured: slower than one burst). */
static inline __attribute__((always_inline)) void prefetch_part(const args_t *a, int b, int q,
                                                                int64_t f0, int64_t f1,
                                                                int64_t run, int l2) {
    if (f0 >= f1) return;
    const char *base = q < 2 ? a->k : a->v;
    if (run) {
        const int64_t o0 = row_off(a, b, f0), len = (f1 - f0) * run;
        const int64_t half = (len / 2 + 63) & ~(int64_t)63;
        for (int64_t o = q & 1 ? half : 0; o < (q & 1 ? len : half); o += 64)
            prefetch_line(base + o0 + o, l2);
    } else {
        const int64_t mid = f0 + (f1 - f0 + 1) / 2;
        for (int64_t i = q & 1 ? mid : f0; i < (q & 1 ? f1 : mid); i++)
            prefetch_heads(a, base + row_off(a, b, i), a->nkv, l2);
    }
}

/* One pass over a work item (sequence b, split s, positions [p0, p1)), tile by tile: a tile is
 * NB = VW / GB positions of every kv head, and each (kv head, group of GB query heads) of the
 * tile gets its scores (one register tile, as qk_*), softmax and output (acc += weights x V)
 * before the next tile, while the K and V rows AHEAD_BYTES on are prefetched: the reads
 * are spread evenly over the work and the memory streams while it computes. (Measured on a 2-core
 * EPYC, batch 8, 500 positions, GQA 4:1, D 64: the chunked kernel (attend), which reads a chunk's
 * K and then its V from cache, took its arithmetic time plus its read time, with the memory idle
 * through the V pass; this one 10-25% less on 2 threads, though 20-30% more when the KV already
 * sits in L2/L3. Batching two or four tiles before their V rows took 18-52% more again.)
 * Online softmax with a lazy max: a tile's weights are exp(score - m), m the largest score of
 * its head so far, and the sums and acc are rescaled only when a tile raises m. Lane i * GB + j
 * of a tile's vectors: position i, query head g0 + j. st: 4 * nkv * (G / GB) vectors of this
 * thread's scratch (the maxima m, the per-lane sums, the score bias and the tile's scores, then
 * weights, per kv head and group). */
#define DEFINE_FUSED(NAME, LOAD, GB)                                                              \
static void fused_##NAME##_##GB(const args_t *a, int b, int s, int64_t p0, int64_t p1, v16 *st) { \
    enum { NB = VW / GB };                                                                        \
    const int G = a->G, D = a->D, nkv = a->nkv, ng = G / GB;                                      \
    const int64_t hs = a->sh * a->esize;                                                          \
    const v16 zero = {0}, lowest = zero - FLT_MAX;                                                \
    v16 *mv = st, *lv = st + nkv * ng, *bias = st + 2 * nkv * ng, *tile = st + 3 * nkv * ng;     \
    for (int i = 0; i < nkv * ng; i++) {                                                          \
        mv[i] = lowest, lv[i] = zero, bias[i] = zero;                                             \
        if (a->bias)  /* row r = b * nkv + i / ng, heads (i % ng) * GB + l % GB */                \
            for (int l = 0; l < VW; l++)                                                          \
                bias[i][l] = a->bias[(int64_t)(b * nkv + i / ng) * G + (i % ng) * GB + l % GB];   \
    }                                                                                             \
    int64_t off[CH];                                                                              \
    /* dense, every kv head of a position and the positions themselves adjacent: the rows ahead \
     * are one run of `run` bytes per position */                                               \
    const int64_t run = !a->table && !a->table32 && a->sh == D && a->sp == (int64_t)nkv * D     \
                        ? (int64_t)nkv * D * a->esize : 0;                                        \
    const int64_t row_all = (int64_t)nkv * D * a->esize;  /* bytes of a position, all heads */   \
    const int64_t ahead = AHEAD_BYTES / row_all > NB ? AHEAD_BYTES / row_all : NB;                \
    const int spread = 2 * NB * row_all <= SPREAD_BYTES;  /* see prefetch_part */                 \
    const int l2 = GB == 1;  /* see prefetch_line */                                              \
    for (int64_t c0 = p0; c0 < p1; c0 += CH) {                                                    \
        const int w = (int)(p1 - c0 < CH ? p1 - c0 : CH);                                         \
        for (int n = 0; n < w; n++) off[n] = row_off(a, b, c0 + n);                               \
        const uint8_t *drop = a->mask ? a->mask + b * a->mask_stride + c0 : NULL;                 \
        for (int n = 0; n < w; n += NB) {                                                         \
            /* the rows `ahead` positions on; a small tile (spread) in four parts spread over its \
             * work (K's halves before its scores and its softmax, V's before and inside its      \
             * weighted sums): one burst of its lines at once filled the core's miss buffers      \
             * and stalled it, so that the memory idled while the tile computed */                \
            const int64_t f0 = c0 + n + ahead, f1 = f0 + NB < p1 ? f0 + NB : p1;                  \
            for (int q = 0; q < (spread ? 1 : 4); q++) prefetch_part(a, b, q, f0, f1, run, l2);   \
            const int nb = w - n < NB ? w - n : NB;                                               \
            const vi16 lpos = LANE_POS[GB == 1 ? 0 : GB == 2 ? 1 : GB == 4 ? 2 : 3];              \
            vi16 valid = lpos < nb;                                                               \
            int keep[NB], any = 0;                                                                \
            for (int i = 0; i < NB; i++) keep[i] = i < nb, any |= keep[i];                        \
            if (drop) {                                                                           \
                any = 0;                                                                          \
                for (int i = 0; i < NB; i++) keep[i] = keep[i] && !drop[n + i], any |= keep[i];   \
                for (int l = 0; l < VW; l++) valid[l] = keep[l / GB] ? -1 : 0;                    \
            }                                                                                     \
            if (!any) {  /* the tile's prefetch still goes on */                                  \
                for (int q = 1; q < (spread ? 4 : 1); q++)                                        \
                    prefetch_part(a, b, q, f0, f1, run, l2);                                      \
                continue;                                                                         \
            }                                                                                     \
            const char *kr[NB], *vr[NB];                                                          \
            for (int i = 0; i < NB; i++) {                                                        \
                int64_t o = off[n + (i < nb ? i : 0)];                                            \
                kr[i] = a->k + o, vr[i] = a->v + o;                                               \
            }                                                                                     \
            /* three passes over the tile's (kv head, head group) pairs, so that the pairs'       \
             * dependency chains (scores, reduction, exp, weighted V) sit side by side: the       \
             * scores; the softmax (maxima, sums, rescaling); the weighted V rows */              \
            int full = nb == NB;  /* every position of the tile kept */                           \
            for (int i = 0; i < NB; i++) full &= keep[i];                                         \
            for (int h = 0; h < nkv; h++) {                                                       \
                const float *q = a->q + (int64_t)(b * nkv + h) * G * D;                           \
                for (int g0 = 0; g0 < G; g0 += GB) {                                              \
                    v16 sc = SCORE_TILE(LOAD, GB, NB, kr, h * hs, q, g0, D);                      \
                    const v16 bv = bias[h * ng + g0 / GB];                                        \
                    tile[h * ng + g0 / GB] = vsel(valid, (sc + bv) * a->scale, lowest);           \
                }                                                                                 \
            }                                                                                     \
            if (spread) prefetch_part(a, b, 1, f0, f1, run, l2);                                  \
            for (int h = 0; h < nkv; h++) {                                                       \
                float *acc = a->part_acc + ((int64_t)(b * nkv + h) * a->splits + s) * G * D;      \
                for (int g0 = 0; g0 < G; g0 += GB) {                                              \
                    const int x = h * ng + g0 / GB;                                               \
                    const v16 sc = tile[x];                                                       \
                    v16 *m = mv + x;                                                              \
                    if (any_gt(sc, *m)) {  /* a new max: rescale what was summed against it */    \
                        v16 tm = sc;                                                              \
                        for (int k = GB; k < VW; k *= 2) tm = xor_max(tm, k);                     \
                        v16 mnew = vmax(tm, *m), alpha = vexp(*m - mnew);                         \
                        *m = mnew;                                                                \
                        lv[x] *= alpha;                                                           \
                        for (int j = 0; j < GB; j++)                                              \
                            if (alpha[j] != 1.0f)                                                 \
                                for (int d = 0; d < D; d += VW)                                   \
                                    *(v16u *)(acc + (int64_t)(g0 + j) * D + d) *= alpha[j];       \
                    }                                                                             \
                    /* the tile's weights replace its scores */                                   \
                    tile[x] = vsel(valid, vexp(sc - *m), zero);                                   \
                    lv[x] += tile[x];                                                             \
                }                                                                                 \
            }                                                                                     \
            if (spread) prefetch_part(a, b, 2, f0, f1, run, l2);                                  \
            /* masked positions: weight 0, but 0 * NaN = NaN: their V rows are never read */      \
            for (int h = 0; h < nkv; h++) {                                                       \
                if (spread && h == (nkv > 1)) prefetch_part(a, b, 3, f0, f1, run, l2);            \
                float *acc = a->part_acc + ((int64_t)(b * nkv + h) * a->splits + s) * G * D;      \
                for (int g0 = 0; g0 < G; g0 += GB) {                                              \
                    /* the weights read from memory: each FMA broadcasts its weight from there  \
                     * (AVX-512: one instruction), not from a register lane (two) */             \
                    const float *e = (const float *)&tile[h * ng + g0 / GB];                      \
                    for (int d = 0; d < D; d += VW) {                                             \
                        v16 rr[GB];                                                               \
                        for (int j = 0; j < GB; j++)                                              \
                            rr[j] = *(v16u *)(acc + (int64_t)(g0 + j) * D + d);                   \
                        if (full)  /* (two loops: the compiler keeps the test out of the first) */ \
                            for (int i = 0; i < NB; i++) {                                        \
                                const v16 x = LOAD(vr[i] + h * hs, d);                            \
                                for (int j = 0; j < GB; j++) rr[j] += e[i * GB + j] * x;          \
                            }                                                                     \
                        else                                                                      \
                            for (int i = 0; i < NB; i++) {                                        \
                                if (!keep[i]) continue;                                           \
                                const v16 x = LOAD(vr[i] + h * hs, d);                            \
                                for (int j = 0; j < GB; j++) rr[j] += e[i * GB + j] * x;          \
                            }                                                                     \
                        for (int j = 0; j < GB; j++)                                              \
                            *(v16u *)(acc + (int64_t)(g0 + j) * D + d) = rr[j];                   \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    for (int h = 0; h < nkv; h++) {                                                               \
        const int64_t it = (int64_t)(b * nkv + h) * a->splits + s;                                \
        for (int g0 = 0; g0 < G; g0 += GB)                                                        \
            for (int j = 0; j < GB; j++) {                                                        \
                float l = 0.0f;                                                                   \
                for (int i = 0; i < NB; i++) l += lv[h * ng + g0 / GB][i * GB + j];               \
                a->part_m[it * G + g0 + j] = mv[h * ng + g0 / GB][j];                             \
                a->part_l[it * G + g0 + j] = l;                                                   \
            }                                                                                     \
    }                                                                                             \
}

/* Both kernels' tiles, per K/V element kind (LOAD) and head-group width GB (1, 2, 4, 8). */
#define LOAD_F32(p, d) load_f32((p) + 4 * (d))
#define LOAD_BF16(p, d) load_bf16((p) + 2 * (d))
#define LOAD_F16(p, d) load_f16((p) + 2 * (d))
#define LOAD_I8(p, d) load_i8((p) + (d))
#define DEFINE_KIND(NAME, LOAD)                                                                   \
    DEFINE_TILES(NAME, LOAD, 1) DEFINE_TILES(NAME, LOAD, 2)                                       \
    DEFINE_TILES(NAME, LOAD, 4) DEFINE_TILES(NAME, LOAD, 8)                                       \
    DEFINE_FUSED(NAME, LOAD, 1) DEFINE_FUSED(NAME, LOAD, 2)                                       \
    DEFINE_FUSED(NAME, LOAD, 4) DEFINE_FUSED(NAME, LOAD, 8)
DEFINE_KIND(f32, LOAD_F32)
DEFINE_KIND(bf16, LOAD_BF16)
DEFINE_KIND(f16, LOAD_F16)
DEFINE_KIND(i8, LOAD_I8)

typedef void (*fused_fn)(const args_t *, int, int, int64_t, int64_t, v16 *);
static const fused_fn FUSED[4][4] = {{fused_f32_1, fused_f32_2, fused_f32_4, fused_f32_8},
                                     {fused_bf16_1, fused_bf16_2, fused_bf16_4, fused_bf16_8},
                                     {fused_f16_1, fused_f16_2, fused_f16_4, fused_f16_8},
                                     {fused_i8_1, fused_i8_2, fused_i8_4, fused_i8_8}};

typedef void (*qk_fn)(const args_t *, const float *, const int64_t *, int, float *, int);
typedef void (*pv_fn)(const args_t *, const char *, const int64_t *, int, int, const float *, int,
                      const uint8_t *, float *);
static const qk_fn QK[4][4] = {{qk_f32_1, qk_f32_2, qk_f32_4, qk_f32_8},
                               {qk_bf16_1, qk_bf16_2, qk_bf16_4, qk_bf16_8},
                               {qk_f16_1, qk_f16_2, qk_f16_4, qk_f16_8},
                               {qk_i8_1, qk_i8_2, qk_i8_4, qk_i8_8}};
static const pv_fn PV[4][4] = {{pv_f32_1, pv_f32_2, pv_f32_4, pv_f32_8},
                               {pv_bf16_1, pv_bf16_2, pv_bf16_4, pv_bf16_8},
                               {pv_f16_1, pv_f16_2, pv_f16_4, pv_f16_8},
                               {pv_i8_1, pv_i8_2, pv_i8_4, pv_i8_8}};

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_BF16_DOT 1
/* bf16 K with a bf16 query: vdpbf16ps multiplies bf16 pairs exactly and sums them in fp32, so the
 * scores equal the fp32 FMA path's up to summation order, at half the instructions and with no
 * conversion of K. Same tile as qk_*, 32 elements of d per step (D % 32 == 0). */
#define DEFINE_QK_DOT(GB)                                                                         \
static void qkdot_bf16_##GB(const args_t *a, const uint16_t *qbs, const int64_t *off, int w,      \
                            float *S, int sw) {                                                   \
    enum { NB = 16 / GB };                                                                        \
    const int D = a->D, G = a->G;                                                                 \
    const int64_t hs = a->sh * a->esize;                                                          \
    for (int n = 0; n < w; n += NB) {                                                             \
        const char *k0[NB];                                                                       \
        TILE_ROWS(k0)                                                                             \
        for (int h = 0; h < a->nkv; h++) for (int g0 = 0; g0 < G; g0 += GB) {                     \
        const uint16_t *qb = qbs + (int64_t)h * G * D;                                            \
        float *Sh = S + (int64_t)h * G * sw;                                                      \
        const char *kr[NB];                                                                       \
        for (int i = 0; i < NB; i++) kr[i] = k0[i] + h * hs;                                      \
        v16 acc[16];                                                                              \
        for (int j = 0; j < 16; j++) acc[j] = (v16){0};                                           \
        for (int d = 0; d < D; d += 32) {                                                         \
            __m512bh x[NB];                                                                       \
            for (int i = 0; i < NB; i++) x[i] = (__m512bh)_mm512_loadu_si512(kr[i] + 2 * d);      \
            for (int j = 0; j < GB; j++) {                                                        \
                __m512bh qq = (__m512bh)_mm512_loadu_si512(qb + (int64_t)(g0 + j) * D + d);       \
                for (int i = 0; i < NB; i++)                                                      \
                    acc[i * GB + j] = (v16)_mm512_dpbf16_ps((__m512)acc[i * GB + j], qq, x[i]);   \
            }                                                                                     \
        }                                                                                         \
        v16 s = reduce16(acc);                                                                    \
        STORE_SCORES(s, GB)                                                                       \
        }                                                                                         \
    }                                                                                             \
}
DEFINE_QK_DOT(1) DEFINE_QK_DOT(2) DEFINE_QK_DOT(4) DEFINE_QK_DOT(8)
typedef void (*qkdot_fn)(const args_t *, const uint16_t *, const int64_t *, int, float *, int);
static const qkdot_fn QKDOT[4] = {qkdot_bf16_1, qkdot_bf16_2, qkdot_bf16_4, qkdot_bf16_8};
#else
#define HAVE_BF16_DOT 0
#endif

/* 1 when this build has the bf16 dot-product path (the CPU has AVX512-BF16). */
int torchair_decode_attention_bf16_dot(void) { return HAVE_BF16_DOT; }

/* Positions per chunk of a work item: the chunk's K and V rows of all kv heads (prefetched
 * position by position by qk) stay in L2 until pv has read the last head's V rows. */
#ifndef CHUNK_BYTES
#define CHUNK_BYTES (192 * 1024)
#endif

/* one work item: sequence b, split s = positions [p0, p1), every kv head h of b, chunk by chunk:
 * row r = b * nkv + h -> running max m[G], sum l[G], acc[G][D] of partial result r * splits + s
 * (already initialized). `work`: this thread's scratch, the scores [nkv * G][sw] then the query
 * as bf16 [nkv * G * D] (bf16 dot products only). */
static void attend(const args_t *a, int b, int s, int64_t p0, int64_t p1, float *work) {
    const int G = a->G, D = a->D, nkv = a->nkv, cw = a->cw, sw = a->sw;
    float *S = work;
    int64_t off[CH];
    const int wi = G % 8 == 0 ? 3 : G % 4 == 0 ? 2 : G % 2 == 0 ? 1 : 0, GB = 1 << wi;
    const qk_fn qk = QK[a->kind][wi];
    const pv_fn pv = PV[a->kind][wi];
    const float *qs = a->q + (int64_t)b * nkv * G * D;  /* the query rows of b's kv heads */
#if HAVE_BF16_DOT
    uint16_t *qb = (uint16_t *)(work + (int64_t)nkv * G * sw);
    const int use_dot = a->bf16_dot && a->kind == KIND_BF16 && D % 32 == 0;
    if (use_dot)  /* the query's bf16 values: the top half of their float32 bits, exactly */
        for (int64_t i = 0; i < (int64_t)nkv * G * D; i++) {
            uint32_t u;
            memcpy(&u, qs + i, 4);
            qb[i] = (uint16_t)(u >> 16);
        }
#endif
    for (int64_t c0 = p0; c0 < p1; c0 += cw) {
        const int w = (int)(p1 - c0 < cw ? p1 - c0 : cw);
        const uint8_t *drop = a->mask ? a->mask + b * a->mask_stride + c0 : NULL;
        int kept = w;
        if (drop) { kept = 0; for (int n = 0; n < w; n++) kept += !drop[n]; }
        if (!kept) continue;
        for (int n = 0; n < w; n++) off[n] = row_off(a, b, c0 + n);
#if HAVE_BF16_DOT
        if (use_dot)
            QKDOT[wi](a, qb, off, w, S, sw);
        else
#endif
            qk(a, qs, off, w, S, sw);
        const int wp = (w + 15) & ~15;
        for (int h = 0; h < nkv; h++) {
            const int r = b * nkv + h;
            const int64_t it = (int64_t)r * a->splits + s;
            float *m = a->part_m + it * G, *l = a->part_l + it * G;
            float *acc = a->part_acc + it * G * D;
            float *Sh = S + (int64_t)h * G * sw;
            for (int g = 0; g < G; g++) {
                float *sc = Sh + (int64_t)g * sw;
                float bias = a->bias ? a->bias[(int64_t)r * G + g] : 0.0f;
                for (int n = 0; n < w; n++)
                    sc[n] = (drop && drop[n]) ? -FLT_MAX : (sc[n] + bias) * a->scale;
                for (int n = w; n < wp; n++) sc[n] = -FLT_MAX;
                v16 vm = (v16){0} - FLT_MAX;
                for (int n = 0; n < wp; n += VW) { v16 x = *(v16 *)(sc + n); vm = vmax(x, vm); }
                float mx = hmax(vm);
                float m_new = mx > m[g] ? mx : m[g];
                v16 sub = (v16){0} + m_new, vs = (v16){0};
                for (int n = 0; n < wp; n += VW) {
                    v16 e = vexp(*(v16 *)(sc + n) - sub);
                    *(v16 *)(sc + n) = e;
                    vs += e;
                }
                float alpha = vexp((v16){0} + (m[g] - m_new))[0];
                l[g] = l[g] * alpha + hsum(vs);
                m[g] = m_new;
                if (alpha != 1.0f) for (int d = 0; d < D; d++) acc[(int64_t)g * D + d] *= alpha;
            }
            /* masked positions: weight 0, but 0 * NaN = NaN: their V rows are never read */
            const char *vb = a->v + h * a->sh * a->esize;
            for (int g0 = 0; g0 < G; g0 += GB) pv(a, vb, off, w, g0, Sh, sw, drop, acc);
        }
    }
}

/* Which kernel a call takes: the one-pass kernel (fused_*), except for bfloat16 K/V with a bfloat16
 * query where the CPU has the bf16 dot product, and for query-head groups with G x D > 512, whose
 * one-pass tiles re-read and re-write G x D accumulators every few positions. Measured on cold KV
 * (2-core EPYC, batch 8, 500 positions, float32, chunked vs one-pass): G x D <= 512: 4:1 x D 64
 * 151 vs 119 us, 4:1 x D 128 330 vs 318, 2:1 x D 128 601 vs 575, 8:1 x D 64 162 vs 160; G x D
 * 1024: 16:1 x D 64 111 vs 137-169, 8:1 x D 128 with 4 kv heads 808-828 vs 910-947 (with 1 kv
 * head the one-pass kernel won, 147-151 vs 127-132: the rule gives that case up). */
#ifndef FUSED_MAX_GD
#define FUSED_MAX_GD 512
#endif
static int chunked(const args_t *a) {
#if HAVE_BF16_DOT
    if (a->bf16_dot && a->kind == KIND_BF16 && a->D % 32 == 0) return 1;
#endif
    return a->G * a->D > FUSED_MAX_GD;
}

/* work item = (sequence b, split s): the s-th of `splits` equal parts of b's window, all its
 * kv heads */
static void run_item(const args_t *a, int item, float *work) {
    const int G = a->G, D = a->D;
    int b = item / a->splits, s = item % a->splits;
    int64_t lo = a->lo[b], hi = a->hi[b], len = hi > lo ? hi - lo : 0;
    int64_t step = (len + a->splits - 1) / a->splits;
    int64_t p0 = lo + s * step, p1 = p0 + step < hi ? p0 + step : hi;
    for (int h = 0; h < a->nkv; h++) {
        int64_t it = (int64_t)(b * a->nkv + h) * a->splits + s;
        for (int g = 0; g < G; g++) a->part_m[it * G + g] = -FLT_MAX, a->part_l[it * G + g] = 0.0f;
        memset(a->part_acc + it * G * D, 0, sizeof(float) * G * D);
    }
    if (p0 >= p1) return;
    if (chunked(a)) {
        attend(a, b, s, p0, p1, work);
    } else {
        const int wi = G % 8 == 0 ? 3 : G % 4 == 0 ? 2 : G % 2 == 0 ? 1 : 0;
        FUSED[a->kind][wi](a, b, s, p0, p1, (v16 *)work);
    }
}

/* The block ids every row's window reads must name blocks of the cache: returns 0, or -2 with
 * err = {b, c, id} for the first bad block_table[b, c] (ids in columns no window reaches may be
 * anything, e.g. -1). */
static int check_blocks(const args_t *a, int batch, int64_t num_blocks, int64_t *err) {
    for (int b = 0; b < batch; b++) {
        if (a->hi[b] <= a->lo[b]) continue;
        for (int64_t c = a->lo[b] / a->block_size; c < (a->hi[b] + a->block_size - 1) / a->block_size;
             c++) {
            int64_t at = b * a->table_stride + c;
            int64_t id = a->table32 ? a->table32[at] : a->table[at];
            if (id < 0 || id >= num_blocks) {
                err[0] = b; err[1] = c; err[2] = id;
                return -2;
            }
        }
    }
    return 0;
}

/* Returns 0; -1 when the shapes are outside what this kernel takes (the caller falls back); -2
 * when a block id is bad (err = {b, c, id}, nothing computed). table_i32: table holds int32. */
int torchair_decode_attention(const float *q, const float *bias, const void *k, const void *v,
                              int kind, int64_t sb, int64_t sh, int64_t sp,
                              const void *table, int table_i32, int64_t table_stride,
                              int64_t block_size, int64_t num_blocks,
                              const int64_t *lo, const int64_t *hi,
                              const uint8_t *mask, int64_t mask_stride,
                              int batch, int nkv, int G, int D, int splits, int nthreads,
                              float *part_m, float *part_l, float *part_acc,
                              float *out, float *out_l, float scale, int q_bf16, int64_t *err) {
    static const int esize[4] = {4, 2, 2, 1};
    if (G < 1 || G > MAX_G || D < 16 || D > MAX_D || D % 16 || kind < 0 || kind > 3 || splits < 1)
        return -1;
    args_t a = {q, bias, scale, q_bf16, (const char *)k, (const char *)v, kind, esize[kind], sb, sh,
                sp, table && !table_i32 ? (const int64_t *)table : NULL,
                table && table_i32 ? (const int32_t *)table : NULL, table_stride, block_size, lo,
                hi, mask, mask_stride, batch * nkv, nkv, G, D, splits, part_m, part_l, part_acc,
                0, 0};
    if (table && check_blocks(&a, batch, num_blocks, err)) return -2;
    int64_t cw = CHUNK_BYTES / ((int64_t)nkv * D * esize[kind] * 2);
    a.cw = cw < 16 ? 16 : cw > CH ? CH : (int)cw;
    a.sw = (a.cw + 15) & ~15;
    int items = batch * splits;
    if (nthreads > items) nthreads = items;
    if (nthreads < 1) nthreads = 1;
    /* per thread: the chunked kernel's scores [nkv * G][sw] and bf16 query [nkv * G * D] (in
     * 64-byte units), or from the start the one-pass kernel's maxima, sums, biases and tile (4
     * vectors per head); both sizes are added, a few KiB */
    const int64_t per = (int64_t)nkv * G * a.sw + ((int64_t)nkv * G * D + 31) / 32 * 16
                        + 4 * (int64_t)nkv * G * VW;
    float *work = aligned_alloc(64, (size_t)(nthreads * per) * sizeof(float));
    if (!work) return -1;
    /* OpenMP: in a PyTorch process this is PyTorch's own runtime and thread pool (libgomp is
     * loaded once), so no second set of threads competes with it for the cores. */
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        float *mine = work + omp_get_thread_num() * per;
        #pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) run_item(&a, item, mine);
    }
    free(work);
    /* merge the splits of every row */
    for (int r = 0; r < a.rows; r++) {
        for (int g = 0; g < G; g++) {
            float mx = -FLT_MAX, l = 0.0f;
            for (int s = 0; s < splits; s++) {
                float ms = part_m[((int64_t)r * splits + s) * G + g];
                mx = ms > mx ? ms : mx;
            }
            float *o = out + ((int64_t)r * G + g) * D;
            memset(o, 0, sizeof(float) * D);
            for (int s = 0; s < splits; s++) {
                int64_t it = (int64_t)r * splits + s;
                float ls = part_l[it * G + g];
                if (ls == 0.0f) continue;
                float w = vexp((v16){0} + (part_m[it * G + g] - mx))[0];
                l += ls * w;
                const float *pa = part_acc + (it * G + g) * D;
                for (int d = 0; d < D; d++) o[d] += w * pa[d];
            }
            if (l > 0.0f) { float inv = 1.0f / l; for (int d = 0; d < D; d++) o[d] *= inv; }
            out_l[(int64_t)r * G + g] = l;
        }
    }
    return 0;
}
