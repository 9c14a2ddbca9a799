/* How fast one CPU core reads a decode step's K/V cache in the orders a decode attention kernel can
 * take, with the arithmetic left out (or replaced by a fixed amount of register work per tile).
 * Built and run by bench/bench_kv_patterns.py; prints one line per pattern: `name us_per_step`.
 *
 * Layout: BSH, float32, sets x batch x cap positions x row floats (row = kv heads x head dim), K
 * and V apart; every step reads the next set (sets x 2 x batch x cap x row x 4 bytes: the caller
 * makes that far larger than the last-level cache), `len` positions of each sequence. Patterns:
 *   sequential   a sequence's K rows in order, then its V rows (no software prefetch)
 *   interleaved  position by position: the K row, then the V row (no software prefetch)
 *   chunked      the chunked kernel's order: per chunk of 192 positions, K in tiles of 4 positions
 *                (K prefetched 16 positions ahead, V prefetched at the tile), then the chunk's V
 *                rows head by head (from cache)
 *   tiles        the one-pass kernel's order: per tile of 4 positions, K and V prefetched 8
 *                positions ahead, the tile's K rows, then its V rows
 * `work` FMAs per tile on 16 registers stand in for a tile's arithmetic (they depend on the
 * loaded values, so they cannot run before them).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));

static int SETS, B, CAP, LEN, ROW, WORK;
static float **K, **V;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static inline vf ld(const float *p) { return *(const vfu *)p; }
static inline void pf(const float *p, int floats) {
    for (int o = 0; o < floats; o += 16) __builtin_prefetch(p + o);
}
/* the stand-in arithmetic of one tile: WORK FMAs over 16 accumulators, fed by x */
static inline void work(vf *acc, vf x) {
    const vf m = (vf){0} + 0.999f;
    for (int r = 0; r < WORK; r += 16)
        for (int j = 0; j < 16; j++) acc[j] = acc[j] * m + x;
}

static vf sequential(const float *k, const float *v, vf *acc) {
    vf a = {0};
    for (int b = 0; b < B; b++) {
        const float *kb = k + (size_t)b * CAP * ROW, *vb = v + (size_t)b * CAP * ROW;
        for (int p = 0; p < LEN; p += 4) {
            for (int i = 0; i < 4 * ROW && p * ROW + i < LEN * ROW; i += 16) a += ld(kb + p * ROW + i);
            work(acc, a);
        }
        for (int p = 0; p < LEN; p += 4) {
            for (int i = 0; i < 4 * ROW && p * ROW + i < LEN * ROW; i += 16) a += ld(vb + p * ROW + i);
            work(acc, a);
        }
    }
    return a;
}

static vf interleaved(const float *k, const float *v, vf *acc) {
    vf a = {0};
    for (int b = 0; b < B; b++) {
        const float *kb = k + (size_t)b * CAP * ROW, *vb = v + (size_t)b * CAP * ROW;
        for (int p = 0; p < LEN; p++) {
            for (int i = 0; i < ROW; i += 16) a += ld(kb + p * ROW + i);
            for (int i = 0; i < ROW; i += 16) a += ld(vb + p * ROW + i);
            if (p % 4 == 3) work(acc, a), work(acc, a);
        }
    }
    return a;
}

static vf chunked(const float *k, const float *v, vf *acc) {
    vf a = {0};
    const int half = ROW / 2;  /* two kv heads per row */
    for (int b = 0; b < B; b++) {
        const float *kb = k + (size_t)b * CAP * ROW, *vb = v + (size_t)b * CAP * ROW;
        for (int c0 = 0; c0 < LEN; c0 += 192) {
            const int w = LEN - c0 < 192 ? LEN - c0 : 192;
            for (int n = 0; n < w; n += 4) {
                for (int i = n; i < n + 4 && i < w; i++) pf(vb + (c0 + i) * ROW, ROW);
                for (int i = n + 16; i < n + 20 && i < w; i++) pf(kb + (c0 + i) * ROW, ROW);
                for (int i = n; i < n + 4 && i < w; i++)
                    for (int o = 0; o < ROW; o += 16) a += ld(kb + (c0 + i) * ROW + o);
                work(acc, a);
            }
            for (int h = 0; h < 2; h++)
                for (int n = 0; n < w; n++) {
                    for (int o = 0; o < half; o += 16) a += ld(vb + (c0 + n) * ROW + h * half + o);
                    if (n % 4 == 3) work(acc, a);
                }
        }
    }
    return a;
}

static vf tiles(const float *k, const float *v, vf *acc) {
    vf a = {0};
    for (int b = 0; b < B; b++) {
        const float *kb = k + (size_t)b * CAP * ROW, *vb = v + (size_t)b * CAP * ROW;
        for (int n = 0; n < LEN; n += 4) {
            for (int i = n + 8; i < n + 12 && i < LEN; i++) {
                pf(kb + i * ROW, ROW);
                pf(vb + i * ROW, ROW);
            }
            for (int i = n; i < n + 4 && i < LEN; i++)
                for (int o = 0; o < ROW; o += 16) a += ld(kb + i * ROW + o);
            work(acc, a);
            for (int i = n; i < n + 4 && i < LEN; i++)
                for (int o = 0; o < ROW; o += 16) a += ld(vb + i * ROW + o);
            work(acc, a);
        }
    }
    return a;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s sets batch cap len row work repeats\n", argv[0]);
        return 2;
    }
    SETS = atoi(argv[1]), B = atoi(argv[2]), CAP = atoi(argv[3]), LEN = atoi(argv[4]);
    ROW = atoi(argv[5]), WORK = atoi(argv[6]);
    const int repeats = atoi(argv[7]);
    if (ROW % 32 || LEN > CAP || SETS < 1) return 2;
    K = malloc(sizeof(float *) * SETS), V = malloc(sizeof(float *) * SETS);
    const size_t n = (size_t)B * CAP * ROW;
    for (int s = 0; s < SETS; s++) {
        K[s] = aligned_alloc(64, n * 4), V[s] = aligned_alloc(64, n * 4);
        if (!K[s] || !V[s]) return 3;
        for (size_t i = 0; i < n; i++) K[s][i] = 1.0f, V[s][i] = 2.0f;
    }
    static const char *names[4] = {"sequential", "interleaved", "chunked", "tiles"};
    vf (*fns[4])(const float *, const float *, vf *) = {sequential, interleaved, chunked, tiles};
    volatile float sink = 0;
    double *per = malloc(sizeof(double) * repeats);
    for (int f = 0; f < 4; f++) {
        for (int r = 0; r < repeats; r++) {  /* one pass over all sets: time per step */
            vf acc[16] = {{0}};
            const double t0 = now_ns();
            for (int s = 0; s < SETS; s++) {
                vf x = fns[f](K[s], V[s], acc);
                sink += x[0] + acc[0][0];
            }
            per[r] = (now_ns() - t0) / SETS;
        }
        for (int i = 1; i < repeats; i++)  /* insertion sort: the median pass */
            for (int j = i; j > 0 && per[j] < per[j - 1]; j--) {
                double t = per[j];
                per[j] = per[j - 1], per[j - 1] = t;
            }
        printf("%s %.3f\n", names[f], per[repeats / 2] / 1e3);
    }
    return sink == 12345.0f ? 1 : 0;
}
