// Small-M matrix products for CPU static units, as a PyTorch operator implemented in C++.
//
//   torchair_native::gemv(Tensor x, Tensor w_t, Tensor? bias=None, int abi=0) -> Tensor
//   torchair_native::gemv_cat(Tensor x, Tensor w0, Tensor w1, Tensor? w2=None, Tensor? b0=None,
//                             Tensor? b1=None, Tensor? b2=None, int abi=0) -> Tensor
//
// is mm(x, w_t) (+ bias): x [M, K], w_t [K, N], bias [N]. A decode step's linear layers are such
// products with a handful of rows (M = batch) against a weight whose transpose is contiguous
// (w_t = W.t(), W [N, K]): reading the weight is all the work. Each thread takes a range of W's
// rows and streams them once, R rows at a time, each row's dot products with up to 8 rows of x
// kept in vector registers (R x MB accumulators), so W is read from memory once for all rows of x
// (bench/bench_small_gemm.py: 1.24-1.58x ATen's F.linear at 4-16 rows; at 1-3 rows ATen's GEMV
// already streams at the memory's speed, and units keep it). gemv_cat is the products of one x
// with 2 or 3 weights (a layer's q/k/v or gate/up), side by side in one output, in one parallel
// region: the same sums as gemv's, one fork and join and one dispatch instead of 2-3.
//
// The fast path needs float32 on the CPU, x rows and W rows contiguous in k (x.stride(1) == 1,
// w_t.stride(0) == 1) and a float32 bias of N contiguous values; every other call is computed by
// ATen's mm/addmm. Sums are fp32, each output one thread's in a fixed order whatever the thread
// count, in another order than a BLAS's (tests compare with a float64 reference). Built on first
// use by torchair/ops/toolchain/native.py against this process's torch (with -fopenmp: PyTorch's
// OpenMP runtime, loaded once per process); loaded and registered by torchair/ops/matmul/cpu.py.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
namespace {
struct Vec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float *p) { return _mm512_loadu_ps(p); }
  static T load_first(const float *p, int n) {  // p[0..n), zeros after: n < kLanes
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(T a) { return _mm512_reduce_add_ps(a); }
};
}  // namespace
constexpr int kVectorBits = 512;
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
namespace {
struct Vec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float *p) { return _mm256_loadu_ps(p); }
  static T load_first(const float *p, int n) {
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
  }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
  }
};
}  // namespace
constexpr int kVectorBits = 256;
#else
constexpr int kVectorBits = 0;  // no fast path: every call is ATen's (the binder does not bind)
#endif

namespace {

// the prefetch below: on unless torchair_gemm_set_prefetch(0) (benches time both in one process)
std::atomic<bool> g_prefetch{true};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// Every product prefetches the next block of W into L2 while a tile computes (locality 2:
// prefetcht1): with several rows of x the tile works long enough per weight line that the
// hardware prefetchers fall behind, from L3 as from DRAM, and one row streams W faster from DRAM
// with it. Into L1 (prefetcht0) the prefetches held the core's L1 miss buffers, which a stream
// from DRAM fills, and stalled the tile. Measured on the 2-core EPYC, the decode bench's 14
// weights (23 MiB) at 2 threads, us per pass after a 64 MiB read (weights from DRAM) and back to
// back (partly from L3): 1 row 945 / 424 without prefetch, 601 / 417 into L2; 8 rows 1185 / 770
// into L1, 796 / 709 into L2.

// y[m, r] = sum_k x[m, k] * w[r, k] (+ bias[r]) for r < R, m < MB: one pass over R rows of W
// (the next block, read by the next tile of the range, starts R rows on)
template <int R, int MB>
inline void tile(const float *x, int64_t ldx, int64_t K, const float *w, int64_t ldw, float *y,
                 int64_t ldy, const float *bias, bool prefetch) {
  typename Vec::T acc[R][MB];
  for (int r = 0; r < R; r++)
    for (int m = 0; m < MB; m++) acc[r][m] = Vec::zero();
  int64_t k = 0;
  for (; k + Vec::kLanes <= K; k += Vec::kLanes) {
    typename Vec::T xv[MB];
    for (int m = 0; m < MB; m++) xv[m] = Vec::load(x + m * ldx + k);
    if (prefetch)  // the next block's rows at this k, into L2 (past W's end: a no-op)
      for (int r = 0; r < R; r++) __builtin_prefetch(w + (r + R) * ldw + k, 0, 2);
    for (int r = 0; r < R; r++) {
      typename Vec::T wv = Vec::load(w + r * ldw + k);
      for (int m = 0; m < MB; m++) acc[r][m] = Vec::fma(wv, xv[m], acc[r][m]);
    }
  }
  if (k < K) {  // the tail: lanes past K load zeros in both operands
    const int n = static_cast<int>(K - k);
    typename Vec::T xv[MB];
    for (int m = 0; m < MB; m++) xv[m] = Vec::load_first(x + m * ldx + k, n);
    for (int r = 0; r < R; r++) {
      typename Vec::T wv = Vec::load_first(w + r * ldw + k, n);
      for (int m = 0; m < MB; m++) acc[r][m] = Vec::fma(wv, xv[m], acc[r][m]);
    }
  }
  for (int m = 0; m < MB; m++)
    for (int r = 0; r < R; r++)
      y[m * ldy + r] = Vec::sum(acc[r][m]) + (bias != nullptr ? bias[r] : 0.0f);
}

// R rows of W against every row of x: 8 rows of x per pass, then 4, then one at a time
template <int R>
void rows_of_w(const float *x, int64_t M, int64_t ldx, int64_t K, const float *w, int64_t ldw,
               float *y, int64_t ldy, const float *bias) {
  const bool pf = g_prefetch.load(std::memory_order_relaxed);
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) tile<R, 8>(x + m * ldx, ldx, K, w, ldw, y + m * ldy, ldy, bias, pf);
  for (; m + 4 <= M; m += 4) tile<R, 4>(x + m * ldx, ldx, K, w, ldw, y + m * ldy, ldy, bias, pf);
  for (; m < M; m++) tile<R, 1>(x + m * ldx, ldx, K, w, ldw, y + m * ldy, ldy, bias, pf);
}

// rows [n0, n1) of W in blocks of R, then one at a time
template <int R>
void range_of_w(const float *x, int64_t M, int64_t ldx, int64_t K, const float *w, int64_t ldw,
                float *y, int64_t N, const float *bias, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R)
    rows_of_w<R>(x, M, ldx, K, w + n * ldw, ldw, y + n, N, bias != nullptr ? bias + n : nullptr);
  for (; n < n1; n++)
    rows_of_w<1>(x, M, ldx, K, w + n * ldw, ldw, y + n, N, bias != nullptr ? bias + n : nullptr);
}

// Weight floats a thread streams at least: a smaller product runs on one thread, whose
// start-up would cost more than the split saves (a [128, 512] weight is two such shares).
constexpr int64_t kShareFloats = 32768;

template <int R>
void product(const float *x, int64_t M, int64_t ldx, int64_t K, const float *w, int64_t ldw,
             float *y, int64_t N, const float *bias) {
  const int64_t blocks = N / R;
  const int64_t grain = std::max<int64_t>(1, kShareFloats / std::max<int64_t>(1, R * K));
  if (blocks <= grain) {
    range_of_w<R>(x, M, ldx, K, w, ldw, y, N, bias, 0, N);
    return;
  }
  const int threads = static_cast<int>(
      std::min<int64_t>(at::get_num_threads(), (blocks + grain - 1) / grain));
  // PyTorch's OpenMP runtime (libgomp is loaded once per process): its threads, not new ones
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b0 = blocks * t / T, b1 = blocks * (t + 1) / T;
    range_of_w<R>(x, M, ldx, K, w, ldw, y, N, bias, b0 * R, b1 == blocks ? N : b1 * R);
  }
}

// Several weights against the same x (a layer's q/k/v or gate/up projections): their rows in one
// parallel region instead of one region per weight. Each weight keeps its own blocks of R rows
// from its row 0, as product<R> makes them, so every output is the sum product<R> computes for
// it, bit for bit; the threads share the blocks of all weights, in order, as evenly as product
// shares one weight's. Outputs go to y [M, sum N_i] at column offsets off_i (ldy = sum N_i).
struct Part {
  const float *w;
  int64_t ldw, N, off;
  const float *bias;
};

template <int R>
void parts_product(const float *x, int64_t M, int64_t ldx, int64_t K, const Part *parts, int n,
                   float *y, int64_t ldy) {
  int64_t starts[4] = {0, 0, 0, 0};  // first block of part i in the shared numbering
  int64_t blocks = 0;
  for (int i = 0; i < n; i++) {
    starts[i] = blocks;
    blocks += (parts[i].N + R - 1) / R;  // a part's last block may be short: its tail rows
  }
  // blocks [b0, b1) of the shared numbering: each part's share, its tail with its last block
  auto run = [&](int64_t b0, int64_t b1) {
    for (int i = 0; i < n; i++) {
      const Part &p = parts[i];
      const int64_t first = starts[i], last = starts[i] + (p.N + R - 1) / R;
      const int64_t lo = std::max(b0, first), hi = std::min(b1, last);
      if (lo >= hi) continue;
      const int64_t n0 = (lo - first) * R, n1 = hi == last ? p.N : (hi - first) * R;
      range_of_w<R>(x, M, ldx, K, p.w, p.ldw, y + p.off, ldy, p.bias, n0, n1);
    }
  };
  const int64_t grain = std::max<int64_t>(1, kShareFloats / std::max<int64_t>(1, R * K));
  if (blocks <= grain) {
    run(0, blocks);
    return;
  }
  const int threads = static_cast<int>(
      std::min<int64_t>(at::get_num_threads(), (blocks + grain - 1) / grain));
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    run(blocks * t / T, blocks * (t + 1) / T);
  }
}
#endif

bool fast_path(const at::Tensor &x, const at::Tensor &w_t, const std::optional<at::Tensor> &bias) {
  if (kVectorBits == 0 || x.dim() != 2 || w_t.dim() != 2 || x.size(1) != w_t.size(0))
    return false;
  for (const at::Tensor *t : {&x, &w_t})
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || t->is_conj() || t->is_neg())
      return false;
  if (x.size(1) > 1 && (x.stride(1) != 1 || w_t.stride(0) != 1)) return false;
  if (bias.has_value()) {
    const at::Tensor &b = *bias;
    if (!b.device().is_cpu() || b.scalar_type() != at::kFloat || b.dim() != 1 ||
        b.size(0) != w_t.size(1) || (b.size(0) > 1 && b.stride(0) != 1))
      return false;
  }
  return true;
}

at::Tensor gemv(const at::Tensor &x, const at::Tensor &w_t, const std::optional<at::Tensor> &bias,
                int64_t /*abi*/) {
  if (!fast_path(x, w_t, bias))
    return bias.has_value() ? at::addmm(*bias, x, w_t) : at::mm(x, w_t);
  const int64_t M = x.size(0), K = x.size(1), N = w_t.size(1);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  const float *b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // W row n starts at w_t's column n: offset n * w_t.stride(1)
  const float *xp = x.data_ptr<float>(), *wp = w_t.data_ptr<float>();
  float *yp = y.data_ptr<float>();
  if (M >= 8)  // 3 x 8 accumulators
    product<3>(xp, M, x.stride(0), K, wp, w_t.stride(1), yp, N, b);
  else  // 4 x 4 at most
    product<4>(xp, M, x.stride(0), K, wp, w_t.stride(1), yp, N, b);
#endif
  return y;
}

// cat([x @ w0 (+ b0), x @ w1 (+ b1), x @ w2 (+ b2)], dim=1): the products of x with 2 or 3
// weights (w2 None: 2), computed in one parallel region when all of them take the fast path,
// else each by gemv() (ATen's mm/addmm when it cannot take the fast path) and concatenated.
at::Tensor gemv_cat(const at::Tensor &x, const at::Tensor &w0, const at::Tensor &w1,
                    const std::optional<at::Tensor> &w2, const std::optional<at::Tensor> &b0,
                    const std::optional<at::Tensor> &b1, const std::optional<at::Tensor> &b2,
                    int64_t abi) {
  const at::Tensor *ws[3] = {&w0, &w1, w2.has_value() ? &*w2 : nullptr};
  const std::optional<at::Tensor> *bs[3] = {&b0, &b1, &b2};
  const int n = ws[2] != nullptr ? 3 : 2;
  TORCH_CHECK(n == 3 || !b2.has_value(), "torchair_native::gemv_cat: b2 is given without w2");
  bool fast = true;
  for (int i = 0; i < n; i++) fast = fast && fast_path(x, *ws[i], *bs[i]);
  if (!fast) {
    std::vector<at::Tensor> outs;
    for (int i = 0; i < n; i++) outs.push_back(gemv(x, *ws[i], *bs[i], abi));
    return at::cat(outs, 1);
  }
  const int64_t M = x.size(0), K = x.size(1);
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += ws[i]->size(1);
  at::Tensor y = at::empty({M, total}, x.options());
  if (M == 0 || total == 0) return y;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  Part parts[3];
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const at::Tensor &w = *ws[i];
    parts[i] = Part{w.data_ptr<float>(), w.stride(1), w.size(1), off,
                    bs[i]->has_value() ? (*bs[i])->data_ptr<float>() : nullptr};
    off += w.size(1);
  }
  if (M >= 8)
    parts_product<3>(x.data_ptr<float>(), M, x.stride(0), K, parts, n, y.data_ptr<float>(), total);
  else
    parts_product<4>(x.data_ptr<float>(), M, x.stride(0), K, parts, n, y.data_ptr<float>(), total);
#endif
  return y;
}

std::unique_ptr<torch::Library> g_def, g_impl;

}  // namespace

extern "C" {

// 512 (AVX-512), 256 (AVX2 + FMA) or 0: the vector width of the fast path (0: none, every call
// is ATen's mm/addmm)
int torchair_gemm_vector_bits(void) { return kVectorBits; }

// Whether products prefetch the next block of W (1, the default) or not (0):
// for benches that time both in one process.
void torchair_gemm_set_prefetch(int on) { g_prefetch.store(on != 0); }

// Registers torchair_native::gemv (a FRAGMENT of the namespace launch_ops.cpp defines); 0 on
// success, else 1 with the reason in err.
int torchair_gemm_register(char *err, int err_size) {
  if (g_def) return 0;
  try {
    // `abi`: as launch_ops.cpp's, a number naming the schema that units pass, so that code
    // Inductor compiled for another schema is never found again in its cache
    auto def = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "torchair_native",
                                                std::nullopt, __FILE__, __LINE__);
    def->def("gemv(Tensor x, Tensor w_t, Tensor? bias=None, int abi=0) -> Tensor");
    def->def("gemv_cat(Tensor x, Tensor w0, Tensor w1, Tensor? w2=None, Tensor? b0=None, "
             "Tensor? b1=None, Tensor? b2=None, int abi=0) -> Tensor");
    auto impl = std::make_unique<torch::Library>(torch::Library::IMPL, "torchair_native",
                                                 c10::DispatchKey::CPU, __FILE__, __LINE__);
    impl->impl("gemv", &gemv);
    impl->impl("gemv_cat", &gemv_cat);
    g_def = std::move(def);
    g_impl = std::move(impl);
  } catch (const std::exception &e) {
    std::snprintf(err, err_size, "%s", e.what());
    return 1;
  }
  return 0;
}
}
