// Launch kernels: torchair's CPU decode attention as a PyTorch operator implemented in C++.
//
// torchair_native::ifa_decode takes the arguments of npu_incre_flash_attention_tensor that a
// decode step uses (query, key, value, lengths, block table, heads, layout, block size, scale)
// and calls the native kernel of decode_attention.c directly: the dispatcher reaches it from
// Inductor's generated Python, its C++ wrapper or an AOTInductor library without entering Python.
// Shapes, layouts and strides are read from the tensors; the kernel is handed to this library
// once (torchair_launch_set_decode) by the Python loader, which loads decode_attention.c's library.
//
// Per call it checks the values the general op checks (a negative length: ValueError; a block id
// that a window reads and that is not a block of the cache: ValueError naming block_table[b, c];
// same texts as the general op) and clamps lengths to the cache as the tensor twin does.
// Arguments it does not take (another dtype or device, a head dim that is not a multiple of 16,
// more than 64 query heads per kv head, K and V with different strides, ...) go through the
// dispatcher to npu::npu_incre_flash_attention_tensor, so results and errors never differ from
// the general op. Callers (torchair.runtime.binders.attention) run the general op's shape validation
// once, before they use this operator for a signature.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
typedef int (*decode_fn_t)(const float *q, const float *bias, const void *k, const void *v,
                           int kind, int64_t sb, int64_t sh, int64_t sp, const void *table,
                           int table_i32, int64_t table_stride, int64_t block_size,
                           int64_t num_blocks, const int64_t *lo, const int64_t *hi,
                           const uint8_t *mask, int64_t mask_stride, int batch, int nkv, int G,
                           int D, int splits, int nthreads, float *part_m, float *part_l,
                           float *part_acc, float *out, float *out_l, float scale, int q_bf16,
                           int64_t *err);
}

namespace {

decode_fn_t g_decode = nullptr;

// Deferred errors (defer_errors=True, what static units pass): the first ValueError of a run is
// kept here instead of thrown, and the call returns zeros; the unit reads it after the run
// (torchair_launch_take_error) and raises it as a Python ValueError. A C++ exception thrown
// through Inductor's C++ wrapper or an AOTInductor library would reach Python as a RuntimeError
// with a C++ stack instead of the ValueError eager raises.
thread_local std::string t_pending;
thread_local bool t_has_pending = false;
void uncount_pending();
// a thread that ends holding an error takes it out of the count (below) as it goes
struct PendingAtExit {
  ~PendingAtExit() {
    if (t_has_pending) uncount_pending();
  }
};
thread_local PendingAtExit t_pending_at_exit;

struct Deferred {};  // thrown by fail() when the error was kept

}  // namespace

// How many threads hold a deferred error: a unit reads it (a plain int, through ctypes) after
// each run and asks for its thread's error only when it is not zero. A thread's own error is
// counted before its run returns, so that thread never misses it; another thread's only costs
// an empty take.
extern "C" int torchair_launch_pending = 0;

namespace {

void uncount_pending() { __atomic_sub_fetch(&torchair_launch_pending, 1, __ATOMIC_SEQ_CST); }

[[noreturn]] void fail(bool defer, const std::string &msg) {
  if (defer) {
    if (!t_has_pending) {
      (void)&t_pending_at_exit;  // constructed in this thread: its destructor runs at exit
      t_pending = msg, t_has_pending = true;
      __atomic_add_fetch(&torchair_launch_pending, 1, __ATOMIC_SEQ_CST);
    }
    throw Deferred{};
  }
  TORCH_CHECK_VALUE(false, msg);
}

constexpr int kMaxG = 64, kMaxD = 512;
// as torchair.ops.attention.cpu.native's MIN_SPLIT, MIN_SPLIT_ONE and _SERIAL_WORK
constexpr int64_t kMinSplit = 128, kMinSplitOne = 64, kSerialWork = 256;
const char *kOp = "npu_incre_flash_attention";

// Everything the kernel needs that the shapes decide.
struct Canon {
  int kind = 0;
  int64_t batch = 0, nkv = 0, group = 0, dim = 0, kv_len = 0;
  int64_t sb = 0, sh = 0, sp = 0;  // element strides of K/V: batch or block, head, position
  int64_t block_size = 1, num_blocks = 0;
};

int kind_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    default: return -1;
  }
}

// layout: 0 BSH, 1 BNSD, 2 BSND. False when the kernel does not take the arguments. q_len:
// nullptr for a decode call (one query token); else it receives the query's S_q (any >= 1).
bool canonical(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
               const std::optional<at::Tensor> &table, int64_t num_heads, int64_t nkv_arg,
               int64_t layout, int64_t block_size, Canon *c, int64_t *q_len = nullptr) {
  if (g_decode == nullptr || !q.device().is_cpu() || !k.device().is_cpu() ||
      !v.device().is_cpu() || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type() || kind_of(q.scalar_type()) < 0 || num_heads < 1)
    return false;
  if (k.sizes() != v.sizes() || k.strides() != v.strides()) return false;
  c->kind = kind_of(q.scalar_type());
  c->nkv = nkv_arg > 0 ? nkv_arg : num_heads;
  if (num_heads % c->nkv) return false;
  c->group = num_heads / c->nkv;
  c->batch = q.size(0);
  const int s_dim = layout == 1 ? 2 : 1;  // the query's S_q dimension
  if (layout < 0 || layout > 2 || q.dim() != (layout == 0 ? 3 : 4) || q.size(s_dim) < 1 ||
      (q_len == nullptr && q.size(s_dim) != 1))
    return false;
  if (q_len != nullptr) *q_len = q.size(s_dim);
  if (layout == 0) {
    if (q.size(2) % num_heads) return false;
    c->dim = q.size(2) / num_heads;
  } else if (layout == 1) {
    if (q.size(1) != num_heads) return false;
    c->dim = q.size(3);
  } else {
    if (q.size(2) != num_heads) return false;
    c->dim = q.size(3);
  }
  if (c->group > kMaxG || c->dim < 16 || c->dim > kMaxD || c->dim % 16) return false;
  const int64_t D = c->dim, H = c->nkv * D;
  if (table.has_value()) {
    const at::Tensor &t = *table;
    if (!t.device().is_cpu() || t.dim() != 2 || t.size(0) != c->batch || t.stride(1) != 1 ||
        (t.scalar_type() != at::kInt && t.scalar_type() != at::kLong) || block_size < 1)
      return false;
    c->block_size = block_size;
    c->num_blocks = k.size(0);
    c->kv_len = t.size(1) * block_size;
    if (k.dim() == 3) {  // (blocknum, block_size, H_kv)
      if (k.size(1) != block_size || k.size(2) != H || k.stride(2) != 1) return false;
      c->sb = k.stride(0), c->sh = D, c->sp = k.stride(1);
    } else if (k.dim() == 4 && layout == 1) {  // (blocknum, N_kv, block_size, D)
      if (k.size(1) != c->nkv || k.size(2) != block_size || k.size(3) != D || k.stride(3) != 1)
        return false;
      c->sb = k.stride(0), c->sh = k.stride(1), c->sp = k.stride(2);
    } else {
      return false;
    }
    return true;
  }
  if (k.size(0) != c->batch) return false;
  if (layout == 0) {  // [B, S, H_kv]
    if (k.dim() != 3 || k.size(2) != H || k.stride(2) != 1) return false;
    c->kv_len = k.size(1), c->sb = k.stride(0), c->sh = D, c->sp = k.stride(1);
  } else if (layout == 1) {  // [B, N_kv, S, D]
    if (k.dim() != 4 || k.size(1) != c->nkv || k.size(3) != D || k.stride(3) != 1) return false;
    c->kv_len = k.size(2), c->sb = k.stride(0), c->sh = k.stride(1), c->sp = k.stride(2);
  } else {  // [B, S, N_kv, D]
    if (k.dim() != 4 || k.size(2) != c->nkv || k.size(3) != D || k.stride(3) != 1) return false;
    c->kv_len = k.size(1), c->sb = k.stride(0), c->sh = k.stride(2), c->sp = k.stride(1);
  }
  return true;
}

const char *layout_name(int64_t layout) {
  return layout == 1 ? "BNSD" : layout == 2 ? "BSND" : "BSH";
}

// The general op (torchair's Python implementation, registered by the loader as
// torchair_native::ifa_general_tensor: npu::npu_incre_flash_attention_tensor's own CPU kernel is
// the entry below), through the dispatcher (boxed: its 22 arguments in schema order).
at::Tensor general(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   const std::optional<at::Tensor> &lengths,
                   const std::optional<at::Tensor> &table, int64_t num_heads, int64_t nkv,
                   int64_t layout, int64_t block_size, double scale) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "torchair_native::ifa_general_tensor", "");
  torch::jit::Stack stack;
  stack.reserve(22);
  stack.emplace_back(q);
  stack.emplace_back(k);
  stack.emplace_back(v);
  stack.emplace_back();         // padding_mask
  stack.emplace_back();         // atten_mask
  stack.emplace_back();         // pse_shift
  stack.emplace_back(lengths);  // actual_seq_lengths
  stack.emplace_back();         // antiquant_scale
  stack.emplace_back();         // antiquant_offset
  stack.emplace_back(table);    // block_table
  for (int i = 0; i < 6; i++) stack.emplace_back();  // dequant/quant scales, kv_padding_size
  stack.emplace_back(num_heads);
  stack.emplace_back(scale);
  stack.emplace_back(std::string(layout_name(layout)));
  stack.emplace_back(nkv);
  stack.emplace_back(block_size);
  stack.emplace_back(int64_t(1));  // inner_precise
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

// (threads, splits per sequence) of a kernel call over `batch` sequences of `nkv` kv heads and
// at most `window` positions, as torchair.ops.attention.cpu.native.work_split decides them.
void work_split(int64_t batch, int64_t nkv, int64_t window, int64_t *threads, int64_t *splits) {
  *threads = std::max<int64_t>(1, at::get_num_threads());
  if (batch * nkv * window < kSerialWork) *threads = 1;
  *splits = 1;
  if (*threads > 1 && batch == 1) {
    *splits = std::max<int64_t>(1, std::min(*threads, window / kMinSplitOne));
  } else if (*threads > 1 && batch < 4 * *threads) {
    *splits =
        std::max<int64_t>(1, std::min((4 * *threads + batch - 1) / batch, window / kMinSplit));
    while (*splits > 1 && (batch * *splits) % *threads) --*splits;
  }
}

// The general op's error for block_table[b, c] = id, a block sequence b reads (positions
// [0, hi)) that the cache of `num_blocks` blocks does not have.
[[noreturn]] void fail_block_id(bool defer, const char *op, int64_t b, int64_t c, int64_t id,
                                int64_t num_blocks, int64_t hi) {
  std::ostringstream msg;
  msg << op << ": block_table[" << b << ", " << c << "] = " << id
      << " is not a block of the KV cache (it has " << num_blocks << " blocks, ids 0.."
      << num_blocks - 1 << "), but sequence " << b << " reads positions [0, " << hi
      << ") of it; fix the block table";
  fail(defer, msg.str());
}

// Page attention's checks of host lengths (a list in the traced call; eager checks them when
// it validates): the block table is wide enough and the cache has enough blocks for all batches.
// `lengths`: one per batch, >= 0.
void check_paged_lengths(const char *op, const char *name, const std::vector<int64_t> &lengths,
                         int64_t width, int64_t num_blocks, int64_t block_size, bool defer) {
  int64_t most = 0, longest = 0, sum = 0;
  for (int64_t x : lengths) {
    const int64_t need = (x + block_size - 1) / block_size;
    most = std::max(most, need), longest = std::max(longest, x), sum += need;
  }
  if (width < most)
    fail(defer, std::string(op) + ": block_table second dim " + std::to_string(width) +
                    " must be >= maxBlockNumPerSeq=" + std::to_string(most) + " (ceil(max(" +
                    name + ")=" + std::to_string(longest) + " / block_size=" +
                    std::to_string(block_size) + "))");
  if (num_blocks < sum)
    fail(defer, std::string(op) + ": KV cache blocknum " + std::to_string(num_blocks) +
                    " must be >= the blocks needed by all batches, sum(ceil(" + name +
                    " / block_size)) = " + std::to_string(sum));
}

// The elements of a float32 tensor of any layout, in row-major order, at dst; returns dst.
const float *pack_rows(const at::Tensor &t, float *dst) {
  const int64_t nd = t.dim();
  const float *src = t.const_data_ptr<float>();
  if (nd == 0) {
    *dst = *src;
    return dst;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t inner = sizes[nd - 1], step = strides[nd - 1];
  const int64_t outer = inner ? t.numel() / inner : 0;
  std::vector<int64_t> idx(nd - 1, 0);
  float *row = dst;
  for (int64_t o = 0; o < outer; o++, row += inner) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd - 1; d++) off += idx[d] * strides[d];
    if (step == 1)
      std::memcpy(row, src + off, inner * sizeof(float));
    else
      for (int64_t i = 0; i < inner; i++) row[i] = src[off + i * step];
    for (int64_t d = nd - 2; d >= 0 && ++idx[d] == sizes[d]; d--) idx[d] = 0;
  }
  return dst;
}

at::Tensor ifa_decode_impl(const at::Tensor &query, const at::Tensor &key,
                           const at::Tensor &value, const std::optional<at::Tensor> &lengths,
                           at::OptionalIntArrayRef ends,
                           const std::optional<at::Tensor> &block_table, int64_t num_heads,
                           int64_t num_key_value_heads, int64_t layout, int64_t block_size,
                           double scale_value, bool defer, bool host_lengths = false) {
  Canon c;
  if (!canonical(query, key, value, block_table, num_heads, num_key_value_heads, layout,
                 block_size, &c)) {
    std::optional<at::Tensor> L = lengths;
    if (ends.has_value())  // checked and clamped host lengths: the twin gives the same result
      L = at::tensor(*ends, at::TensorOptions().dtype(at::kLong));
    return general(query, key, value, L, block_table, num_heads, num_key_value_heads, layout,
                   block_size, scale_value)
        .contiguous();
  }
  const int64_t B = c.batch;
  std::vector<int64_t> hi(B), lo(B, 0);
  if (ends.has_value()) {  // the caller checked and clamped them
    TORCH_CHECK(int64_t(ends->size()) == B, "torchair_native::ifa_decode: ", ends->size(),
                " window ends for batch ", B);
    for (int64_t b = 0; b < B; b++) hi[b] = (*ends)[b];
  } else if (lengths.has_value()) {
    const at::Tensor &L = *lengths;
    if (!L.device().is_cpu() || L.scalar_type() != at::kLong || L.dim() != 1 ||
        (L.size(0) != B && L.size(0) != 1))
      return general(query, key, value, lengths, block_table, num_heads, num_key_value_heads,
                     layout, block_size, scale_value)
          .contiguous();
    const int64_t *p = L.const_data_ptr<int64_t>();
    const int64_t n = L.size(0), st = L.stride(0);
    for (int64_t i = 0; i < n; i++)
      if (p[i * st] < 0)
        fail(defer, std::string(kOp) + ": actual_seq_lengths[" + std::to_string(i) +
                        "]=" + std::to_string(p[i * st]) + " must be >= 0");
    for (int64_t b = 0; b < B; b++) hi[b] = p[(n == 1 ? 0 : b) * st];
    if (host_lengths && block_table.has_value())
      check_paged_lengths(kOp, "actual_seq_lengths", hi, block_table->size(1), c.num_blocks,
                          c.block_size, defer);
    for (int64_t b = 0; b < B; b++) hi[b] = std::min(hi[b], c.kv_len);
  } else {
    std::fill(hi.begin(), hi.end(), c.kv_len);
  }
  const int64_t window = *std::max_element(hi.begin(), hi.end());
  if (window <= 0)  // nothing attended anywhere
    return at::zeros_like(query, at::MemoryFormat::Contiguous);
  const int64_t rows = B * c.nkv;
  int64_t threads, splits;
  work_split(B, c.nkv, window, &threads, &splits);
  at::Tensor qf = query;
  // a float32 query with gaps between its rows (the query columns of a wider product, which a
  // grouped q/k/v product gives) is packed into the scratch buffer below: no tensor op
  const bool pack_q = query.scalar_type() == at::kFloat && !query.is_contiguous();
  if (query.scalar_type() != at::kFloat) qf = query.to(at::kFloat).contiguous();
  const int64_t G = c.group, D = c.dim, items = rows * splits;
  // one scratch buffer: part_m, part_l [items, G], part_acc [items, G, D], the softmax sums
  // [rows, G] (not returned), then the packed query; the output [rows, G, D] is the query's
  // shape (S_q = 1)
  const int64_t sums_end = items * G * (D + 2) + rows * G;
  at::Tensor scratch = at::empty({sums_end + (pack_q ? query.numel() : 0)},
                                 query.options().dtype(at::kFloat));
  at::Tensor out = at::empty(query.sizes(), query.options().dtype(at::kFloat));
  float *base = scratch.data_ptr<float>();
  const float *q = pack_q ? pack_rows(query, base + sums_end) : qf.const_data_ptr<float>();
  const void *tab = nullptr;
  bool i32 = false;
  int64_t tstride = 0;
  if (block_table.has_value()) {
    tab = block_table->const_data_ptr();
    i32 = block_table->scalar_type() == at::kInt;
    tstride = block_table->stride(0);
  }
  int64_t err[3] = {0, 0, 0};
  int rc = g_decode(q, nullptr, key.const_data_ptr(),
                    value.const_data_ptr(), c.kind, c.sb, c.sh, c.sp, tab, i32 ? 1 : 0, tstride,
                    c.block_size, c.num_blocks, lo.data(), hi.data(), nullptr, 0, int(B),
                    int(c.nkv), int(G), int(D), int(splits), int(threads), base, base + items * G,
                    base + 2 * items * G, out.data_ptr<float>(), base + items * G * (D + 2),
                    float(scale_value), query.scalar_type() == at::kBFloat16 ? 1 : 0, err);
  if (rc == -2) fail_block_id(defer, kOp, err[0], err[1], err[2], c.num_blocks, hi[err[0]]);
  TORCH_CHECK(rc == 0, "torchair_native::ifa_decode: the native kernel refused its arguments (",
              rc, ")");
  if (query.scalar_type() != at::kFloat) out = out.to(query.scalar_type());
  return out;
}

at::Tensor ifa_decode(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                      const std::optional<at::Tensor> &lengths, at::OptionalIntArrayRef ends,
                      const std::optional<at::Tensor> &block_table, int64_t num_heads,
                      int64_t num_key_value_heads, int64_t layout, int64_t block_size,
                      double scale_value, bool defer_errors, bool host_lengths,
                      int64_t /*abi: see the schemas*/) {
  try {
    return ifa_decode_impl(query, key, value, lengths, ends, block_table, num_heads,
                           num_key_value_heads, layout, block_size, scale_value, defer_errors,
                           host_lengths);
  } catch (const Deferred &) {
    return at::zeros_like(query, at::MemoryFormat::Contiguous);
  }
}


// ---------------------------------------------------------------------------------------------
// FIA prompt calls (S_q >= 1 query tokens) in a static unit: npu_fused_infer_attention_score's
// dense formula for what the decode kernel can express, every query token (b, i) as a row of its
// own with one contiguous window of KV positions (its batch's blocks; a dense cache is a paged one
// whose only block per batch is the whole sequence). An atten_mask of sparse modes 0 and 1 that is
// the same for every head drops positions inside the window (the kernel's per-row mask: a dropped
// position's V row is never read); modes 2-4 accept and ignore theirs, as the general op does.
// Taken: no per-head mask, pse_shift, antiquant, output quantization or padding; the lse output
// unused (bind_static_unit checks all that once). Positions outside a row's window are
// never read, so NaN/inf stored there cannot reach the result. The per-call value checks are the
// general op's, in its order and with its texts: actual_seq_lengths_kv >= 0 (and, when the KV
// lengths were a host list and the cache is paged, the block table's width and the cache's block
// count), actual_seq_lengths >= 0 (<= S_q when they were a host list), then the block ids each
// batch's window reads. host_lengths: bit 0 the query lengths, bit 1 the KV lengths were host
// lists in the traced call (sunk into the unit's buffer), which the general op checks further.
// wording: the error texts name FIA (0) or FIA v2 (1) and its arguments.
constexpr int64_t kIntMax = 2147483647;

// The op and argument names of the error texts: wording 0 FIA, 1 FIA v2 (its own names).
struct FiaNames {
  const char *op, *q_lengths, *kv_lengths;
};
FiaNames fia_names(int64_t wording) {
  if (wording == 1)
    return {"npu_fused_infer_attention_score_v2", "actual_seq_qlen", "actual_seq_kvlen"};
  return {"npu_fused_infer_attention_score", "actual_seq_lengths", "actual_seq_lengths_kv"};
}

// 1-D int64 CPU lengths of B or 1 entries (what a unit's sunk buffer slices are), as the
// general op checks them: >= 0, and for a host list of query lengths (a sunk list: `limit` =
// S_q) <= S_q. Empty: none given.
std::vector<int64_t> fia_lengths(const std::optional<at::Tensor> &lengths, int64_t B,
                                 const char *op, const char *name, int64_t limit, bool defer) {
  std::vector<int64_t> out;
  if (!lengths.has_value()) return out;
  const at::Tensor &L = *lengths;
  TORCH_CHECK(L.device().is_cpu() && L.scalar_type() == at::kLong && L.dim() == 1 &&
                  (L.size(0) == B || L.size(0) == 1),
              "torchair_native::fia_prompt: ", name, " must be a 1-D int64 CPU tensor of ", B,
              " or 1 entries (the unit was bound for that)");
  const int64_t *p = L.const_data_ptr<int64_t>();
  const int64_t n = L.size(0), st = L.stride(0);
  for (int64_t i = 0; i < n; i++) {
    const int64_t x = p[i * st];
    if (limit >= 0 && (x < 0 || x > limit))
      fail(defer, std::string(op) + ": " + name + "[" + std::to_string(i) + "]=" +
                      std::to_string(x) + " must be in [0, S_q=" + std::to_string(limit) +
                      "] (the valid query rows of batch " + std::to_string(i) + ")");
    if (x < 0)
      fail(defer, std::string(op) + ": " + name + "[" + std::to_string(i) +
                      "]=" + std::to_string(x) + " must be >= 0");
  }
  for (int64_t b = 0; b < B; b++) out.push_back(p[(n == 1 ? 0 : b) * st]);
  return out;
}

// The atten_mask of sparse modes 0/1 as one row of S bytes per query token (b, i), [B * S_q, S]
// (nonzero = masked out): 2-D [S_q, S] (S_q > 1) or [B|1, S] (S_q == 1), 3-D [B|1, S_q|1, S],
// 4-D [B|1, 1, S_q|1, S] (what bind_static_unit binds), bool / uint8 / int8. Copied only when it
// broadcasts or is strided.
at::Tensor fia_mask_rows(const at::Tensor &mask, int64_t B, int64_t Sq, int64_t S) {
  at::Tensor m = mask;
  if (m.dim() == 2) m = Sq > 1 ? m.unsqueeze(0) : m.unsqueeze(1);
  else if (m.dim() == 4) {
    TORCH_CHECK(m.size(1) == 1, "torchair_native::fia_prompt: a per-head atten_mask is not bound");
    m = m.select(1, 0);
  }
  const auto t = m.scalar_type();
  TORCH_CHECK(m.dim() == 3 && (m.size(0) == 1 || m.size(0) == B) &&
                  (m.size(1) == 1 || m.size(1) == Sq) && m.size(2) == S && m.device().is_cpu() &&
                  (t == at::kBool || t == at::kByte || t == at::kChar),
              "torchair_native::fia_prompt: the atten_mask is not one the unit was bound for "
              "(bool, uint8 or int8 on the CPU, broadcasting to [B, S_q, S_kv] = [", B, ", ",
              Sq, ", ", S, "])");
  return m.expand({B, Sq, S}).contiguous();  // bytes: nonzero = masked out
}

at::Tensor fia_prompt_impl(const at::Tensor &query, const at::Tensor &key,
                           const at::Tensor &value, const std::optional<at::Tensor> &q_lengths,
                           const std::optional<at::Tensor> &kv_lengths,
                           const std::optional<at::Tensor> &block_table, int64_t num_heads,
                           int64_t num_key_value_heads, int64_t layout, int64_t block_size,
                           double scale, int64_t sparse_mode, int64_t pre_tokens,
                           int64_t next_tokens, int64_t host_lengths, int64_t wording,
                           bool defer, const std::optional<at::Tensor> &atten_mask) {
  const FiaNames names = fia_names(wording);
  Canon c;
  int64_t Sq = 0;
  TORCH_CHECK(canonical(query, key, value, block_table, num_heads, num_key_value_heads, layout,
                        block_size, &c, &Sq),
              "torchair_native::fia_prompt: the kernel does not take these shapes (the unit "
              "was bound for others)");
  TORCH_CHECK(sparse_mode >= 0 && sparse_mode <= 4 && (sparse_mode != 1 || atten_mask),
              "torchair_native::fia_prompt: sparse_mode ", sparse_mode, " is not bound here");
  const int64_t B = c.batch, S = c.kv_len;
  // the general op's order: the KV lengths (with a paged cache and host lengths, the block table
  // is wide enough and the cache has the blocks), then the query's
  const std::vector<int64_t> kvl =
      fia_lengths(kv_lengths, B, names.op, names.kv_lengths, -1, defer);
  if (block_table.has_value() && (host_lengths & 2) && !kvl.empty())
    check_paged_lengths(names.op, names.kv_lengths, kvl, block_table->size(1), c.num_blocks,
                        c.block_size, defer);
  const std::vector<int64_t> ql = fia_lengths(q_lengths, B, names.op, names.q_lengths,
                                              (host_lengths & 1) ? Sq : -1, defer);
  std::vector<int64_t> skv(B, S);  // each batch's window [0, skv[b])
  for (int64_t b = 0; b < B && !kvl.empty(); b++) skv[b] = std::min(kvl[b], S);
  // block ids of each batch's window (the general op checks them before it computes)
  std::vector<int64_t> table_rows;
  const int64_t T = B * Sq;  // one kernel "batch" row per query token
  int64_t tcols = 1, bsize = S, nblocks = B, sb = c.sb;
  if (block_table.has_value()) {
    const at::Tensor &t = *block_table;
    const bool i32 = t.scalar_type() == at::kInt;
    const int64_t ts = t.stride(0);
    tcols = t.size(1), bsize = c.block_size, nblocks = c.num_blocks;
    auto id_at = [&](int64_t b, int64_t col) -> int64_t {
      return i32 ? int64_t(t.const_data_ptr<int32_t>()[b * ts + col])
                 : t.const_data_ptr<int64_t>()[b * ts + col];
    };
    for (int64_t b = 0; b < B; b++)
      for (int64_t col = 0; col < (skv[b] + bsize - 1) / bsize; col++) {
        const int64_t id = id_at(b, col);
        if (id < 0 || id >= nblocks) fail_block_id(defer, names.op, b, col, id, nblocks, skv[b]);
      }
    table_rows.resize(T * tcols);
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < Sq; i++)
        for (int64_t col = 0; col < tcols; col++)
          table_rows[(b * Sq + i) * tcols + col] = id_at(b, col);
  } else {  // dense: batch b's whole sequence is block b
    table_rows.resize(T);
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < Sq; i++) table_rows[b * Sq + i] = b;
  }
  // each query token's window (the module doc of fused_infer_attention_score.py); rows past
  // actual_seq_lengths and empty windows give zeros
  std::vector<int64_t> lo(T, 0), hi(T, 0);
  int64_t window = 0;
  // bands beyond any position (the general op compares Python ints): clamped so that the window
  // arithmetic below cannot overflow; INT_MAX and above still mean "no bound" in mode 0
  constexpr int64_t kBand = int64_t(1) << 62;
  pre_tokens = std::clamp(pre_tokens, -kBand, kBand);
  next_tokens = std::clamp(next_tokens, -kBand, kBand);
  for (int64_t b = 0; b < B; b++) {
    const int64_t sq = ql.empty() ? Sq : ql[b], n = skv[b];
    for (int64_t i = 0; i < std::min(sq, Sq); i++) {
      int64_t l = 0, h = n;
      const int64_t diag = i + n - sq;  // modes 3 and 4: the bottom-right aligned diagonal
      if (sparse_mode == 1) {  // allMask: the mask alone
      } else if (sparse_mode == 0) {
        if (pre_tokens < kIntMax || next_tokens < kIntMax)
          l = std::max<int64_t>(0, i - pre_tokens), h = std::min(n, i + next_tokens + 1);
      } else if (sparse_mode == 2) {
        h = std::min(n, i + 1);
      } else if (sparse_mode == 3) {
        h = std::min(n, diag + 1);
      } else {
        l = std::max<int64_t>(0, diag - pre_tokens), h = std::min(n, diag + next_tokens + 1);
      }
      if (h > l) lo[b * Sq + i] = l, hi[b * Sq + i] = h, window = std::max(window, h - l);
    }
  }
  if (window <= 0) return at::zeros_like(query, at::MemoryFormat::Contiguous);
  at::Tensor mask_rows;  // modes 0/1: [T, S] bytes the kernel reads at each row's positions
  if (atten_mask.has_value() && sparse_mode <= 1) mask_rows = fia_mask_rows(*atten_mask, B, Sq, S);
  // the query as [T * N_kv, G, D] float32 (token-major, as BSH / BSND are)
  at::Tensor qf = layout == 1 ? query.transpose(1, 2) : query;
  qf = qf.to(at::kFloat).contiguous();
  const int64_t rows = T * c.nkv, G = c.group, D = c.dim;
  int64_t threads, splits;
  work_split(T, c.nkv, window, &threads, &splits);
  const int64_t items = rows * splits;
  at::Tensor scratch =
      at::empty({items * G * (D + 2) + rows * G}, query.options().dtype(at::kFloat));
  at::Tensor out = at::empty(qf.sizes(), query.options().dtype(at::kFloat));
  float *base = scratch.data_ptr<float>();
  int64_t err[3] = {0, 0, 0};
  int rc = g_decode(qf.const_data_ptr<float>(), nullptr, key.const_data_ptr(),
                    value.const_data_ptr(), c.kind, sb, c.sh, c.sp, table_rows.data(), 0, tcols,
                    bsize, nblocks, lo.data(), hi.data(),
                    mask_rows.defined() ? static_cast<const uint8_t *>(mask_rows.const_data_ptr())
                                        : nullptr,
                    mask_rows.defined() ? S : 0, int(T), int(c.nkv), int(G),
                    int(D), int(splits), int(threads), base, base + items * G,
                    base + 2 * items * G, out.data_ptr<float>(), base + items * G * (D + 2),
                    float(scale), query.scalar_type() == at::kBFloat16 ? 1 : 0, err);
  TORCH_CHECK(rc == 0, "torchair_native::fia_prompt: the native kernel refused its arguments (",
              rc, ")");
  if (layout == 1) out = out.transpose(1, 2).contiguous();
  if (query.scalar_type() != at::kFloat) out = out.to(query.scalar_type());
  return out;
}

at::Tensor fia_prompt(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                      const std::optional<at::Tensor> &q_lengths,
                      const std::optional<at::Tensor> &kv_lengths,
                      const std::optional<at::Tensor> &block_table, int64_t num_heads,
                      int64_t num_key_value_heads, int64_t layout, int64_t block_size,
                      double scale, int64_t sparse_mode, int64_t pre_tokens, int64_t next_tokens,
                      int64_t host_lengths, int64_t wording, bool defer_errors,
                      const std::optional<at::Tensor> &atten_mask, int64_t /*abi*/) {
  try {
    return fia_prompt_impl(query, key, value, q_lengths, kv_lengths, block_table, num_heads,
                           num_key_value_heads, layout, block_size, scale, sparse_mode,
                           pre_tokens, next_tokens, host_lengths, wording, defer_errors,
                           atten_mask);
  } catch (const Deferred &) {
    return at::zeros_like(query, at::MemoryFormat::Contiguous);
  }
}

// ---------------------------------------------------------------------------------------------
// Eager entry: the CPU kernel of npu::npu_incre_flash_attention and of its tensor twin (boxed,
// the ops' 22 arguments). A call the decode kernel takes runs here without Python; anything
// else, a signature seen for the first time (the general op validates it once: its errors are
// the general op's), a length or block id the general op must report, runs the general op
// (torchair_native::ifa_general[_tensor], torchair's Python implementation).

std::atomic<bool> g_eager_on{true};  // torchair.ops.attention.ifa_fast.disabled() turns it off
std::mutex g_sig_mutex;
std::set<std::vector<int64_t>> g_signatures;  // validated by the general op
std::atomic<uint64_t> g_sig_epoch{0};         // bumped whenever signatures are forgotten
constexpr size_t kMaxSignatures = 256;

bool native_disabled() {  // TORCHAIR_NATIVE_KERNELS=0 / false / off / no (read per call)
  const char *e = std::getenv("TORCHAIR_NATIVE_KERNELS");
  if (e == nullptr) return false;
  std::string v;
  for (const char *p = e; *p; p++)
    if (!std::isspace(static_cast<unsigned char>(*p)))
      v.push_back(char(std::tolower(static_cast<unsigned char>(*p))));
  return v == "0" || v == "false" || v == "off" || v == "no";
}

void add_tensor(std::vector<int64_t> &sig, const at::Tensor &t) {
  sig.push_back(int64_t(t.scalar_type()));
  sig.push_back(int64_t(t.device().type()));
  sig.push_back(t.dim());
  for (auto x : t.sizes()) sig.push_back(x);
  for (auto x : t.strides()) sig.push_back(x);
}

constexpr int kArgs = 22;  // the schema's arguments

int64_t layout_code(const std::string &name) {  // -1: not a layout the kernel takes
  return name == "BSH" ? 0 : name == "BNSD" ? 1 : name == "BSND" ? 2 : -1;
}

// The validation signature of a call: the shapes, strides, dtypes, devices and options the
// general op checks once (with *layout and *count, the number of lengths or -1 for none).
// False for a call the eager entry never takes (a mask, pse_shift, quantization, padding,
// another layout, lengths of another form).
bool signature_of(const c10::IValue *a, bool twin, std::vector<int64_t> *sig, int64_t *layout,
                  int64_t *count) {
  static const int none_args[] = {3, 4, 5, 7, 8, 10, 11, 12, 13, 14, 15};
  for (int i : none_args)
    if (!a[i].isNone()) return false;
  if (!a[0].isTensor() || !a[1].isTensor() || !a[2].isTensor() || !a[16].isInt() ||
      !a[17].isDouble() || !a[18].isString() || !a[19].isInt() || !a[20].isInt() ||
      !a[21].isInt() || !(a[9].isNone() || a[9].isTensor()))
    return false;
  *layout = layout_code(a[18].toStringRef());
  if (*layout < 0) return false;
  *count = -1;
  if (!a[6].isNone()) {
    if (twin) {
      if (!a[6].isTensor() || a[6].toTensor().dim() != 1) return false;
      *count = a[6].toTensor().size(0);
    } else {
      if (!a[6].isIntList()) return false;  // symbolic: not an eager call
      *count = int64_t(a[6].toIntList().size());
    }
  }
  *sig = {twin ? 1 : 0, a[16].toInt(), a[19].toInt(), *layout, a[20].toInt(), a[21].toInt(),
          *count};
  for (int i : {0, 1, 2}) add_tensor(*sig, a[i].toTensor());
  if (a[9].isTensor()) add_tensor(*sig, a[9].toTensor());
  return true;
}

// The result of a call the kernel takes, or nullopt (the general op runs).
std::optional<at::Tensor> eager_fast(c10::ArrayRef<c10::IValue> args, bool twin) {
  if (!g_eager_on.load(std::memory_order_relaxed) || g_decode == nullptr || native_disabled())
    return std::nullopt;
  const c10::IValue *a = args.data();
  std::vector<int64_t> sig;
  int64_t layout, count;
  if (!signature_of(a, twin, &sig, &layout, &count)) return std::nullopt;
  const int64_t inner = a[21].toInt();
  if (inner != 0 && inner != 1) return std::nullopt;
  const at::Tensor &q = a[0].toTensor(), &k = a[1].toTensor(), &v = a[2].toTensor();
  std::optional<at::Tensor> table;
  if (a[9].isTensor()) table = a[9].toTensor();
  const int64_t heads = a[16].toInt(), nkv = a[19].toInt(), bs = a[20].toInt();
  Canon c;
  if (!canonical(q, k, v, table, heads, nkv, layout, bs, &c)) return std::nullopt;
  const int64_t B = c.batch;
  if (count != -1 && count != B && count != 1) return std::nullopt;
  if (twin && count != -1) {
    const at::Tensor &lt = a[6].toTensor();
    if (!lt.device().is_cpu() || lt.scalar_type() != at::kLong) return std::nullopt;
  }
  thread_local std::vector<int64_t> t_last;  // the last signature this thread found
  thread_local uint64_t t_last_epoch = ~uint64_t(0);
  if (sig != t_last || t_last_epoch != g_sig_epoch.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_sig_mutex);
    if (!g_signatures.count(sig)) return std::nullopt;
    t_last = sig;
    t_last_epoch = g_sig_epoch.load(std::memory_order_relaxed);
  }
  std::vector<int64_t> ends(B, c.kv_len);
  if (count != -1) {
    std::vector<int64_t> lens(count);
    if (twin) {
      const at::Tensor &lt = a[6].toTensor();
      const int64_t *p = lt.const_data_ptr<int64_t>();
      for (int64_t i = 0; i < count; i++) lens[i] = p[i * lt.stride(0)];
    } else {
      lens = a[6].toIntVector();
    }
    int64_t need_max = 0, need_sum = 0;
    for (int64_t b = 0; b < B; b++) {
      const int64_t x = lens[count == 1 ? 0 : b];
      if (x < 0) return std::nullopt;  // the general op's ValueError
      if (table && !twin) {
        const int64_t need = (x + bs - 1) / bs;
        need_max = std::max(need_max, need);
        need_sum += need;
      }
      ends[b] = std::min(x, c.kv_len);
    }
    if (table && !twin && (need_max > table->size(1) || need_sum > c.num_blocks))
      return std::nullopt;  // the general op's table-width / blocknum ValueError
  }
  return ifa_decode_impl(q, k, v, std::nullopt, ends, table, heads, nkv, layout, bs,
                         a[17].toDouble(), false);
}

template <bool Twin>
void ifa_entry(const c10::OperatorHandle &, c10::DispatchKeySet, torch::jit::Stack *stack) {
  auto args = torch::jit::last(*stack, kArgs);
  if (auto out = eager_fast(args, Twin)) {
    torch::jit::drop(*stack, kArgs);
    stack->emplace_back(std::move(*out));
    return;
  }
  static const c10::OperatorHandle general_op = c10::Dispatcher::singleton().findSchemaOrThrow(
      Twin ? "torchair_native::ifa_general_tensor" : "torchair_native::ifa_general", "");
  std::vector<int64_t> sig;  // recorded once the general op took the call
  int64_t layout, count;
  if (!signature_of(args.data(), Twin, &sig, &layout, &count)) sig.clear();
  general_op.callBoxed(stack);  // raises the general op's errors: then nothing is recorded
  if (!sig.empty()) {
    std::lock_guard<std::mutex> lock(g_sig_mutex);
    if (g_signatures.size() >= kMaxSignatures) g_signatures.clear(), g_sig_epoch++;
    g_signatures.insert(std::move(sig));
  }
}

std::unique_ptr<torch::Library> g_npu_impl;

std::unique_ptr<torch::Library> g_def, g_impl;

}  // namespace

// Registration runs when the loader calls torchair_launch_register, not at dlopen: an error (the
// namespace registered already by another copy of this library) is returned as text, never
// thrown out of a static initializer.
extern "C" {
// The native decode kernel (torchair_decode_attention of decode_attention.c's library).
void torchair_launch_set_decode(void *fn) { g_decode = reinterpret_cast<decode_fn_t>(fn); }

// The error a deferred call kept in this thread (copied into buf, NUL-terminated), cleared:
// returns its length, 0 when there is none.
int torchair_launch_take_error(char *buf, int size) {
  if (!t_has_pending) return 0;
  std::snprintf(buf, size, "%s", t_pending.c_str());
  int n = int(t_pending.size());
  t_pending.clear();
  t_has_pending = false;
  uncount_pending();
  return n > 0 ? n : 1;
}

// Turns the eager entry on or off (torchair.ops.attention.ifa_fast.disabled) and forgets the
// validated signatures (tests; a kernel library rebuilt).
void torchair_launch_set_eager(int on) { g_eager_on.store(on != 0); }
void torchair_launch_clear(void) {
  std::lock_guard<std::mutex> lock(g_sig_mutex);
  g_signatures.clear();
  g_sig_epoch++;
}

// Registers torchair_native::ifa_decode and ::fia_prompt; with npu_entry, also the eager entry as the CPU kernel
// of npu::npu_incre_flash_attention[_tensor] (only when torchair defined those ops, and after
// the loader defined torchair_native::ifa_general[_tensor]).
int torchair_launch_register(int npu_entry, char *err, int err_size) {
  if (g_def) return 0;
  try {
    // `abi`: the units' calls pass a number naming the schema (launch_fakes.py: abi; the kernels
    // ignore it). It makes a unit's graph, and so Inductor's cache key for it, change with the
    // schema: code Inductor compiled and cached for another schema (another argument count)
    // would otherwise be found again and called with the wrong arguments.
    auto def = std::make_unique<torch::Library>(torch::Library::DEF, "torchair_native",
                                                std::nullopt, __FILE__, __LINE__);
    def->def("ifa_decode(Tensor query, Tensor key, Tensor value, Tensor? actual_seq_lengths, "
             "int[]? ends, Tensor? block_table, int num_heads, int num_key_value_heads, "
             "int layout, int block_size, float scale_value, bool defer_errors=False, "
             "bool host_lengths=False, int abi=0) -> Tensor");
    auto impl = std::make_unique<torch::Library>(torch::Library::IMPL, "torchair_native",
                                                 c10::DispatchKey::CPU, __FILE__, __LINE__);
    def->def("fia_prompt(Tensor query, Tensor key, Tensor value, Tensor? actual_seq_lengths, "
             "Tensor? actual_seq_lengths_kv, Tensor? block_table, int num_heads, "
             "int num_key_value_heads, int layout, int block_size, float scale, "
             "int sparse_mode, int pre_tokens, int next_tokens, int host_lengths=0, "
             "int wording=0, bool defer_errors=False, Tensor? atten_mask=None, "
             "int abi=0) -> Tensor");
    impl->impl("ifa_decode", &ifa_decode);
    impl->impl("fia_prompt", &fia_prompt);
    std::unique_ptr<torch::Library> npu;
    if (npu_entry) {
      npu = std::make_unique<torch::Library>(torch::Library::IMPL, "npu", c10::DispatchKey::CPU,
                                             __FILE__, __LINE__);
      npu->impl("npu_incre_flash_attention",
                torch::CppFunction::makeFromBoxedFunction<&ifa_entry<false>>());
      npu->impl("npu_incre_flash_attention_tensor",
                torch::CppFunction::makeFromBoxedFunction<&ifa_entry<true>>());
    }
    g_def = std::move(def);
    g_impl = std::move(impl);
    g_npu_impl = std::move(npu);
  } catch (const std::exception &e) {
    std::snprintf(err, err_size, "%s", e.what());
    return 1;
  }
  return 0;
}
}
