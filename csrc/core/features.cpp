// Feature extraction for cost units. The op -> formula rules are all in rule_table() below; the
// formulas above it turn an op's traced arguments into FLOPs, bytes and geometry, and the code
// below it adds the math mode, the tiling on the target GPU and the roofline times.
//
// Argument positions are those of the ATen schemas of torch 2.11-2.14 (checked with
// torch._C._jit_get_schemas_for_operator); the tracer records every schema argument, keyword-only
// ones included, in order.
#include "blink/features.h"
#include "blink/kernel_plan.h"
#include "blink/roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace blink {

std::string op_base_name(const std::string& op_name) {
  const size_t ns = op_name.find("::");
  const size_t dot = op_name.find('.', ns == std::string::npos ? 0 : ns + 2);
  return dot == std::string::npos ? op_name : op_name.substr(0, dot);
}

namespace {

using K = UnitKind;

// ---- tensors -------------------------------------------------------------------------------

int64_t numel_of(const TensorInfo& t) {
  int64_t n = 1;
  for (int64_t s : t.sizes) {
    if (s <= 0) return 0;
    n *= s;
  }
  return n;
}

// Elements the tensor's memory holds: a stride-0 (broadcast) dimension is stored once.
int64_t stored_elements(const TensorInfo& t) {
  int64_t n = 1;
  for (size_t i = 0; i < t.sizes.size(); ++i) {
    if (t.sizes[i] <= 0) return 0;
    const bool broadcast = i < t.strides.size() && t.strides[i] == 0;
    if (!broadcast) n *= t.sizes[i];
  }
  return n;
}

// Bytes of the elements a tensor's storage holds (a broadcast, stride-0 dimension counts once):
// what a kernel reading it moves. cost_model.cpp's dense_bytes counts every element instead.
double stored_bytes(const TensorInfo& t) {
  return static_cast<double>(stored_elements(t)) * static_cast<double>(dtype_itemsize(t.dtype));
}

// The same view of the same storage. Tensors without a storage id (symbolic) never match.
bool same_tensor(const TensorInfo& a, const TensorInfo& b) {
  return a.storage != 0 && a.storage == b.storage && a.storage_offset == b.storage_offset &&
         a.dtype == b.dtype && a.sizes == b.sizes && a.strides == b.strides;
}

// A matrix operand is "transposed" when its last dim is not the contiguous one (cuBLAS then
// reads it as the transpose of a column-major matrix).
bool transposed_operand(const TensorInfo& t) {
  if (t.sizes.size() < 2 || t.strides.size() != t.sizes.size()) return false;
  return t.sizes.back() > 1 && t.strides.back() != 1;
}

// A TensorIterator kernel writing `dst` runs in dst's memory order (its innermost dim is the
// one of smallest stride). The kernel gathers when dst itself is not stride-1 there or an input
// of dst's shape strides across it (a permuted view; stride 0 is a broadcast, read once).
// Kernels under 4096 elements are launch-bound either way.
bool permuted_access(const TensorInfo& dst, const std::vector<const TensorInfo*>& srcs) {
  const size_t nd = dst.sizes.size();
  if (nd < 2 || dst.strides.size() != nd || numel_of(dst) < 4096) return false;
  size_t inner = nd;
  for (size_t i = 0; i < nd; ++i) {
    if (dst.sizes[i] > 1 && (inner == nd || dst.strides[i] < dst.strides[inner])) inner = i;
  }
  if (inner == nd) return false;
  if (dst.strides[inner] != 1) return true;
  for (const TensorInfo* x : srcs) {
    if (x->sizes != dst.sizes || x->strides.size() != nd) continue;
    if (x->strides[inner] != 0 && x->strides[inner] != 1) return true;
  }
  return false;
}

// The strides of `t`'s sizes laid out densely in memory-format order: row-major, or NHWC /
// NDHWC (channels, then the spatial dims innermost-last, then the batch).
std::vector<int64_t> dense_strides(const TensorInfo& t, bool channels_last) {
  const size_t nd = t.sizes.size();
  std::vector<size_t> order(nd);  // innermost first
  for (size_t i = 0; i < nd; ++i) order[i] = nd - 1 - i;
  if (channels_last && nd >= 3) {
    order.clear();
    order.push_back(1);
    for (size_t i = nd - 1; i >= 2; --i) order.push_back(i);
    order.push_back(0);
  }
  std::vector<int64_t> strides(nd, 1);
  int64_t stride = 1;
  for (size_t d : order) {
    strides[d] = stride;
    stride *= t.sizes[d];
  }
  return strides;
}

// Whether `t` is dense in that order (size-1 dims' strides do not matter, as in
// TensorImpl::is_contiguous).
bool dense_in(const TensorInfo& t, bool channels_last) {
  if (t.strides.size() != t.sizes.size()) return false;
  const std::vector<int64_t> want = dense_strides(t, channels_last);
  for (size_t i = 0; i < want.size(); ++i) {
    if (t.sizes[i] != 1 && t.strides[i] != want[i]) return false;
  }
  return true;
}

// What suggest_memory_format() says of a 4-D / 5-D tensor: c10's
// is_channels_last_strides_2d_s4 / _3d_s5 (c10/core/MemoryFormat.h), strides non-decreasing
// in the order C, W, H, (D), N, with NCHW winning the ambiguous cases (a 1x1 filter, an N111
// tensor).
bool suggests_channels_last(const TensorInfo& t) {
  const size_t nd = t.sizes.size();
  if ((nd != 4 && nd != 5) || t.strides.size() != nd || t.strides[1] == 0) return false;
  const std::vector<size_t> order =
      nd == 4 ? std::vector<size_t>{1, 3, 2, 0} : std::vector<size_t>{1, 4, 3, 2, 0};
  int64_t min = 0;
  for (size_t d : order) {
    if (t.sizes[d] == 0 || t.strides[d] < min) return false;
    if (d == 0 && min == t.strides[1]) return false;
    min = t.strides[d];
    if (t.sizes[d] > 1) min *= t.sizes[d];
  }
  return true;
}

// The memory format a convolution runs in: channels-last when its input or its weight suggests
// it (cudnn_conv_suggest_memory_format, aten/src/ATen/native/ConvUtils.h; 4-D and 5-D only).
bool conv_runs_channels_last(const TensorInfo& x, const TensorInfo& w) {
  return suggests_channels_last(x) || suggests_channels_last(w);
}

// Whether the convolution's input reaches its kernel as a channels-last copy (host_copies): an
// activation that is not NHWC-dense meeting a channels-last format. (A one-channel input that
// already is stays what channels_last() says: both layouts are the same bytes.)
bool copied_to_channels_last(const TensorInfo& x, const TensorInfo& w) {
  return conv_runs_channels_last(x, w) && !dense_in(x, true);
}

// A copy the op's CUDA host code makes (host_copies): a copy kernel (clone -> copy_, Copy.cu)
// writes `src` densely in the target format and the main kernel reads that. Charged to the
// unit as one more kernel and its read + write, gathering when src's stride along the copy's
// innermost dim is neither 1 nor 0 (permuted_access).
void add_hidden_copy(const TensorInfo& src, bool channels_last, UnitFeatures& f) {
  TensorInfo dst = src;
  dst.strides = dense_strides(src, channels_last);
  const double bytes =
      2.0 * static_cast<double>(numel_of(src)) * static_cast<double>(dtype_itemsize(src.dtype));
  if (permuted_access(dst, {&src})) {
    f.hidden_copy_permuted_bytes += bytes;
  } else {
    f.hidden_copy_bytes += bytes;
  }
  f.hidden_copies += 1;
  f.kernels += 1;
}

template <class F>
void for_each_tensor(const Arg& a, F&& fn) {
  if (a.kind != ArgKind::kTensor && a.kind != ArgKind::kTensorList) return;
  for (const TensorInfo& t : a.tensors) {
    if (t.dtype >= 0) fn(t);  // undefined entries of a tensor list have dtype -1
  }
}

template <class F>
void for_each_tensor(const std::vector<Arg>& args, F&& fn) {
  for (const Arg& a : args) for_each_tensor(a, fn);
}

// Sums tensor bytes, counting each distinct tensor once (mul(x, x) reads x once).
class ByteSet {
 public:
  void add(const TensorInfo& t) {
    if (t.storage != 0) {
      auto key = std::make_tuple(t.storage, t.storage_offset, t.dtype, t.sizes, t.strides);
      if (!seen_.insert(std::move(key)).second) return;
    }
    bytes_ += stored_bytes(t);
  }
  double bytes() const { return bytes_; }

 private:
  std::set<std::tuple<int64_t, int64_t, int16_t, std::vector<int64_t>, std::vector<int64_t>>>
      seen_;
  double bytes_ = 0.0;
};

// Elements of the largest output argument (a tensor list counts as the sum of its tensors).
int64_t largest_numel(const std::vector<Arg>& args) {
  int64_t best = 0;
  for (const Arg& a : args) {
    int64_t n = 0;
    for_each_tensor(a, [&](const TensorInfo& t) { n += numel_of(t); });
    best = std::max(best, n);
  }
  return best;
}

bool has_tensor(const std::vector<Arg>& args) {
  bool any = false;
  for_each_tensor(args, [&](const TensorInfo&) { any = true; });
  return any;
}

// ---- arguments -----------------------------------------------------------------------------

struct Ctx {
  const std::string& op;
  const std::vector<Arg>& in;
  const std::vector<Arg>& out;
  const GpuSpec& gpu;
  const FeatureOptions& opts;
};

[[noreturn]] void fail(const Ctx& c, const std::string& msg) { throw Error(c.op + ": " + msg); }

const TensorInfo* tensor_at(const std::vector<Arg>& args, int i) {
  if (i < 0 || i >= static_cast<int>(args.size())) return nullptr;
  const Arg& a = args[static_cast<size_t>(i)];
  if (a.kind != ArgKind::kTensor || a.tensors.empty() || a.tensors[0].dtype < 0) return nullptr;
  return &a.tensors[0];
}

const TensorInfo& need_tensor(const Ctx& c, int i, const char* what) {
  const TensorInfo* t = tensor_at(c.in, i);
  if (t == nullptr) {
    fail(c, "expected a tensor as input " + std::to_string(i) + " (" + what + "), got " +
                (i < static_cast<int>(c.in.size()) ? "another kind of argument"
                                                   : "only " + std::to_string(c.in.size()) +
                                                         " inputs"));
  }
  return *t;
}

const TensorInfo* first_output(const Ctx& c) {
  for (const Arg& a : c.out) {
    if (a.kind == ArgKind::kTensor && !a.tensors.empty() && a.tensors[0].dtype >= 0) {
      return &a.tensors[0];
    }
  }
  return nullptr;
}

int64_t int_at(const std::vector<Arg>& args, int i, int64_t dflt) {
  if (i < 0 || i >= static_cast<int>(args.size())) return dflt;
  const Arg& a = args[static_cast<size_t>(i)];
  switch (a.kind) {
    case ArgKind::kInt:
    case ArgKind::kBool:
      return a.i;
    case ArgKind::kDouble:
      return static_cast<int64_t>(a.d);
    case ArgKind::kIntList:
      return a.ints.size() == 1 ? a.ints[0] : dflt;
    default:
      return dflt;
  }
}

bool bool_at(const std::vector<Arg>& args, int i, bool dflt) {
  if (i < 0 || i >= static_cast<int>(args.size())) return dflt;
  const Arg& a = args[static_cast<size_t>(i)];
  if (a.kind == ArgKind::kBool || a.kind == ArgKind::kInt) return a.i != 0;
  return dflt;
}

std::vector<int64_t> ints_at(const std::vector<Arg>& args, int i) {
  if (i < 0 || i >= static_cast<int>(args.size())) return {};
  const Arg& a = args[static_cast<size_t>(i)];
  if (a.kind == ArgKind::kIntList) return a.ints;
  if (a.kind == ArgKind::kInt) return {a.i};
  return {};
}

// Element i of a per-dimension list; a one-element list applies to every dimension.
int64_t pick(const std::vector<int64_t>& v, size_t i, int64_t dflt) {
  if (v.empty()) return dflt;
  return v[std::min(i, v.size() - 1)];
}

int64_t ceil_div(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

// Whether input i, when it is the very tensor of an output, is written rather than read: an
// out= destination (any input but the first). Input 0 equal to an output is an in-place self,
// which is read and written.
bool is_out_destination(const Ctx& c, int i, const TensorInfo& t) {
  if (i == 0) return false;
  bool hit = false;
  for_each_tensor(c.out, [&](const TensorInfo& o) { hit = hit || same_tensor(o, t); });
  return hit;
}

// Bytes of every distinct tensor input, except input `skip` and out= destinations.
double read_bytes(const Ctx& c, int skip = -1) {
  ByteSet r;
  for (int i = 0; i < static_cast<int>(c.in.size()); ++i) {
    if (i == skip) continue;
    for_each_tensor(c.in[static_cast<size_t>(i)], [&](const TensorInfo& t) {
      if (!is_out_destination(c, i, t)) r.add(t);
    });
  }
  return r.bytes();
}

// Bytes of every distinct tensor output; an op that returns nothing (in-place _foreach_*) or
// no tensor writes input `dest` (its self) instead. Sets f.numel to the written elements.
void count_writes(const Ctx& c, UnitFeatures& f, int dest = 0) {
  ByteSet w;
  if (has_tensor(c.out)) {
    for_each_tensor(c.out, [&](const TensorInfo& t) { w.add(t); });
    f.numel = largest_numel(c.out);
  } else if (dest >= 0 && dest < static_cast<int>(c.in.size())) {
    for_each_tensor(c.in[static_cast<size_t>(dest)], [&](const TensorInfo& t) { w.add(t); });
    f.numel = largest_numel({c.in[static_cast<size_t>(dest)]});
  }
  f.bytes_written = w.bytes();
}

int largest_dtype(const std::vector<Arg>& args) {
  int dtype = -1;
  int64_t best = -1;
  for_each_tensor(args, [&](const TensorInfo& t) {
    if (numel_of(t) > best) {
      best = numel_of(t);
      dtype = t.dtype;
    }
  });
  return dtype;
}

// ---- tilings (applied once the math mode is known) ------------------------------------------

struct Tiling {
  enum Style { kNone, kGemm, kPreset, kElementwise, kReduction, kRowwise, kMultiTensor,
               kSerialLoop };
  Style style = kNone;
  double work = 0.0;     // elements, for kElementwise / kReduction
  int64_t tiles = 0;     // kPreset: CTAs; kMultiTensor: 64K-element chunks
  int64_t threads = 0;   // kPreset, kSerialLoop: threads per CTA (kSerialLoop: work = threads)
  int passes = 1;        // kGemm on a convolution: bit 0 forward, 1 grad_input, 2 grad_weight
};

Tiling gemm_tiling() { return Tiling{Tiling::kGemm, 0.0, 0, 0}; }
Tiling conv_tiling(int passes) { return Tiling{Tiling::kGemm, 0.0, 0, 0, passes}; }
Tiling preset_tiling(int64_t ctas, int64_t threads) {
  return Tiling{Tiling::kPreset, 0.0, ctas, threads};
}
Tiling elementwise_tiling(double work) { return Tiling{Tiling::kElementwise, work, 0, 0}; }
Tiling reduction_tiling(double work) { return Tiling{Tiling::kReduction, work, 0, 0}; }
Tiling rowwise_tiling() { return Tiling{Tiling::kRowwise, 0.0, 0, 0}; }
Tiling no_tiling() { return Tiling{}; }
Tiling serial_loop_tiling(int64_t threads, int64_t cta) {
  return Tiling{Tiling::kSerialLoop, static_cast<double>(threads),
                (threads + cta - 1) / std::max<int64_t>(cta, 1), cta};
}

// ---- rules -----------------------------------------------------------------------------------

struct Rule;
using Formula = Tiling (*)(const Ctx&, const Rule&, UnitFeatures&);

// One row of the table. p0..p2 are formula-specific argument positions or variant codes (see
// each formula); kernels is the launch count of the CUDA implementation (-1: the formula
// computes it).
struct Rule {
  UnitKind kind;
  Formula formula;
  double per_elem;  // FLOPs per element for the element-wise, row-wise and reduction formulas
  int p0, p1, p2;
  int kernels;
};

Rule R(UnitKind kind, Formula fn, double per_elem = 0.0, int p0 = -1, int p1 = -1, int p2 = -1,
       int kernels = 1) {
  return Rule{kind, fn, per_elem, p0, p1, p2, kernels};
}

// ---- formulas ----------------------------------------------------------------------------------

// GEMM: A = input p0, B = input p1 ((..., M, K) @ (..., K, N); a 1-D operand is a vector).
// FLOPs 2*batch*M*N*K as blink/flops.py (a bias or beta*C adds no FLOPs there either); reads
// every tensor input (A, B, bias, FP8 scales), writes the output.
Tiling f_gemm(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& a = need_tensor(c, r.p0, "first matrix");
  const TensorInfo& b = need_tensor(c, r.p1, "second matrix");
  if (a.sizes.empty() || b.sizes.empty()) fail(c, "matrix operands need at least one dimension");
  const size_t ra = a.sizes.size(), rb = b.sizes.size();
  const int64_t m = ra >= 2 ? a.sizes[ra - 2] : 1;
  const int64_t k = a.sizes[ra - 1];
  const int64_t kb = rb >= 2 ? b.sizes[rb - 2] : b.sizes[0];
  const int64_t n = rb >= 2 ? b.sizes[rb - 1] : 1;
  if (k != kb) {
    fail(c, "inner dimensions differ (" + std::to_string(k) + " vs " + std::to_string(kb) + ")");
  }
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < ra; ++i) batch *= a.sizes[i];
  f.m = m;
  f.n = n;
  f.k = k;
  f.batch = batch;
  f.trans_a = transposed_operand(a);
  f.trans_b = transposed_operand(b);
  if (c.op == "aten::_addmm_activation") {
    f.cublaslt_epilogue = true;
  } else if (c.op == "aten::addmm") {
    // addmm_out_cuda_impl (aten/src/ATen/native/cuda/Blas.cpp) takes cublasLt's bias epilogue
    // (gemm_and_bias) for a 1-D bias only when mat2 has more than one row and column: cublasLt's
    // heuristic rejects a single-row or single-column operand.
    const TensorInfo* bias = tensor_at(c.in, 0);
    f.cublaslt_epilogue = bias != nullptr && bias->sizes.size() == 1 && n > 1 && k > 1;
  }
  f.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) *
            static_cast<double>(k);
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  f.dtype = a.dtype;
  return gemm_tiling();
}

// torch._grouped_mm (transformers' MoE experts, torch.nn.functional.grouped_mm): G GEMMs in one
// call, A = input 0, B = input 1, offs = input 2 (int32 cumulative group ends along the 2-D
// operand's grouped dim). aten/src/ATen/native/cuda/GroupedBlas.cpp (_grouped_mm_cuda): bf16
// in and out on sm_90 / sm_100 runs CUTLASS's persistent grouped GEMM (bf16bf16_grouped_mm, one
// launch); everything else runs _grouped_mm_fallback (ATen/native/GroupedMMUtils.h), which copies
// offs to the host (a sync) and calls at::mm_out once per group. The group sizes are data (the
// router's choice), unknown on meta: rows are taken as spread uniformly at random over the G
// groups, as a router with a load-balancing loss (or at random init) spreads them, so of G
// groups G * (1 - (1 - 1/G)^rows) get rows, each an equal share; a group without rows costs no
// tile and its weights are not read (decode: a few rows touch a few experts). The cases
// (create_grouped_gemm_output_tensor): 2-D (rows, K) x 3-D (G, K, N) -> (rows, N), the experts'
// forward and input gradient; 2-D (M, rows) x 2-D (rows, N) -> (G, M, N), their weight
// gradient, grouped along K; 3-D (G, M, K) x 2-D (K, rows) -> (M, rows); 3-D x 3-D a bmm.
// FLOPs 2 * M * N * K over the rows actually present.
Tiling f_grouped_mm(const Ctx& c, const Rule&, UnitFeatures& f) {
  const TensorInfo& a = need_tensor(c, 0, "mat_a");
  const TensorInfo& b = need_tensor(c, 1, "mat_b");
  const size_t ra = a.sizes.size(), rb = b.sizes.size();
  if ((ra != 2 && ra != 3) || (rb != 2 && rb != 3)) fail(c, "mat_a and mat_b must be 2-D or 3-D");
  int64_t groups = 0;
  if (ra == 3) {
    groups = a.sizes[0];
  } else if (rb == 3) {
    groups = b.sizes[0];
  } else {
    const TensorInfo* offs = tensor_at(c.in, 2);
    if (offs == nullptr || offs->sizes.size() != 1) fail(c, "a 2-D x 2-D grouped GEMM needs 1-D offs");
    groups = offs->sizes[0];
  }
  if (groups <= 0) fail(c, "no groups");
  // The grouped (data-dependent) extent `rows` and the fixed ones; FLOPs are 2 * rows * the
  // product of the others (`fixed`; 3-D x 3-D: rows = groups, fixed = m * n * k).
  int64_t m = 0, n = 0, k = 0, rows = 0;
  double fixed = 0.0;
  const double weight_bytes_3d = ra == 3 ? stored_bytes(a) : (rb == 3 ? stored_bytes(b) : 0.0);
  auto d = [](int64_t v) { return static_cast<double>(v); };
  if (ra == 2 && rb == 3) {         // rows of A grouped
    rows = a.sizes[0], k = a.sizes[1], n = b.sizes[2], fixed = d(k) * d(n);
    if (b.sizes[1] != k) fail(c, "contraction dimensions differ");
  } else if (ra == 3 && rb == 2) {  // columns of B grouped
    m = a.sizes[1], k = a.sizes[2], rows = b.sizes[1], fixed = d(m) * d(k);
    if (b.sizes[0] != k) fail(c, "contraction dimensions differ");
  } else if (ra == 2 && rb == 2) {  // K grouped
    m = a.sizes[0], rows = a.sizes[1], n = b.sizes[1], fixed = d(m) * d(n);
    if (b.sizes[0] != rows) fail(c, "contraction dimensions differ");
  } else {                          // 3-D x 3-D: a bmm
    if (b.sizes[0] != groups || b.sizes[1] != a.sizes[2]) fail(c, "batched shapes differ");
    m = a.sizes[1], k = a.sizes[2], n = b.sizes[2], rows = groups, fixed = d(m) * d(n) * d(k);
  }
  const bool batched = ra == 3 && rb == 3;
  f.flops = 2.0 * static_cast<double>(rows) * fixed;
  double active = static_cast<double>(groups);
  if (!batched) {
    const double g = static_cast<double>(groups), r = static_cast<double>(std::max<int64_t>(rows, 0));
    active = groups == 1 ? 1.0 : g * (1.0 - std::pow(1.0 - 1.0 / g, r));
    active = std::clamp(std::round(active), rows > 0 ? 1.0 : 0.0, g);
    const int64_t share = rows > 0 ? ceil_div(rows, static_cast<int64_t>(active)) : 0;
    if (ra == 2 && rb == 3) m = share;
    else if (ra == 3 && rb == 2) n = share;
    else k = share;
  }
  // Only the groups that get rows read their slice of the 3-D operand.
  f.bytes_read = read_bytes(c) - weight_bytes_3d * (1.0 - active / static_cast<double>(groups));
  count_writes(c, f, -1);
  f.m = m;
  f.n = n;
  f.k = k;
  f.trans_a = transposed_operand(a);
  f.trans_b = transposed_operand(b);
  f.dtype = a.dtype;
  const int out_dtype = c.out.empty() || tensor_at(c.out, 0) == nullptr ? a.dtype
                                                                          : tensor_at(c.out, 0)->dtype;
  const bool fast = a.dtype == 15 && b.dtype == 15 && out_dtype == 15 && c.gpu.cc_minor == 0 &&
                    (c.gpu.cc_major == 9 || c.gpu.cc_major == 10);
  const int64_t used = static_cast<int64_t>(active);
  if (batched || fast) {
    f.batch = used;  // one launch over every group's tiles
    f.kernels = used > 0 ? 1 : 0;
  } else {
    f.batch = 1;
    f.groups = used;  // a loop of at::mm_out calls (gemm_cost.cpp plan_gemm_unit)
    f.kernels = used;
    f.host_sync = used > 1;  // the loop's bounds: offs.cpu() (GroupedMMUtils.h)
  }
  return gemm_tiling();
}

// blink/flops.py _conv: each output (transposed: each input) point takes C_in/groups * kernel
// volume MACs per output channel; the weight's dims 0 and 1 already carry the group split.
double conv_flops(const TensorInfo& x, const TensorInfo& w, const TensorInfo& y,
                  bool transposed) {
  double spatial = 1.0;
  const TensorInfo& s = transposed ? x : y;
  for (size_t i = 2; i < s.sizes.size(); ++i) spatial *= static_cast<double>(s.sizes[i]);
  double kernel = 1.0;
  for (size_t i = 2; i < w.sizes.size(); ++i) kernel *= static_cast<double>(w.sizes[i]);
  return 2.0 * static_cast<double>(x.sizes[0]) * spatial * static_cast<double>(w.sizes[0]) *
         static_cast<double>(w.sizes[1]) * kernel;
}

// Fills the conv geometry and its implicit-GEMM view from input x, weight w and output y
// (for the backward, y is grad_output). one_pass_flops: the forward's FLOPs.
void conv_geometry(const Ctx& c, UnitFeatures& f, const TensorInfo& x, const TensorInfo& w,
                   const TensorInfo& y, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& pad, const std::vector<int64_t>& dil,
                   int64_t groups, bool transposed, double one_pass_flops) {
  const size_t rank = x.sizes.size();
  if (rank < 3 || rank > 5 || w.sizes.size() != rank || y.sizes.size() != rank) {
    fail(c, "expected 3-D, 4-D or 5-D input, weight and output of equal rank");
  }
  if (groups <= 0) fail(c, "groups must be positive");
  const size_t sd = rank - 2;  // spatial dims: the last two are (h, w); a third is depth
  f.conv_n = x.sizes[0];
  f.conv_c = x.sizes[1];
  f.conv_w = x.sizes[rank - 1];
  f.conv_s = w.sizes[rank - 1];
  f.out_w = y.sizes[rank - 1];
  f.stride_w = pick(stride, sd - 1, 1);
  f.pad_w = pick(pad, sd - 1, 0);
  f.dil_w = pick(dil, sd - 1, 1);
  if (sd >= 2) {
    f.conv_h = x.sizes[rank - 2];
    f.conv_r = w.sizes[rank - 2];
    f.out_h = y.sizes[rank - 2];
    f.stride_h = pick(stride, sd - 2, 1);
    f.pad_h = pick(pad, sd - 2, 0);
    f.dil_h = pick(dil, sd - 2, 1);
  } else {
    f.conv_h = 1;
    f.conv_r = 1;
    f.out_h = 1;
  }
  if (sd == 3) {
    f.conv_d = x.sizes[2];
    f.conv_t = w.sizes[2];
    f.out_d = y.sizes[2];
  }
  f.groups = groups;
  f.transposed = transposed;
  // Weight layout: [K, C/g, ...] for a convolution, [C, K/g, ...] for a transposed one.
  f.conv_k = transposed ? w.sizes[1] * groups : w.sizes[0];
  int64_t out_spatial = 1;
  for (size_t i = 2; i < rank; ++i) out_spatial *= y.sizes[i];
  f.m = x.sizes[0] * out_spatial;
  f.n = std::max<int64_t>(1, f.conv_k / groups);
  f.batch = groups;
  // K of the implicit GEMM, from the FLOPs so that 2*m*n*k*groups == FLOPs (exact for a
  // convolution, C/g * kernel volume; a transposed conv spreads its input over its output).
  const double denom = 2.0 * static_cast<double>(f.m) * static_cast<double>(f.n) *
                       static_cast<double>(groups);
  f.k = denom > 0 ? std::max<int64_t>(1, std::llround(one_pass_flops / denom)) : 0;
  f.dtype = x.dtype;
}

// NHWC / NDHWC in memory: the channel dim has stride 1 (and is not trivially so).
bool channels_last(const TensorInfo& x) {
  return x.sizes.size() >= 4 && x.strides.size() == x.sizes.size() && x.sizes[1] > 1 &&
         x.strides[1] == 1;
}

// Convolution forward. p0 = schema variant: 0 aten::convolution / _convolution (stride 3,
// padding 4, dilation 5, transposed 6, groups 8), 1 cudnn_convolution (padding 2, stride 3,
// dilation 4, groups 5), 2 cudnn_convolution_transpose (padding 2, stride 4, dilation 5,
// groups 6).
Tiling f_conv(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  const TensorInfo& w = need_tensor(c, 1, "weight");
  const TensorInfo* y = first_output(c);
  if (y == nullptr) fail(c, "has no output tensor");
  int stride = 3, pad = 4, dil = 5, groups = 8;
  bool transposed = false;
  if (r.p0 == 0) {
    transposed = bool_at(c.in, 6, false);
  } else if (r.p0 == 1) {
    pad = 2, stride = 3, dil = 4, groups = 5;
  } else {
    pad = 2, stride = 4, dil = 5, groups = 6;
    transposed = true;
  }
  const double flops = conv_flops(x, w, *y, transposed);
  conv_geometry(c, f, x, w, *y, ints_at(c.in, stride), ints_at(c.in, pad), ints_at(c.in, dil),
                int_at(c.in, groups, 1), transposed, flops);
  f.flops = flops;
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  // An NCHW input meeting channels-last weights runs channels-last after its copy (host_copies).
  f.channels_last = channels_last(x) || copied_to_channels_last(x, w);
  if (r.p0 == 0 && tensor_at(c.in, 2) != nullptr) {
    // _convolution adds the bias after the cuDNN call (output.add_(reshape_bias(...)),
    // Convolution.cpp): one more element-wise kernel reading and writing the output.
    f.kernels += 1;
    f.aux_bytes += 2.0 * stored_bytes(*y);
  }
  return conv_tiling(1);
}

// convolution_backward(grad_output 0, input 1, weight 2, bias_sizes 3, stride 4, padding 5,
// dilation 6, transposed 7, output_padding 8, groups 9, output_mask 10). FLOPs as
// blink/flops.py: one forward's worth per grad_input / grad_weight requested. The gradients
// are separate kernels (dgrad, wgrad, bias reduction), each reading grad_output: bytes are
// counted per kernel.
Tiling f_conv_backward(const Ctx& c, const Rule&, UnitFeatures& f) {
  const TensorInfo& go = need_tensor(c, 0, "grad_output");
  const TensorInfo& x = need_tensor(c, 1, "input");
  const TensorInfo& w = need_tensor(c, 2, "weight");
  std::vector<int64_t> mask = ints_at(c.in, 10);
  while (mask.size() < 3) mask.push_back(1);
  const bool transposed = bool_at(c.in, 7, false);
  const double one = conv_flops(x, w, go, transposed);
  conv_geometry(c, f, x, w, go, ints_at(c.in, 4), ints_at(c.in, 5), ints_at(c.in, 6),
                int_at(c.in, 9, 1), transposed, one);
  const int passes = static_cast<int>(mask[0] != 0) + static_cast<int>(mask[1] != 0);
  f.flops = one * passes;
  const double gob = stored_bytes(go);
  f.bytes_read = (mask[0] ? gob + stored_bytes(w) : 0.0) + (mask[1] ? gob + stored_bytes(x) : 0.0) +
                 (mask[2] ? gob : 0.0);
  count_writes(c, f, -1);
  f.kernels = std::max(1, passes + static_cast<int>(mask[2] != 0));
  f.channels_last = channels_last(x) || copied_to_channels_last(x, w);
  return conv_tiling((mask[0] ? 2 : 0) | (mask[1] ? 4 : 0));
}

struct AttnShape {
  int64_t bh = 0, lq = 0, lk = 0, d = 0, dv = 0;
};

// q, k, v at inputs q..q+2. layout 0: (..., heads, L, D) as the SDPA ops; 1: (batch, L, heads,
// D) as _flash_attention_* / _efficient_attention_* (varlen inputs count as one sequence).
AttnShape attention_shape(const Ctx& c, int q_index, int layout, int& dtype) {
  const TensorInfo& q = need_tensor(c, q_index, "query");
  const TensorInfo& k = need_tensor(c, q_index + 1, "key");
  const TensorInfo& v = need_tensor(c, q_index + 2, "value");
  const size_t rq = q.sizes.size(), rk = k.sizes.size(), rv = v.sizes.size();
  AttnShape s;
  if (layout == 0) {
    if (rq < 2 || rk < 2 || rv < 2) fail(c, "query, key and value need (..., L, D) shapes");
    s.bh = 1;
    for (size_t i = 0; i + 2 < rq; ++i) s.bh *= q.sizes[i];
    s.lq = q.sizes[rq - 2];
    s.lk = k.sizes[rk - 2];
  } else {
    if (rq < 3 || rk < 3 || rv < 3) fail(c, "query, key and value need (..., L, H, D) shapes");
    s.bh = q.sizes[rq - 2];
    for (size_t i = 0; i + 3 < rq; ++i) s.bh *= q.sizes[i];
    s.lq = q.sizes[rq - 3];
    s.lk = k.sizes[rk - 3];
  }
  s.d = q.sizes[rq - 1];
  s.dv = v.sizes[rv - 1];
  dtype = q.dtype;
  return s;
}

void attention_common(const Ctx& c, const AttnShape& s, UnitFeatures& f) {
  f.m = s.lq;
  f.n = s.lk;
  f.k = s.d;
  f.batch = s.bh;
  f.head_dim_v = s.dv;
  const std::string& op = c.op;
  f.attention_backend = op.find("flash") != std::string::npos     ? AttentionBackend::kFlash
                        : op.find("efficient") != std::string::npos ? AttentionBackend::kEfficient
                        : op.find("cudnn") != std::string::npos     ? AttentionBackend::kCudnn
                                                                    : AttentionBackend::kNone;
}

// Fused attention forward (flash / efficient / cuDNN): q at p0, is_causal (or custom_mask_type)
// at p1, layout p2. FLOPs as blink/flops.py (QK^T and PV; causal masking is not subtracted
// there, the roofline model applies it). Bytes: q, k, v (+ attn_bias) read; out and logsumexp
// written. The L x L score matrix never reaches DRAM.
Tiling f_attention_fwd(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const AttnShape s = attention_shape(c, r.p0, r.p2, f.dtype);
  attention_common(c, s, f);
  f.causal = bool_at(c.in, r.p1, false);
  const double base = 2.0 * static_cast<double>(s.bh) * static_cast<double>(s.lq) *
                      static_cast<double>(s.lk);
  f.flops = base * static_cast<double>(s.d) + base * static_cast<double>(s.dv);
  f.bytes_read = read_bytes(c);
  ByteSet w;
  for (size_t i = 0; i < c.out.size() && i < 2; ++i) {
    for_each_tensor(c.out[i], [&](const TensorInfo& t) { w.add(t); });
  }
  f.bytes_written = w.bytes();
  if (const TensorInfo* o = first_output(c)) f.numel = numel_of(*o);
  // One CTA of 4 warps per 128 query rows per (batch, head) (FlashAttention-2 forward).
  return preset_tiling(s.bh * ceil_div(s.lq, 128), 128);
}

// Fused attention backward: q at p0 (grad_out before it), is_causal at p1, layout p2. FLOPs as
// blink/flops.py: scores recomputed, then dV, dP, dQ, dK (5 GEMMs). Reads grad_out, q, k, v,
// out, logsumexp (+ bias); writes the gradients.
Tiling f_attention_bwd(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const AttnShape s = attention_shape(c, r.p0, r.p2, f.dtype);
  attention_common(c, s, f);
  f.causal = bool_at(c.in, r.p1, false);
  f.flops = 2.0 * static_cast<double>(s.bh) * static_cast<double>(s.lq) *
            static_cast<double>(s.lk) * static_cast<double>(3 * s.d + 2 * s.dv);
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  // FlashAttention-2 backward parallelises over 128-row key blocks, 8 warps each.
  return preset_tiling(s.bh * ceil_div(s.lk, 128), 256);
}

// Threads of cuDNN's per-channel batch-norm training CTAs (the 512 in the kernels'
// template arguments, e.g. bn_fw_tr_1C11_kernel_NCHW<__half, float, 512, true, 1>).
constexpr int64_t kBnChannelCtaThreads = 512;

// Normalisations. p0 = variant: 0 over the last dims (layer / RMS norm; normalized_shape at
// p1), 1 per channel (batch norm; dim 1; p1 = training when no bool argument says), 2 per
// group (group norm; N, C, HxW, group at p1..p1+3). p2 = the input's position. Reads every
// tensor input once, writes every output.
Tiling f_norm(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, r.p2, "input");
  const int64_t total = numel_of(x);
  if (r.p0 == 0) {
    const std::vector<int64_t> shape = ints_at(c.in, r.p1);
    if (shape.empty()) fail(c, "expected normalized_shape at input " + std::to_string(r.p1));
    int64_t inner = 1;
    for (int64_t s : shape) inner *= s;
    f.inner = inner;
    f.outer = inner > 0 ? total / inner : 0;
    // layer_norm_kernel.cu launches one CTA per row (grid = M rows): the forward's
    // vectorized_layer_norm_kernel (N % 4 == 0, aligned) and the backward's grad-input kernels
    // with num_threads() = 128; an unvectorised forward runs RowwiseMomentsCUDAKernel (512
    // threads) then LayerNormForwardCUDAKernel (256), a CTA per row each. _fused_rms_norm
    // shares these launches.
    const bool bwd = c.op.find("backward") != std::string::npos;
    f.row_cta_threads = bwd || inner % 4 == 0 ? 128 : 512;
  } else if (r.p0 == 1) {
    if (x.sizes.size() < 2) fail(c, "batch norm needs an (N, C, ...) input");
    f.outer = x.sizes[1];
    f.inner = f.outer > 0 ? total / f.outer : 0;
    if (r.kernels < 0) {
      // The first bool argument is `training` (`train`, `update`) in every batch-norm schema;
      // training launches a statistics kernel before the element-wise one.
      bool training = r.p1 != 0;
      for (const Arg& a : c.in) {
        if (a.kind == ArgKind::kBool) {
          training = a.i != 0;
          break;
        }
      }
      f.kernels = training ? 2 : 1;
    }
    // cuDNN's NCHW batch norm in training (PyTorch's CUDNN_BATCHNORM_SPATIAL for a contiguous
    // input, cudnn/BatchNorm.cpp) runs bn_fw_tr_1C11_kernel_NCHW forward and
    // bn_bw_1C11_kernel_NCHW backward, one 512-thread CTA per channel that reduces the
    // channel's N x H x W elements and then normalises them (cuDNN does not document the grid;
    // its template's 512 threads, its collapse on one channel (Paddle's BatchNorm1D(1): 133 ms
    // for 24 MB) and the timm training steps of narrow nets agree): a 16-channel layer streams
    // its every pass with 16 CTAs. Channels-last training runs SPATIAL_PERSISTENT kernels spread
    // over the pixels instead, and ATen's native kernels only their statistics pass per
    // channel (Normalization.cuh), so neither is costed this way.
    const bool cudnn_bn = c.op.rfind("aten::cudnn_batch_norm", 0) == 0;
    if (cudnn_bn && f.kernels >= 2 && x.sizes.size() >= 3 && !channels_last(x)) {
      f.channel_cta_threads = kBnChannelCtaThreads;
    }
  } else {
    const int64_t n = int_at(c.in, r.p1, 0), ch = int_at(c.in, r.p1 + 1, 0);
    const int64_t hxw = int_at(c.in, r.p1 + 2, 0), g = int_at(c.in, r.p1 + 3, 0);
    if (g <= 0 || ch % g != 0) fail(c, "group count must be positive and divide C");
    f.outer = n * g;
    f.inner = ch / g * hxw;
  }
  f.flops = r.per_elem * static_cast<double>(total);
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  f.dtype = x.dtype;
  // Inference batch norm is one per-element affine pass with per-channel constants, launched
  // over every element, not a CTA per channel: ATen's batch_norm_elementwise (Normalization.cu,
  // a TensorIterator kernel) and cuDNN's bn_fw_inf_1C11_kernel_NCHW. Costed as a row per channel
  // it got C CTAs, i.e. a small fraction of DRAM bandwidth for the 16-40-channel layers of
  // mobile nets (3x its streaming time at C = 16).
  if (r.p0 == 1 && f.kernels <= 1) {
    f.input_passes = 1.0;
    return elementwise_tiling(static_cast<double>(total));
  }
  // Two passes over the input: layer / RMS norm's vectorized_layer_norm_kernel computes the
  // row's Welford statistics, then re-reads the row to normalise (layer_norm_kernel.cu); batch
  // norm in training and group norm run a statistics kernel then an element-wise transform
  // that reads the input again (Normalization.cuh, group_norm_kernel.cu); the backwards reduce
  // (dy, x) first and re-read them for dx.
  f.input_passes = 2.0;
  return rowwise_tiling();
}

// Softmax family: the input at p0, the dim at p1. Rows of size[dim].
Tiling f_softmax(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, r.p0, "input");
  const int64_t total = numel_of(x);
  const int64_t rank = static_cast<int64_t>(x.sizes.size());
  int64_t inner = 1;
  if (rank > 0) {
    int64_t dim = int_at(c.in, r.p1, -1);
    if (dim < 0) dim += rank;
    if (dim < 0 || dim >= rank) fail(c, "dim out of range");
    inner = x.sizes[static_cast<size_t>(dim)];
  }
  f.inner = inner;
  f.outer = inner > 0 ? total / inner : 0;
  f.flops = r.per_elem * static_cast<double>(total);
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  f.dtype = x.dtype;
  // aten/src/ATen/native/cuda/SoftMax.cu: rows of <= 1024 elements run the persistent warp
  // softmax (dispatch_softmax_forward / _backward), which holds the row in registers: one
  // pass. Longer rows run the block kernels (cunn_SoftMaxForward / Backward): a max pass and
  // a sum pass (ilpReduce) before the write pass; the smem variant re-reads from shared
  // memory, but the reduction passes still stream the row: two input passes. The backward's
  // warp kernel (dispatch_softmax_backward -> softmax_warp_backward) loads grad and output the
  // same way, a scalar per lane per iteration, so it streams at the same rate.
  f.input_passes = inner <= 1024 ? 1.0 : 2.0;
  f.warp_softmax = inner <= 1024;
  return rowwise_tiling();
}

Tiling f_elementwise(const Ctx& c, const Rule& r, UnitFeatures& f);

// Reductions (sum, mean, amax, var, ...): input 0 reduced into the outputs; outer = output
// elements, inner = input elements per output.
Tiling f_reduction(const Ctx& c, const Rule& r, UnitFeatures& f) {
  // max.other / min.other are binary element-wise ops that share the reductions' names.
  if (tensor_at(c.in, 1) != nullptr) {
    f.kind = K::kElementwise;
    return f_elementwise(c, r, f);
  }
  const TensorInfo& x = need_tensor(c, 0, "input");
  const int64_t total = numel_of(x);
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  f.outer = std::max<int64_t>(1, std::min(f.numel, std::max<int64_t>(total, 1)));
  f.inner = total / f.outer;
  f.flops = r.per_elem * static_cast<double>(total);
  f.dtype = x.dtype;
  return reduction_tiling(static_cast<double>(total));
}

// Element-wise ops (and losses computed element-wise): every distinct tensor input read once
// (a broadcast input once), outputs written (in-place: self). FLOPs = per_elem * elements.
Tiling f_elementwise(const Ctx& c, const Rule& r, UnitFeatures& f) {
  f.bytes_read = read_bytes(c);
  count_writes(c, f, 0);
  int64_t work = f.numel;
  std::vector<const TensorInfo*> ins;
  for_each_tensor(c.in, [&](const TensorInfo& t) {
    work = std::max(work, numel_of(t));
    ins.push_back(&t);
  });
  const TensorInfo* dst = first_output(c);
  if (dst == nullptr && !ins.empty()) dst = ins[0];  // an in-place op writes its self
  f.permuted = dst != nullptr && permuted_access(*dst, ins);
  f.flops = r.per_elem * static_cast<double>(work);
  f.dtype = has_tensor(c.out) ? largest_dtype(c.out) : largest_dtype(c.in);
  return elementwise_tiling(static_cast<double>(work));
}

// Ops that only write their output (fill, zero, arange, random fills): nothing read.
Tiling f_write_only(const Ctx& c, const Rule& r, UnitFeatures& f) {
  count_writes(c, f, 0);
  f.flops = r.per_elem * static_cast<double>(f.numel);
  return elementwise_tiling(static_cast<double>(f.numel));
}

constexpr int kCpuDevice = 0;  // c10::DeviceType::CPU

// The input position of the copy op's non_blocking flag (-1: none, the copy blocks).
int nonblocking_position(const std::string& op) {
  const std::string base = op_base_name(op);
  if (base == "aten::_to_copy") return 5;  // (self, *, dtype, layout, device, pin_memory, nb)
  if (base == "aten::copy_" || base == "aten::copy" || base == "aten::_copy_from") return 2;
  return -1;
}

// Copies: bytes only. p0 = the destination input (copy_: 0), -1 when the op allocates its
// output. An output that is the input itself (contiguous() of a contiguous tensor) is no copy.
Tiling f_copy(const Ctx& c, const Rule& r, UnitFeatures& f) {
  if (r.p0 < 0 && has_tensor(c.out)) {
    bool all_alias = true;
    for_each_tensor(c.out, [&](const TensorInfo& o) {
      bool found = false;
      for_each_tensor(c.in, [&](const TensorInfo& t) { found = found || same_tensor(o, t); });
      all_alias = all_alias && found;
    });
    if (all_alias) {
      f.kernels = 0;
      f.numel = largest_numel(c.out);
      return no_tiling();
    }
  }
  f.bytes_read = read_bytes(c, r.p0);
  count_writes(c, f, r.p0 >= 0 ? r.p0 : 0);
  // copy_(self, src): self is the destination; an allocating copy writes its output.
  const TensorInfo* dst = r.p0 >= 0 ? tensor_at(c.in, r.p0) : first_output(c);
  std::vector<const TensorInfo*> srcs;
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (static_cast<int>(i) == r.p0) continue;
    for_each_tensor(c.in[i], [&](const TensorInfo& t) { srcs.push_back(&t); });
  }
  f.permuted = dst != nullptr && permuted_access(*dst, srcs);
  // A copy between host and device memory (x.to(device) of a CPU tensor, torch.tensor(data,
  // device=...)) is one cudaMemcpyAsync; without non_blocking, copy_kernel_cuda
  // (aten/src/ATen/native/cuda/Copy.cu) calls memcpy_and_sync, a cudaStreamSynchronize: the
  // CPU waits for everything queued before it.
  if (dst != nullptr) {
    const bool crosses = std::any_of(srcs.begin(), srcs.end(), [&](const TensorInfo* s) {
      return (s->device_type == kCpuDevice) != (dst->device_type == kCpuDevice);
    });
    if (crosses && !bool_at(c.in, nonblocking_position(c.op), false)) f.host_sync = true;
  }
  return elementwise_tiling(static_cast<double>(f.numel));
}

// c10::ScalarType codes of the index dtypes advanced indexing treats as masks.
constexpr int kByte = 0;
constexpr int kBool = 11;

// The first boolean (or uint8) mask among the indices at input `pos` (a tensor or a list).
const TensorInfo* index_mask(const Ctx& c, int pos) {
  const TensorInfo* mask = nullptr;
  if (pos < 0 || pos >= static_cast<int>(c.in.size())) return nullptr;
  for_each_tensor(c.in[static_cast<size_t>(pos)], [&](const TensorInfo& t) {
    if (mask == nullptr && (t.dtype == kBool || t.dtype == kByte)) mask = &t;
  });
  return mask;
}

// Advanced indexing turns a mask into int64 coordinates before its kernel (expandTensors,
// aten/src/ATen/native/IndexingUtils.h: mask.nonzero()). cuda/Nonzero.cu counts the set
// elements with cub, copies the count to the host (the CPU waits for the stream there), then a
// cub select writes the `count` x mask-dims coordinates: two passes over the mask.
void add_mask_nonzero(const TensorInfo& mask, double count, UnitFeatures& f) {
  f.bytes_read += 2.0 * stored_bytes(mask);
  f.bytes_written += 8.0 * static_cast<double>(mask.sizes.size()) * count;
  f.kernels += 2;
  f.host_sync = true;
}

// Gathers (embedding, index_select, gather, index, masked_select): p0 = the source, p1 = the
// indices (tensor or list). Reads the indices and only the gathered elements of the source, not
// all of it. A boolean mask among the indices is first made coordinates (add_mask_nonzero); the
// gather kernel then reads `count` int64 coordinates per mask dimension, count from the output
// (the mask spans source dims: count = output / (source / mask); p2 = 1, masked_select: the
// broadcast mask spans them all, count = output).
Tiling f_gather(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& src = need_tensor(c, r.p0, "source");
  ByteSet idx;
  int64_t n_idx = 0;
  const TensorInfo* mask = index_mask(c, r.p1);
  if (r.p1 >= 0 && r.p1 < static_cast<int>(c.in.size())) {
    for_each_tensor(c.in[static_cast<size_t>(r.p1)], [&](const TensorInfo& t) {
      if (&t == mask) return;
      idx.add(t);
      n_idx = std::max(n_idx, numel_of(t));
    });
  }
  count_writes(c, f, -1);
  double coords = 0.0;  // bytes of the int64 coordinates a mask becomes
  if (mask != nullptr) {
    const int64_t per_set = numel_of(src) / std::max<int64_t>(1, numel_of(*mask));
    const double rows_per = r.p2 == 1 ? 1.0 : static_cast<double>(std::max<int64_t>(1, per_set));
    const double count = static_cast<double>(f.numel) / rows_per;
    add_mask_nonzero(*mask, count, f);
    coords = 8.0 * static_cast<double>(mask->sizes.size()) * count;
    n_idx = std::max(n_idx, static_cast<int64_t>(count));
  }
  f.bytes_read += idx.bytes() + coords + static_cast<double>(f.numel) *
                                             static_cast<double>(dtype_itemsize(src.dtype));
  f.outer = n_idx;
  f.inner = n_idx > 0 ? f.numel / n_idx : 0;
  f.dtype = src.dtype;
  return elementwise_tiling(static_cast<double>(f.numel));
}

// nonzero(self): cuda/Nonzero.cu, as add_mask_nonzero (count pass, count to the host, select
// pass); the output is count x self's dims of int64.
Tiling f_nonzero(const Ctx& c, const Rule&, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "self");
  const TensorInfo* o = first_output(c);
  const double count = o != nullptr && !o->sizes.empty() ? static_cast<double>(o->sizes[0]) : 0.0;
  f.kernels = 0;
  add_mask_nonzero(x, count, f);
  f.numel = numel_of(x);
  f.dtype = x.dtype;
  return reduction_tiling(static_cast<double>(f.numel));
}

// embedding_dense_backward(grad_output 0, indices 1, num_weights, ...): reads grad_output and
// indices, writes the whole [num_weights, D] gradient; one add per grad_output element.
Tiling f_embedding_backward(const Ctx& c, const Rule&, UnitFeatures& f) {
  const TensorInfo& go = need_tensor(c, 0, "grad_output");
  const TensorInfo& idx = need_tensor(c, 1, "indices");
  f.bytes_read = read_bytes(c);
  count_writes(c, f, -1);
  f.flops = static_cast<double>(numel_of(go));
  f.outer = numel_of(idx);
  f.inner = f.outer > 0 ? numel_of(go) / f.outer : 0;
  f.dtype = go.dtype;
  return elementwise_tiling(static_cast<double>(numel_of(go)));
}

// Scatters (index_put_, index_add_, scatter_add): p0 = self, p1 = indices, p2 = source. Reads
// indices and source and read-modify-writes the touched elements of self; an out-of-place
// variant first copies self.
Tiling f_scatter(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& self = need_tensor(c, r.p0, "self");
  ByteSet rd;
  int64_t n_idx = 0;
  if (r.p1 < static_cast<int>(c.in.size())) {
    for_each_tensor(c.in[static_cast<size_t>(r.p1)], [&](const TensorInfo& t) {
      rd.add(t);
      n_idx = std::max(n_idx, numel_of(t));
    });
  }
  // scatter.value has a scalar source: one store per index then.
  const TensorInfo* src = tensor_at(c.in, r.p2);
  if (src != nullptr) rd.add(*src);
  const int64_t n_src = src != nullptr ? numel_of(*src) : n_idx;
  const double touched =
      static_cast<double>(n_src) * static_cast<double>(dtype_itemsize(self.dtype));
  f.bytes_read = rd.bytes() + touched;
  f.bytes_written = touched;
  const TensorInfo* o = first_output(c);
  if (o != nullptr && !same_tensor(*o, self)) {
    f.bytes_read += stored_bytes(self);
    f.bytes_written += stored_bytes(*o);
    f.kernels = 2;
  }
  f.numel = numel_of(self);
  f.flops = r.per_elem * static_cast<double>(n_src);
  f.dtype = self.dtype;
  return elementwise_tiling(static_cast<double>(n_src));
}

// Kernel launches of ATen's multi_tensor_apply (MultiTensorApply.cuh): a launch whenever the
// tensors (per depth) or the 64K-element chunks (blocks) of one launch fill up.
constexpr int64_t kMtaChunk = 65536;
int64_t multi_tensor_launches(const std::vector<int64_t>& numels, int depth, bool large_args) {
  static const int64_t kMaxTensors[5] = {110, 64, 48, 36, 30};
  static const int64_t kMaxTensorsLarge[5] = {770, 448, 336, 252, 210};
  depth = std::min(5, std::max(1, depth));
  const int64_t max_tensors = (large_args ? kMaxTensorsLarge : kMaxTensors)[depth - 1];
  const int64_t max_blocks = large_args ? 2240 : 320;
  int64_t launches = 0, loc_tensor = 0, loc_block = 0;
  for (int64_t n : numels) {
    if (n == 0) continue;
    ++loc_tensor;
    const int64_t chunks = ceil_div(n, kMtaChunk);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      ++loc_block;
      const bool last = ch == chunks - 1;
      if ((loc_tensor == max_tensors && last) || loc_block == max_blocks) {
        ++launches;
        loc_block = 0;
        loc_tensor = last ? 0 : 1;
      }
    }
  }
  if (loc_block != 0) ++launches;
  return launches;
}

// _foreach_* ops: summed over the lists. Self is list 0 (in-place variants write it);
// p0 = extra kernels after the multi-tensor launches (_foreach_norm's cleanup kernel).
Tiling f_foreach(const Ctx& c, const Rule& r, UnitFeatures& f) {
  if (c.in.empty() || c.in[0].kind != ArgKind::kTensorList) fail(c, "expected a tensor list");
  f.bytes_read = read_bytes(c);
  count_writes(c, f, 0);
  std::vector<int64_t> numels;
  int64_t total = 0, chunks = 0;
  for_each_tensor(c.in[0], [&](const TensorInfo& t) {
    numels.push_back(numel_of(t));
    total += numel_of(t);
    chunks += ceil_div(numel_of(t), kMtaChunk);
  });
  int depth = 0;
  for (const Arg& a : c.in) depth += a.kind == ArgKind::kTensorList ? 1 : 0;
  for (const Arg& a : c.out) depth += a.kind == ArgKind::kTensorList ? 1 : 0;
  f.kernels = multi_tensor_launches(numels, depth, c.opts.large_kernel_args) +
              std::max(0, r.p0);
  f.flops = r.per_elem * static_cast<double>(total);
  f.dtype = largest_dtype({c.in[0]});
  f.outer = static_cast<int64_t>(numels.size());
  return Tiling{Tiling::kMultiTensor, 0.0, chunks, 0};
}

// Fused optimizers (_fused_adamw_, _fused_adam_, _fused_sgd_, _fused_adagrad_): p0 = bitmask
// of the tensor-list inputs written in place, p1 = the state_steps list (-1 none; it is not a
// multi-tensor depth). Reads every list once.
Tiling f_fused_optimizer(const Ctx& c, const Rule& r, UnitFeatures& f) {
  if (c.in.empty() || c.in[0].kind != ArgKind::kTensorList) fail(c, "expected a tensor list");
  f.bytes_read = read_bytes(c);
  ByteSet w;
  int depth = 0;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const Arg& a = c.in[i];
    if (a.kind != ArgKind::kTensorList) continue;
    if (i < 31 && (r.p0 >> i) & 1) for_each_tensor(a, [&](const TensorInfo& t) { w.add(t); });
    if (static_cast<int>(i) != r.p1 && has_tensor({a})) ++depth;
  }
  f.bytes_written = w.bytes();
  std::vector<int64_t> numels;
  int64_t total = 0, chunks = 0;
  for_each_tensor(c.in[0], [&](const TensorInfo& t) {
    numels.push_back(numel_of(t));
    total += numel_of(t);
    chunks += ceil_div(numel_of(t), kMtaChunk);
  });
  f.kernels = multi_tensor_launches(numels, depth, c.opts.large_kernel_args);
  f.numel = total;
  f.flops = r.per_elem * static_cast<double>(total);
  f.dtype = largest_dtype({c.in[0]});
  f.outer = static_cast<int64_t>(numels.size());
  return Tiling{Tiling::kMultiTensor, 0.0, chunks, 0};
}

// nll_loss forward (self 0, target 1, weight 2): reads the targets and the one picked
// log-probability per target, not the whole (N, C) input.
Tiling f_nll_forward(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& self = need_tensor(c, 0, "self");
  const TensorInfo& target = need_tensor(c, 1, "target");
  const int64_t nt = numel_of(target);
  f.bytes_read = stored_bytes(target) +
                 static_cast<double>(nt) * static_cast<double>(dtype_itemsize(self.dtype));
  if (const TensorInfo* w = tensor_at(c.in, 2)) f.bytes_read += stored_bytes(*w);
  count_writes(c, f, -1);
  f.outer = nt;
  f.inner = self.sizes.size() >= 2 ? self.sizes[1] : (self.sizes.empty() ? 1 : self.sizes[0]);
  f.flops = r.per_elem * static_cast<double>(nt);
  f.dtype = self.dtype;
  return reduction_tiling(static_cast<double>(nt));
}

// nll_loss backward (grad_output 0, self 1, target 2, weight 3, ..., total_weight 6): the CUDA
// kernel zero-fills the whole grad_input, then scatters one value per target. self is not read.
Tiling f_nll_backward(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& self = need_tensor(c, 1, "self");
  const TensorInfo& target = need_tensor(c, 2, "target");
  f.bytes_read = read_bytes(c, 1);
  count_writes(c, f, -1);
  f.outer = numel_of(target);
  f.inner = self.sizes.size() >= 2 ? self.sizes[1] : (self.sizes.empty() ? 1 : self.sizes[0]);
  f.flops = r.per_elem * static_cast<double>(numel_of(target));
  f.dtype = self.dtype;
  return elementwise_tiling(static_cast<double>(f.numel));
}

// upsample_bilinear2d forward (input 0 -> output), UpSampleBilinear2d.cu: an NHWC input of >= 16
// channels (with its output NHWC too) runs upsample_bilinear2d_nhwc_out_frame, one thread per
// output element, and equal sizes are a copy: element-wise cost. Otherwise
// upsample_bilinear2d_out_frame launches out_h x out_w threads in CTAs of 1024 and each thread
// loops over all N x C planes (kSerialLoopIterationS): at 7x7 -> 14x14 that is 196 threads for
// the whole batch.
Tiling f_upsample_bilinear(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  const TensorInfo* y = first_output(c);
  if (y == nullptr) fail(c, "has no output tensor");
  Tiling t = f_elementwise(c, r, f);
  f.channels_last = channels_last(x);
  if (x.sizes.size() != 4 || y->sizes.size() != 4 || x.sizes == y->sizes) return t;
  if (f.channels_last && x.sizes[1] >= 16 && channels_last(*y)) return t;
  const int64_t pixels = y->sizes[2] * y->sizes[3];
  if (pixels <= 0) return t;
  f.serial_loop_iters = x.sizes[0] * x.sizes[1];
  return serial_loop_tiling(pixels, 1024);
}

// upsample_bilinear2d_backward (grad_output 0 -> grad_input), UpSampleBilinear2d.cu
// upsample_bilinear2d_backward_out_cuda_template: grad_input.zero_() (a fill), then one thread
// per grad_output element (NCHW and NHWC alike) scattering four weighted fastAtomicAdds into
// grad_input: its lines are read into L2 and written back once more. Equal sizes are the zero
// fill then a copy. The atomics' own throughput is not modelled.
Tiling f_upsample_bilinear_backward(const Ctx& c, const Rule& r, UnitFeatures& f) {
  Tiling t = f_elementwise(c, r, f);
  const TensorInfo* gi = first_output(c);
  if (gi == nullptr) fail(c, "has no output tensor");
  const TensorInfo& go = need_tensor(c, 0, "grad_output");
  const double gi_bytes = stored_bytes(*gi);
  f.bytes_read += gi_bytes;
  f.bytes_written += gi_bytes;
  f.kernels = 2;
  f.channels_last = channels_last(go);
  // grad_output_.contiguous(memory_format) first: a copy kernel unless it already is (a sum
  // loss's gradient is one value broadcast, stored once).
  const double go_full = static_cast<double>(numel_of(go)) * dtype_itemsize(go.dtype);
  if (!f.channels_last && !dense_in(go, false)) {
    f.bytes_read += go_full;  // the main kernel reads the copy
    f.bytes_written += go_full;
    f.kernels += 1;
  }
  return t;
}

// im2col / col2im (F.unfold / F.fold; aten/src/ATen/native/cuda/Im2Col.cu, Col2Im.cu): the host
// loops over the batch, input.select(0, elt) and one kernel launch per image, so a batched call
// is N launches of per-image kernels (N launch floors), not one kernel over the batch. Bytes as
// element-wise. Unbatched input (im2col 3-D, col2im 2-D): one launch.
Tiling f_im2col(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  Tiling t = f_elementwise(c, r, f);
  const size_t batched_rank = r.p0 == 0 ? 4 : 3;
  if (x.sizes.size() == batched_rank) f.kernels = std::max<int64_t>(1, x.sizes[0]);
  return t;
}

// Anything else: bytes from the tensor arguments, FLOPs per_elem * elements (0 for the
// fallback).
Tiling f_generic(const Ctx& c, const Rule& r, UnitFeatures& f) { return f_elementwise(c, r, f); }

// View / metadata / allocation-only ops: no kernel, no traffic.
Tiling f_metadata(const Ctx& c, const Rule&, UnitFeatures& f) {
  f.kernels = 0;
  f.numel = largest_numel(c.out);
  return no_tiling();
}

// Composite ops: their kernels are the ops they call, which the trace records beneath them.
Tiling f_composite(const Ctx& c, const Rule&, UnitFeatures&) {
  fail(c, "is a composite op: on CUDA it runs the ops it calls (recorded beneath it in the "
          "trace), so cost those units instead of it");
}

// ---- kernels the meta device skips: sorts, selections, scans, masked and accumulating
// scatters (issue 9, item 4) ------------------------------------------------------------------
//
// The ops below reach CUDA kernels through CompositeExplicitAutograd wrappers (sort ->
// sort.stable, kthvalue -> kthvalue.values, cummax -> _cummax_helper, ...), which the meta
// device answers with a Python meta function that only allocates. The cut makes the wrapper the
// unit (unit_rule_ops in cost_model.cpp); these formulas count the passes the CUDA kernels make.

// The dim argument: the first int input after the tensor (sort(self, dim, ...),
// sort.stable(self, *, stable, dim, ...), cumsum(self, dim), median.dim(self, dim, ...)), or
// `dflt` when there is none (msort sorts dim 0). Wrapped into [0, rank).
int64_t first_int_dim(const Ctx& c, const TensorInfo& x, int from, int64_t dflt) {
  int64_t dim = dflt;
  for (size_t i = static_cast<size_t>(from); i < c.in.size(); ++i) {
    if (c.in[i].kind == ArgKind::kInt) {
      dim = c.in[i].i;
      break;
    }
  }
  const int64_t rank = static_cast<int64_t>(x.sizes.size());
  if (rank == 0) return 0;
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) fail(c, "dim out of range for a " + std::to_string(rank) + "-d input");
  return dim;
}

// Slices along `dim`: (number of slices, elements per slice). A 0-d tensor is one slice of 1.
std::pair<int64_t, int64_t> slices_along(const TensorInfo& x, int64_t dim) {
  const int64_t total = numel_of(x);
  if (x.sizes.empty()) return {1, 1};
  const int64_t n = x.sizes[static_cast<size_t>(dim)];
  return {n > 0 ? total / n : 0, n};
}

// cub radix sorts make one pass per 8 key bits (DeviceRadixSort's onesweep policy).
constexpr int64_t kRadixBitsPerPass = 8;
// PyTorch's radix select (SortingRadixSelect.cuh, RADIX_BITS) looks at 2 bits per pass.
constexpr int64_t kSelectBitsPerPass = 2;
// Sort.h should_use_small_sort: slices of at most 4096 elements sort in shared memory.
constexpr int64_t kSmallSortMax = 4096;

// sort / argsort / msort (aten/src/ATen/native/cuda/Sort.cpp, sort_stable_kernel). p0 = the
// default dim. Slices of <= 4096 elements: values.copy_(self), fillSliceWithIndex(indices), then
// sortKeyValueInplace (bitonic / warp-merge sort of keys + int64 indices in shared memory, one
// CTA per slice): 3 kernels. Longer slices: launch_stable_sort_kernel (SortStable.cu), a cub
// radix sort of (key, index) pairs, the segment id packed above the key bits when there are
// several slices: an iota, a histogram and one pass per 8 key bits, each reading and writing
// keys and indices. Indices are int64.
Tiling f_sort(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  const int64_t dim = first_int_dim(c, x, 1, r.p0);
  const auto [slices, n] = slices_along(x, dim);
  const double total = static_cast<double>(numel_of(x));
  const double s = static_cast<double>(dtype_itemsize(x.dtype));
  f.outer = slices;
  f.inner = n;
  f.dtype = x.dtype;
  f.numel = numel_of(x);
  if (n <= 1) {  // values.copy_(self); indices.zero_()
    f.bytes_read = total * s;
    f.bytes_written = total * (s + 8.0);
    f.kernels = 2;
    return elementwise_tiling(total);
  }
  if (n <= kSmallSortMax) {
    f.bytes_read = total * s + total * (s + 8.0);
    f.bytes_written = total * s + total * 8.0 + total * (s + 8.0);
    f.kernels = 3;
    // log2(n) stages of compare-exchange per element (bitonic).
    f.flops = total * std::ceil(std::log2(static_cast<double>(n)));
    return preset_tiling(slices, std::min<int64_t>(1024, std::max<int64_t>(32, n / 2)));
  }
  int64_t bits = 8 * dtype_itemsize(x.dtype);
  if (slices > 1) bits += static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(slices))));
  const int64_t passes = ceil_div(bits, kRadixBitsPerPass);
  const double pass_bytes = total * (s + 8.0);
  f.bytes_read = total * s + static_cast<double>(passes) * pass_bytes;
  f.bytes_written = total * 8.0 + static_cast<double>(passes) * pass_bytes;
  f.kernels = 2 + passes;
  f.flops = total * static_cast<double>(passes) * 2.0;  // digit extract + scatter per pass
  return elementwise_tiling(total);
}

// TensorTopK.cu should_use_multiblock: long slices, few of them, take the multi-block path.
bool topk_multiblock(int64_t slices, int64_t n) {
  return (slices <= 20 && n >= 20000) || (slices > 20 && slices <= 40 && n >= 10000) ||
         (slices > 40 && slices <= 80 && n >= 8000) || (slices > 80 && slices < 200 && n >= 5000) ||
         (slices >= 200 && slices < 800 && n >= 3000) ||
         (slices >= 800 && slices <= 4000 && n >= 800) || (slices > 4000 && n >= 400);
}

// Radix selections: topk (TensorTopK.cu), kthvalue / median / nanmedian (Sorting.cu,
// gatherKthValue / gatherMedian). p0 = the dim argument's position (-1: the whole tensor is one
// slice, median()), p1 = 0 topk (k at input 1, sorted at input 4), 1 one value per slice.
// Single-block path (every kthvalue / median, topk on short or many slices): one CTA per slice
// runs 2-bit radix passes over its slice, then gathers; the slice is re-read each pass, from L2
// when the slices the GPU works on at once fit there (counted once from DRAM), else from DRAM.
// topk's multi-block path: one kernel pair per 8 key bits over the whole input, then a gather.
// topk(sorted=True) then sorts the k outputs of each slice (sortKeyValueInplace).
Tiling f_select(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  const double s = static_cast<double>(dtype_itemsize(x.dtype));
  int64_t slices = 1, n = numel_of(x);
  const bool has_dim = r.p0 >= 0 && r.p0 < static_cast<int>(c.in.size()) &&
                       c.in[static_cast<size_t>(r.p0)].kind == ArgKind::kInt;
  if (has_dim && !x.sizes.empty()) {
    int64_t dim = c.in[static_cast<size_t>(r.p0)].i;
    const int64_t rank = static_cast<int64_t>(x.sizes.size());
    if (dim < 0) dim += rank;
    if (dim < 0 || dim >= rank) fail(c, "dim out of range");
    std::tie(slices, n) = slices_along(x, dim);
  }
  const double in_bytes = static_cast<double>(numel_of(x)) * s;
  const int64_t bits = 8 * dtype_itemsize(x.dtype);
  f.outer = slices;
  f.inner = n;
  f.dtype = x.dtype;
  count_writes(c, f, -1);
  const bool is_topk = r.p1 == 0;
  const int64_t k = is_topk ? std::max<int64_t>(int_at(c.in, 1, 1), 0) : 1;
  Tiling tiling;
  if (is_topk && topk_multiblock(slices, n)) {
    const int64_t passes = ceil_div(bits, kRadixBitsPerPass);
    f.bytes_read = in_bytes * static_cast<double>(passes + 1);
    f.kernels = 2 * passes + 1;
    tiling = elementwise_tiling(static_cast<double>(numel_of(x)));
  } else {
    const int64_t passes = ceil_div(bits, kSelectBitsPerPass);
    const double resident = static_cast<double>(std::min<int64_t>(slices, c.gpu.sm_count * 2)) *
                            static_cast<double>(n) * s;
    const bool cached = c.gpu.l2_bytes <= 0 || resident <= 0.5 * c.gpu.l2_bytes;
    f.bytes_read = in_bytes * (cached ? 1.0 : static_cast<double>(passes + 1));
    f.kernels = 1;
    const int64_t threads = std::min<int64_t>(1024, std::max<int64_t>(32, ceil_div(n, 32) * 32));
    tiling = preset_tiling(slices, threads);
  }
  f.flops = static_cast<double>(numel_of(x)) * static_cast<double>(ceil_div(bits, kSelectBitsPerPass));
  if (is_topk && k > 1 && bool_at(c.in, 4, true)) {
    const double sorted = static_cast<double>(slices) * static_cast<double>(k) * (s + 8.0);
    f.bytes_read += sorted;
    f.bytes_written += sorted;
    f.kernels += 1;
  }
  return tiling;
}

// Scans (ScanKernels.cu / ScanUtils.cuh): cumsum, cumprod, logcumsumexp, cummax, cummin. One
// pass: a row-block scan along the innermost dim, a column scan along an outer one, cub's
// single-pass (decoupled look-back) scan for a 1-D input. Reads the input once, writes the
// outputs (cummax / cummin: values + int64 indices). p0 = the input's dim default.
Tiling f_scan(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const TensorInfo& x = need_tensor(c, 0, "input");
  const int64_t dim = first_int_dim(c, x, 1, r.p0);
  const auto [slices, n] = slices_along(x, dim);
  f.outer = slices;
  f.inner = n;
  f.bytes_read = stored_bytes(x);
  count_writes(c, f, -1);
  if (f.bytes_written == 0) {  // _cummax_helper(self, values, indices, dim) writes its inputs
    for (int i = 1; i < static_cast<int>(c.in.size()); ++i) {
      if (const TensorInfo* t = tensor_at(c.in, i)) f.bytes_written += stored_bytes(*t);
    }
  }
  f.numel = numel_of(x);
  f.flops = r.per_elem * static_cast<double>(f.numel);
  f.dtype = x.dtype;
  return reduction_tiling(static_cast<double>(f.numel));
}

// index_put / _index_put_impl (self 0, indices 1, values 2, accumulate 3; Indexing.cu). Without
// accumulate: the TensorIterator index kernel (f_scatter). With accumulate (also the backward of
// advanced indexing, x[idx]): index_put_with_sort_kernel computes linear int64 indices, radix-
// sorts (index, position) pairs over ceil(log2(numel(self))) bits (one pass per 8 bits, an
// iota and a histogram kernel), then accumulates each run of equal indices in order.
//
// A boolean mask among the indices is first made coordinates (add_mask_nonzero). Its count is
// data: values with a row per masked place (the backward of x[mask]) carry it; a value
// broadcast to every masked place (x[mask] = v) does not, and the count is taken as the whole
// mask (an upper bound on the places written).
Tiling f_index_put(const Ctx& c, const Rule& r, UnitFeatures& f) {
  Tiling t = f_scatter(c, r, f);
  const TensorInfo& self = need_tensor(c, 0, "self");
  int64_t n_idx = 0;
  const TensorInfo* mask = index_mask(c, 1);
  if (c.in.size() > 1) {
    for_each_tensor(c.in[1], [&](const TensorInfo& i) {
      if (&i != mask) n_idx = std::max(n_idx, numel_of(i));
    });
  }
  if (mask != nullptr) {
    const TensorInfo* values = tensor_at(c.in, 2);
    const int64_t per_set = numel_of(self) / std::max<int64_t>(1, numel_of(*mask));
    const int64_t row = std::max<int64_t>(1, per_set);
    const int64_t given = values != nullptr ? numel_of(*values) : 0;
    const int64_t count = given > row ? given / row : numel_of(*mask);
    add_mask_nonzero(*mask, static_cast<double>(count), f);
    const double s = static_cast<double>(dtype_itemsize(self.dtype));
    const double touched = static_cast<double>(count) * static_cast<double>(row) * s;
    // f_scatter counted the mask's bytes as indices and the values' elements as the places
    // touched; the kernel reads count int64 coordinates per mask dim and touches count rows.
    f.bytes_read += 8.0 * static_cast<double>(mask->sizes.size() * count) - stored_bytes(*mask) +
                    touched - static_cast<double>(given) * s;
    f.bytes_written += touched - static_cast<double>(given) * s;
    n_idx = std::max(n_idx, count);
    t = elementwise_tiling(static_cast<double>(count * row));
  }
  if (!bool_at(c.in, 3, false)) return t;
  const double idx = static_cast<double>(n_idx);
  const double space = std::max(2.0, static_cast<double>(numel_of(self)));
  const int64_t passes = ceil_div(static_cast<int64_t>(std::ceil(std::log2(space))), kRadixBitsPerPass);
  const double pair = 16.0 * idx;  // int64 key + int64 position
  f.bytes_written += 8.0 * idx + 8.0 * idx + static_cast<double>(passes) * pair;  // keys, iota, passes
  f.bytes_read += static_cast<double>(passes) * pair + pair;                      // passes, final
  f.kernels += 3 + passes;
  return t;
}

// masked_scatter (self 0, mask 1, source 2; IndexKernel.cu masked_scatter_cuda_impl): the
// out-of-place op clones self; an exclusive cub scan turns the byte mask into int64 source
// positions; one TensorIterator kernel then copies source elements into the masked places.
// The masked count is data-dependent: up to min(numel(source), numel(self)) are moved.
Tiling f_masked_scatter(const Ctx& c, const Rule&, UnitFeatures& f) {
  const TensorInfo& self = need_tensor(c, 0, "self");
  const TensorInfo& mask = need_tensor(c, 1, "mask");
  const TensorInfo& src = need_tensor(c, 2, "source");
  const double n = static_cast<double>(std::max(numel_of(self), numel_of(mask)));
  const double s = static_cast<double>(dtype_itemsize(self.dtype));
  const double moved = std::min(static_cast<double>(numel_of(src)), n) * s;
  const double mask_b = n * static_cast<double>(dtype_itemsize(mask.dtype));
  f.bytes_read = mask_b + mask_b + 8.0 * n + moved;  // scan, then mask + positions + source
  f.bytes_written = 8.0 * n + moved;
  f.kernels = 2;
  const TensorInfo* o = first_output(c);
  if (o != nullptr && !same_tensor(*o, self)) {
    f.bytes_read += stored_bytes(self);
    f.bytes_written += stored_bytes(*o);
    f.kernels = 3;
  }
  f.numel = static_cast<int64_t>(n);
  f.dtype = self.dtype;
  return elementwise_tiling(n);
}

// ---- cuDNN RNNs (issue 9, item 5) ----------------------------------------------------------

// Gates per cell of cudnnRNNMode_t (RNN_RELU 0, RNN_TANH 1, LSTM 2, GRU 3).
int64_t rnn_gates(int64_t mode) { return mode == 2 ? 4 : mode == 3 ? 3 : 1; }

// _cudnn_rnn (p0 = 0) and _cudnn_rnn_backward (p0 = 1), cudnn/RNN.cpp with cuDNN's standard
// algorithm: per layer and direction one GEMM projects the input of every timestep at once,
// then each timestep runs the recurrent GEMM (mini-batch x hidden @ hidden x gates*hidden) and
// one fused gate kernel (+ the projection GEMM of an LSTM with proj_size). The backward runs
// the recurrence in reverse (gate-gradient kernel + GEMM per step, then one input-gradient GEMM
// per layer) and, for the weight gradients, two GEMMs over all timesteps per layer/direction.
// Bytes: the tensors it reads and writes (weights once: weight_buf and the weight list are the
// same memory) plus the gate workspace each layer writes and reads back. The time is
// rnn_time_s (rnn.cpp); the unit's GEMM view is the recurrent step GEMM.
Tiling f_cudnn_rnn(const Ctx& c, const Rule& r, UnitFeatures& f) {
  const bool bwd = r.p0 == 1;
  const int o = bwd ? 4 : 0;  // the backward's scalar arguments sit 4 later
  const TensorInfo& x = need_tensor(c, 0, "input");
  if (x.sizes.size() != 2 && x.sizes.size() != 3) fail(c, "expected a 2-D (packed) or 3-D input");
  const int64_t mode = int_at(c.in, 6 + o, -1);
  if (mode < 0 || mode > 3) fail(c, "mode must be a cudnnRNNMode_t (0-3)");
  const int64_t hidden = int_at(c.in, 7 + o, 0), proj = int_at(c.in, 8 + o, 0);
  const int64_t layers = int_at(c.in, 9 + o, 0);
  const bool batch_first = bool_at(c.in, 10 + o, false);
  const bool bidir = bool_at(c.in, 13 + o, false);
  const std::vector<int64_t> batch_sizes = ints_at(c.in, 14 + o);
  if (hidden <= 0 || layers <= 0) fail(c, "hidden_size and num_layers must be positive");
  int64_t steps, mini, rows;
  if (!batch_sizes.empty()) {
    steps = static_cast<int64_t>(batch_sizes.size());
    mini = batch_sizes[0];
    rows = x.sizes[0];
  } else {
    if (x.sizes.size() != 3) fail(c, "an unpacked input must be 3-D");
    steps = x.sizes[batch_first ? 1 : 0];
    mini = x.sizes[batch_first ? 0 : 1];
    rows = steps * mini;
  }
  const int64_t dirs = bidir ? 2 : 1, gates = rnn_gates(mode), out = proj > 0 ? proj : hidden;
  const int64_t input_size = x.sizes.back();
  const int64_t g_n = gates * hidden;
  std::vector<int64_t> mask = ints_at(c.in, 21);
  while (mask.size() < 4) mask.push_back(1);
  const bool weights = !bwd || mask[3] != 0;
  const double s = static_cast<double>(dtype_itemsize(x.dtype));
  const double R = static_cast<double>(rows), D = static_cast<double>(dirs);
  double flops = 0.0, workspace = 0.0;
  for (int64_t l = 0; l < layers; ++l) {
    const double in_l = static_cast<double>(l == 0 ? input_size : out * dirs);
    const double proj_f = proj > 0 ? 2.0 * R * static_cast<double>(proj * hidden) : 0.0;
    const double fwd = 2.0 * R * static_cast<double>(g_n) * (in_l + static_cast<double>(out)) + proj_f;
    flops += D * (bwd ? fwd + (weights ? fwd - proj_f : 0.0) : fwd);
    workspace += 2.0 * R * D * static_cast<double>(g_n) * s;  // gates written, then read
  }
  f.flops = flops;
  f.bytes_read = read_bytes(c, 3) + workspace / 2.0;
  count_writes(c, f, -1);
  f.bytes_written += workspace / 2.0;
  f.kernels = layers * dirs * (1 + 2 * steps + (proj > 0 ? steps : 0));
  if (bwd && weights) f.kernels += layers * dirs * 3 + 1;  // dW_ih, dW_hh, bias sum; dw zeroing
  f.m = mini;
  f.n = g_n;
  f.k = out;
  f.batch = layers * dirs;
  f.groups = dirs;
  f.outer = steps;
  f.inner = input_size;
  f.conv_c = hidden;
  f.conv_r = bwd && weights ? 1 : 0;
  f.dtype = x.dtype;
  return gemm_tiling();
}

// ---- the table -------------------------------------------------------------------------------
//
// Columns: kind, formula, FLOPs per element, p0, p1, p2, kernels. Per-element FLOPs of
// element-wise ops count each arithmetic operation once and a transcendental (exp, erf, tanh)
// as one (the SFU issues it as one instruction); they rarely bind, these ops are memory-bound.
// Lookup drops an overload suffix (aten::add.Tensor -> aten::add) and then an in-place
// underscore (aten::add_ -> aten::add: the output is self, so the same formula holds).
const std::unordered_map<std::string, Rule>& rule_table() {
  static const std::unordered_map<std::string, Rule> table = {
      // --- GEMMs (p0 = A, p1 = B): one cuBLAS(Lt) call each.
      {"aten::mm", R(K::kGemm, f_gemm, 0, 0, 1)},                // A @ B
      {"aten::addmm", R(K::kGemm, f_gemm, 0, 1, 2)},             // bias fused as epilogue / beta*C
      {"aten::_addmm_activation", R(K::kGemm, f_gemm, 0, 1, 2)}, // cuBLASLt GELU/ReLU epilogue
      {"aten::bmm", R(K::kGemm, f_gemm, 0, 0, 1)},               // strided-batched GEMM
      {"aten::baddbmm", R(K::kGemm, f_gemm, 0, 1, 2)},           // batched, beta*C fused
      {"aten::_scaled_mm", R(K::kGemm, f_gemm, 0, 0, 1)},        // FP8 GEMM with scales
      {"aten::mv", R(K::kGemm, f_gemm, 0, 0, 1)},                // GEMV (N = 1): cuBLAS gemv
      {"aten::addmv", R(K::kGemm, f_gemm, 0, 1, 2)},             // GEMV with beta*y
      {"aten::dot", R(K::kGemm, f_gemm, 0, 0, 1)},               // 1 x K @ K x 1
      // One grouped GEMM kernel (sm_90 / sm_100 bf16) or one mm per group (f_grouped_mm).
      {"aten::_grouped_mm", R(K::kGemm, f_grouped_mm, 0, 0, 1, 2, -1)},
      // --- Convolutions: one cuDNN call (p0 = schema variant).
      {"aten::convolution", R(K::kConv, f_conv, 0, 0)},           // what conv2d etc. dispatch to
      {"aten::_convolution", R(K::kConv, f_conv, 0, 0)},          // convolution's backend pick
      {"aten::cudnn_convolution", R(K::kConv, f_conv, 0, 1)},     // the cuDNN op itself
      {"aten::cudnn_convolution_transpose", R(K::kConv, f_conv, 0, 2)},
      {"aten::convolution_backward", R(K::kConv, f_conv_backward, 0, -1, -1, -1, -1)},
      // --- Fused attention (p0 = query, p1 = is_causal / custom_mask_type, p2 = layout).
      {"aten::_scaled_dot_product_flash_attention", R(K::kAttention, f_attention_fwd, 0, 0, 4, 0)},
      {"aten::_scaled_dot_product_efficient_attention",
       R(K::kAttention, f_attention_fwd, 0, 0, 6, 0)},
      {"aten::_scaled_dot_product_cudnn_attention",
       R(K::kAttention, f_attention_fwd, 0, 0, 6, 0)},
      {"aten::_flash_attention_forward", R(K::kAttention, f_attention_fwd, 0, 0, 8, 1)},
      {"aten::_efficient_attention_forward", R(K::kAttention, f_attention_fwd, 0, 0, 9, 1)},
      // FA2 backward: dot(dO, O) pre-pass, main kernel, dQ conversion.
      {"aten::_scaled_dot_product_flash_attention_backward",
       R(K::kAttention, f_attention_bwd, 0, 1, 11, 0, 3)},
      {"aten::_flash_attention_backward", R(K::kAttention, f_attention_bwd, 0, 1, 11, 1, 3)},
      // mem-efficient backward: delta pre-pass + main kernel.
      {"aten::_scaled_dot_product_efficient_attention_backward",
       R(K::kAttention, f_attention_bwd, 0, 1, 11, 0, 2)},
      {"aten::_efficient_attention_backward", R(K::kAttention, f_attention_bwd, 0, 1, 14, 1, 2)},
      {"aten::_scaled_dot_product_cudnn_attention_backward",
       R(K::kAttention, f_attention_bwd, 0, 1, 14, 0, 1)},
      // --- Normalisations (p0 = variant, p1 = shape / training / N, p2 = input).
      // Layer norm: mean (1) + variance (3) + normalise (2) + affine (2) per element.
      {"aten::native_layer_norm", R(K::kNorm, f_norm, 8, 0, 1, 0)},
      // Backward: dx kernel + a separate dgamma/dbeta column reduction.
      {"aten::native_layer_norm_backward", R(K::kNorm, f_norm, 12, 0, 2, 1, 2)},
      // RMS norm: square-accumulate (2) + scale (2).
      {"aten::_fused_rms_norm", R(K::kNorm, f_norm, 4, 0, 1, 0)},
      {"aten::_fused_rms_norm_backward", R(K::kNorm, f_norm, 8, 0, 2, 1, 2)},
      // Batch norm: statistics kernel (training) + element-wise transform.
      {"aten::native_batch_norm", R(K::kNorm, f_norm, 8, 1, 1, 0, -1)},
      {"aten::_native_batch_norm_legit", R(K::kNorm, f_norm, 8, 1, 1, 0, -1)},
      {"aten::_native_batch_norm_legit_functional", R(K::kNorm, f_norm, 8, 1, 1, 0, -1)},
      {"aten::_native_batch_norm_legit_no_training", R(K::kNorm, f_norm, 8, 1, 0, 0, -1)},
      {"aten::_batch_norm_with_update", R(K::kNorm, f_norm, 8, 1, 1, 0, -1)},
      {"aten::_batch_norm_no_update", R(K::kNorm, f_norm, 8, 1, 0, 0, -1)},
      {"aten::cudnn_batch_norm", R(K::kNorm, f_norm, 8, 1, 1, 0, -1)},
      // Backward: gradient statistics reduction + element-wise dx.
      {"aten::native_batch_norm_backward", R(K::kNorm, f_norm, 12, 1, 1, 1, 2)},
      {"aten::batch_norm_backward", R(K::kNorm, f_norm, 12, 1, 1, 1, 2)},
      {"aten::cudnn_batch_norm_backward", R(K::kNorm, f_norm, 12, 1, 1, 0, 2)},
      // Group norm: row moments, fused parameters, element-wise transform.
      {"aten::native_group_norm", R(K::kNorm, f_norm, 8, 2, 3, 0, 3)},
      {"aten::native_group_norm_backward", R(K::kNorm, f_norm, 12, 2, 5, 1, 3)},
      // --- Softmax (p0 = input, p1 = dim): max, subtract, exp, sum, scale per element.
      {"aten::_softmax", R(K::kSoftmax, f_softmax, 5, 0, 1)},
      {"aten::_log_softmax", R(K::kSoftmax, f_softmax, 5, 0, 1)},
      // Backward: dot(dy, y) per row, then y * (dy - dot): 4 per element.
      {"aten::_softmax_backward_data", R(K::kSoftmax, f_softmax, 4, 0, 2)},
      {"aten::_log_softmax_backward_data", R(K::kSoftmax, f_softmax, 4, 0, 2)},
      // --- Reductions: one ATen reduce kernel (per input element FLOPs).
      {"aten::sum", R(K::kReduction, f_reduction, 1)},
      {"aten::mean", R(K::kReduction, f_reduction, 1)},
      {"aten::prod", R(K::kReduction, f_reduction, 1)},
      {"aten::amax", R(K::kReduction, f_reduction, 1)},
      {"aten::amin", R(K::kReduction, f_reduction, 1)},
      {"aten::max", R(K::kReduction, f_reduction, 1)},  // .other is element-wise (handled)
      {"aten::min", R(K::kReduction, f_reduction, 1)},
      {"aten::argmax", R(K::kReduction, f_reduction, 1)},
      // cuda/SummaryOps.cu _histc_cuda: the bins zeroed, then one pass of atomic adds over the
      // input (MoE routers count tokens per expert with it)
      {"aten::histc", R(K::kReduction, f_reduction, 1, -1, -1, -1, 2)},
      {"aten::argmin", R(K::kReduction, f_reduction, 1)},
      {"aten::any", R(K::kReduction, f_reduction, 1)},
      {"aten::all", R(K::kReduction, f_reduction, 1)},
      {"aten::var", R(K::kReduction, f_reduction, 3)},  // Welford: delta, mean, M2 updates
      // Pooling: one ATen kernel reading each window; memory-bound, so read-input /
      // write-output bytes with 1 FLOP per input element is the cost (windows overlap a little).
      {"aten::max_pool2d_with_indices", R(K::kReduction, f_reduction, 1)},
      {"aten::max_pool3d_with_indices", R(K::kReduction, f_reduction, 1)},
      {"aten::avg_pool2d", R(K::kReduction, f_reduction, 1)},
      {"aten::avg_pool3d", R(K::kReduction, f_reduction, 1)},
      {"aten::_adaptive_avg_pool2d", R(K::kReduction, f_reduction, 1)},
      {"aten::_adaptive_avg_pool3d", R(K::kReduction, f_reduction, 1)},
      {"aten::adaptive_max_pool2d", R(K::kReduction, f_reduction, 1)},
      // Pooling backward: scatter dy into the window positions, element-wise in cost.
      {"aten::max_pool2d_with_indices_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::max_pool3d_with_indices_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::avg_pool2d_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::avg_pool3d_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::_adaptive_avg_pool2d_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::_adaptive_avg_pool3d_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::adaptive_max_pool2d_backward", R(K::kElementwise, f_elementwise, 1)},
      {"aten::std", R(K::kReduction, f_reduction, 3)},
      {"aten::var_mean", R(K::kReduction, f_reduction, 3)},
      {"aten::std_mean", R(K::kReduction, f_reduction, 3)},
      {"aten::norm", R(K::kReduction, f_reduction, 2)},  // square + accumulate
      {"aten::linalg_vector_norm", R(K::kReduction, f_reduction, 2)},
      // --- Embedding and gathers (p0 = source, p1 = indices).
      {"aten::embedding", R(K::kEmbedding, f_gather, 0, 0, 1)},   // row gather
      {"aten::index_select", R(K::kEmbedding, f_gather, 0, 0, 2)},
      {"aten::gather", R(K::kEmbedding, f_gather, 0, 0, 2)},
      {"aten::index", R(K::kEmbedding, f_gather, 0, 0, 1)},       // advanced indexing
      // cuda/IndexKernel.cpp masked_select_out_cuda_impl: index_out(self, [broadcast mask])
      {"aten::masked_select", R(K::kEmbedding, f_gather, 0, 0, 1, 1)},
      {"aten::nonzero", R(K::kReduction, f_nonzero, 0, -1, -1, -1, -1)},
      // Sort indices, segment, partial sums, accumulate: a chain of small kernels.
      {"aten::embedding_dense_backward", R(K::kEmbedding, f_embedding_backward, 0, -1, -1, -1, 6)},
      // --- Scatters (p0 = self, p1 = indices, p2 = source): one add/store per source element.
      {"aten::index_put", R(K::kEmbedding, f_index_put, 1, 0, 1, 2, -1)},  // + sort when accumulating
      {"aten::_index_put_impl", R(K::kEmbedding, f_index_put, 1, 0, 1, 2, -1)},
      {"aten::index_add", R(K::kEmbedding, f_scatter, 1, 0, 2, 3)},
      {"aten::scatter_add", R(K::kEmbedding, f_scatter, 1, 0, 2, 3)},
      {"aten::scatter", R(K::kEmbedding, f_scatter, 0, 0, 2, 3)},
      // --- Copies (p0 = destination input, -1 when the op allocates): bytes only.
      {"aten::copy_", R(K::kCopy, f_copy, 0, 0)},
      {"aten::copy", R(K::kCopy, f_copy, 0, 0)},          // functional copy_: src into new
      {"aten::_copy_from", R(K::kCopy, f_copy, 0, 1)},
      {"aten::_to_copy", R(K::kCopy, f_copy, 0, -1)},
      {"aten::clone", R(K::kCopy, f_copy, 0, -1)},
      {"aten::contiguous", R(K::kCopy, f_copy, 0, -1)},  // a no-op when already contiguous
      {"aten::cat", R(K::kCopy, f_copy, 0, -1)},         // one batched copy kernel
      {"aten::stack", R(K::kCopy, f_copy, 0, -1)},
      {"aten::_local_scalar_dense", R(K::kCopy, f_copy, 0, -1)},  // .item(): D2H copy + sync
      {"aten::tril", R(K::kCopy, f_copy, 0, -1)},        // masked copy
      {"aten::triu", R(K::kCopy, f_copy, 0, -1)},
      {"aten::roll", R(K::kCopy, f_copy, 0, -1)},
      {"aten::flip", R(K::kCopy, f_copy, 0, -1)},
      {"aten::repeat", R(K::kCopy, f_copy, 0, -1)},
      {"aten::constant_pad_nd", R(K::kCopy, f_copy, 0, -1)},
      // --- Element-wise: binary arithmetic, 1 per element.
      {"aten::add", R(K::kElementwise, f_elementwise, 1)},
      {"aten::sub", R(K::kElementwise, f_elementwise, 1)},
      {"aten::rsub", R(K::kElementwise, f_elementwise, 1)},
      {"aten::mul", R(K::kElementwise, f_elementwise, 1)},
      {"aten::div", R(K::kElementwise, f_elementwise, 1)},
      {"aten::remainder", R(K::kElementwise, f_elementwise, 2)},  // div + floor-subtract
      {"aten::floor_divide", R(K::kElementwise, f_elementwise, 2)},  // div_floor_kernel_cuda
      {"aten::fmod", R(K::kElementwise, f_elementwise, 2)},
      {"aten::maximum", R(K::kElementwise, f_elementwise, 1)},
      {"aten::minimum", R(K::kElementwise, f_elementwise, 1)},
      {"aten::pow", R(K::kElementwise, f_elementwise, 1)},
      {"aten::addcmul", R(K::kElementwise, f_elementwise, 2)},  // a + v*b*c: mul + fma
      {"aten::addcdiv", R(K::kElementwise, f_elementwise, 2)},
      {"aten::lerp", R(K::kElementwise, f_elementwise, 3)},     // a + w*(b - a)
      {"aten::where", R(K::kElementwise, f_elementwise, 1)},
      {"aten::masked_fill", R(K::kElementwise, f_elementwise, 1)},
      {"aten::clamp", R(K::kElementwise, f_elementwise, 2)},
      {"aten::clamp_min", R(K::kElementwise, f_elementwise, 1)},
      {"aten::clamp_max", R(K::kElementwise, f_elementwise, 1)},
      // Comparisons and logic: 1 per element.
      {"aten::eq", R(K::kElementwise, f_elementwise, 1)},
      {"aten::ne", R(K::kElementwise, f_elementwise, 1)},
      {"aten::lt", R(K::kElementwise, f_elementwise, 1)},
      {"aten::le", R(K::kElementwise, f_elementwise, 1)},
      {"aten::gt", R(K::kElementwise, f_elementwise, 1)},
      {"aten::ge", R(K::kElementwise, f_elementwise, 1)},
      {"aten::logical_not", R(K::kElementwise, f_elementwise, 1)},
      {"aten::logical_and", R(K::kElementwise, f_elementwise, 1)},
      {"aten::logical_or", R(K::kElementwise, f_elementwise, 1)},
      {"aten::bitwise_not", R(K::kElementwise, f_elementwise, 1)},
      {"aten::bitwise_and", R(K::kElementwise, f_elementwise, 1)},
      {"aten::bitwise_or", R(K::kElementwise, f_elementwise, 1)},
      {"aten::isnan", R(K::kElementwise, f_elementwise, 1)},
      {"aten::isinf", R(K::kElementwise, f_elementwise, 1)},
      // Unary math: one instruction (FP op or SFU transcendental) each.
      {"aten::neg", R(K::kElementwise, f_elementwise, 1)},
      {"aten::abs", R(K::kElementwise, f_elementwise, 1)},
      {"aten::sign", R(K::kElementwise, f_elementwise, 1)},
      {"aten::sgn", R(K::kElementwise, f_elementwise, 1)},
      {"aten::reciprocal", R(K::kElementwise, f_elementwise, 1)},
      {"aten::sqrt", R(K::kElementwise, f_elementwise, 1)},
      {"aten::rsqrt", R(K::kElementwise, f_elementwise, 1)},
      {"aten::exp", R(K::kElementwise, f_elementwise, 1)},
      {"aten::exp2", R(K::kElementwise, f_elementwise, 1)},
      {"aten::expm1", R(K::kElementwise, f_elementwise, 1)},
      {"aten::log", R(K::kElementwise, f_elementwise, 1)},
      {"aten::log2", R(K::kElementwise, f_elementwise, 1)},
      {"aten::log1p", R(K::kElementwise, f_elementwise, 1)},
      {"aten::sin", R(K::kElementwise, f_elementwise, 1)},
      {"aten::cos", R(K::kElementwise, f_elementwise, 1)},
      {"aten::erf", R(K::kElementwise, f_elementwise, 1)},
      {"aten::tanh", R(K::kElementwise, f_elementwise, 1)},
      {"aten::floor", R(K::kElementwise, f_elementwise, 1)},
      {"aten::ceil", R(K::kElementwise, f_elementwise, 1)},
      {"aten::round", R(K::kElementwise, f_elementwise, 1)},
      {"aten::trunc", R(K::kElementwise, f_elementwise, 1)},
      // Activations and their gradients.
      {"aten::relu", R(K::kElementwise, f_elementwise, 1)},
      {"aten::threshold", R(K::kElementwise, f_elementwise, 1)},
      {"aten::threshold_backward", R(K::kElementwise, f_elementwise, 1)},  // select dy or 0
      {"aten::hardtanh", R(K::kElementwise, f_elementwise, 2)},            // min + max
      {"aten::hardtanh_backward", R(K::kElementwise, f_elementwise, 2)},
      {"aten::leaky_relu", R(K::kElementwise, f_elementwise, 2)},          // compare + mul
      {"aten::leaky_relu_backward", R(K::kElementwise, f_elementwise, 2)},
      {"aten::elu", R(K::kElementwise, f_elementwise, 4)},                 // exp, sub, mul, select
      {"aten::elu_backward", R(K::kElementwise, f_elementwise, 4)},
      {"aten::gelu", R(K::kElementwise, f_elementwise, 6)},     // x/2 * (1 + erf(x/sqrt2)) or tanh
      {"aten::gelu_backward", R(K::kElementwise, f_elementwise, 12)},  // cdf + pdf terms
      {"aten::sigmoid", R(K::kElementwise, f_elementwise, 4)},  // 1 / (1 + exp(-x))
      {"aten::sigmoid_backward", R(K::kElementwise, f_elementwise, 3)},  // dy * y * (1 - y)
      {"aten::tanh_backward", R(K::kElementwise, f_elementwise, 3)},     // dy * (1 - y^2)
      {"aten::silu", R(K::kElementwise, f_elementwise, 5)},              // x * sigmoid(x)
      {"aten::silu_backward", R(K::kElementwise, f_elementwise, 8)},
      {"aten::mish", R(K::kElementwise, f_elementwise, 8)},              // x * tanh(softplus)
      {"aten::mish_backward", R(K::kElementwise, f_elementwise, 14)},
      {"aten::softplus", R(K::kElementwise, f_elementwise, 4)},
      {"aten::softplus_backward", R(K::kElementwise, f_elementwise, 4)},
      {"aten::hardswish", R(K::kElementwise, f_elementwise, 4)},
      {"aten::hardswish_backward", R(K::kElementwise, f_elementwise, 4)},
      {"aten::hardsigmoid", R(K::kElementwise, f_elementwise, 3)},
      {"aten::hardsigmoid_backward", R(K::kElementwise, f_elementwise, 2)},
      // Dropout: Philox draw + compare + scale; backward: mask * dy * scale.
      {"aten::native_dropout", R(K::kElementwise, f_elementwise, 3)},
      {"aten::native_dropout_backward", R(K::kElementwise, f_elementwise, 2)},
      {"aten::_masked_scale", R(K::kElementwise, f_elementwise, 2)},
      // --- Write-only fills: nothing read.
      {"aten::fill", R(K::kElementwise, f_write_only, 0)},
      {"aten::zero", R(K::kElementwise, f_write_only, 0)},
      {"aten::arange", R(K::kElementwise, f_write_only, 1)},
      {"aten::uniform", R(K::kElementwise, f_write_only, 4)},    // Philox + scale/shift
      {"aten::normal", R(K::kElementwise, f_write_only, 6)},     // Philox + Box-Muller
      {"aten::bernoulli", R(K::kElementwise, f_write_only, 4)},
      {"aten::random", R(K::kElementwise, f_write_only, 4)},
      // --- Losses.
      {"aten::nll_loss_forward", R(K::kLoss, f_nll_forward, 2)},   // pick + weighted sum
      {"aten::nll_loss2d_forward", R(K::kLoss, f_nll_forward, 2)},
      {"aten::nll_loss_backward", R(K::kLoss, f_nll_backward, 1, -1, -1, -1, 2)},  // zero + scatter
      {"aten::nll_loss2d_backward", R(K::kLoss, f_nll_backward, 1, -1, -1, -1, 2)},
      {"aten::mse_loss", R(K::kLoss, f_elementwise, 3)},           // sub, square, accumulate
      {"aten::mse_loss_backward", R(K::kLoss, f_elementwise, 3)},
      {"aten::smooth_l1_loss", R(K::kLoss, f_elementwise, 4)},
      {"aten::smooth_l1_loss_backward", R(K::kLoss, f_elementwise, 4)},
      {"aten::huber_loss", R(K::kLoss, f_elementwise, 4)},
      {"aten::binary_cross_entropy", R(K::kLoss, f_elementwise, 6)},  // two logs, products
      {"aten::binary_cross_entropy_backward", R(K::kLoss, f_elementwise, 6)},
      // --- Optimizer: _foreach_* via multi_tensor_apply (per-element FLOPs as the scalar op).
      {"aten::_foreach_add", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_sub", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_mul", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_div", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_addcmul", R(K::kOptimizer, f_foreach, 2, 0)},
      {"aten::_foreach_addcdiv", R(K::kOptimizer, f_foreach, 2, 0)},
      {"aten::_foreach_lerp", R(K::kOptimizer, f_foreach, 3, 0)},
      {"aten::_foreach_sqrt", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_rsqrt", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_reciprocal", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_neg", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_abs", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_exp", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_sign", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_pow", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_maximum", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_minimum", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_clamp_min", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_clamp_max", R(K::kOptimizer, f_foreach, 1, 0)},
      {"aten::_foreach_copy", R(K::kOptimizer, f_foreach, 0, 0)},
      {"aten::_foreach_zero", R(K::kOptimizer, f_foreach, 0, 0)},
      {"aten::_foreach_norm", R(K::kOptimizer, f_foreach, 2, 1)},  // + per-tensor cleanup kernel
      {"aten::_foreach_max", R(K::kOptimizer, f_foreach, 1, 1)},
      // GradScaler: unscale + inf check over the gradient list.
      {"aten::_amp_foreach_non_finite_check_and_unscale", R(K::kOptimizer, f_foreach, 2, 0)},
      // Fused optimizers (p0 = written-list bitmask, p1 = state_steps list). Adam(W) per
      // element: decay 2, m 3, v 4, denominator 3, update 3 = 15.
      {"aten::_fused_adamw_", R(K::kOptimizer, f_fused_optimizer, 15, 0b11101, 5)},
      {"aten::_fused_adam_", R(K::kOptimizer, f_fused_optimizer, 15, 0b11101, 5)},
      // SGD with momentum: decay 2, buffer 3, update 2.
      {"aten::_fused_sgd_", R(K::kOptimizer, f_fused_optimizer, 7, 0b101, -1)},
      // Adagrad: decay 2, sum += g^2 2, update sqrt/div/fma 4.
      {"aten::_fused_adagrad_", R(K::kOptimizer, f_fused_optimizer, 8, 0b101, 3)},
      // Unfold / fold: one kernel launch per image (p0: 0 im2col, 1 col2im).
      {"aten::im2col", R(K::kOther, f_im2col, 0.0, 0)},
      {"aten::col2im", R(K::kOther, f_im2col, 0.0, 1)},
      // Bilinear upsampling: the forward's NCHW kernel loops over N x C in every thread;
      // the backward zero-fills grad_input, then 4 weighted atomic adds per grad_output.
      {"aten::upsample_bilinear2d", R(K::kOther, f_upsample_bilinear)},
      {"aten::upsample_bilinear2d_backward", R(K::kOther, f_upsample_bilinear_backward, 4)},
      // --- No kernel: views, metadata, allocation.
      {"aten::view", R(K::kOther, f_metadata)},
      {"aten::_unsafe_view", R(K::kOther, f_metadata)},
      {"aten::_reshape_alias", R(K::kOther, f_metadata)},
      {"aten::as_strided", R(K::kOther, f_metadata)},
      {"aten::transpose", R(K::kOther, f_metadata)},
      {"aten::t", R(K::kOther, f_metadata)},
      {"aten::permute", R(K::kOther, f_metadata)},
      {"aten::expand", R(K::kOther, f_metadata)},
      {"aten::expand_as", R(K::kOther, f_metadata)},
      {"aten::slice", R(K::kOther, f_metadata)},
      {"aten::select", R(K::kOther, f_metadata)},
      {"aten::narrow", R(K::kOther, f_metadata)},
      {"aten::unsqueeze", R(K::kOther, f_metadata)},
      {"aten::squeeze", R(K::kOther, f_metadata)},
      {"aten::split", R(K::kOther, f_metadata)},
      {"aten::split_with_sizes", R(K::kOther, f_metadata)},
      {"aten::chunk", R(K::kOther, f_metadata)},
      {"aten::unbind", R(K::kOther, f_metadata)},
      {"aten::view_as", R(K::kOther, f_metadata)},
      {"aten::diagonal", R(K::kOther, f_metadata)},
      {"aten::detach", R(K::kOther, f_metadata)},
      {"aten::alias", R(K::kOther, f_metadata)},
      {"aten::lift_fresh", R(K::kOther, f_metadata)},
      {"aten::resize", R(K::kOther, f_metadata)},
      {"aten::set", R(K::kOther, f_metadata)},
      {"aten::empty", R(K::kOther, f_metadata)},
      {"aten::empty_strided", R(K::kOther, f_metadata)},
      {"aten::empty_like", R(K::kOther, f_metadata)},
      {"aten::new_empty", R(K::kOther, f_metadata)},
      {"aten::new_empty_strided", R(K::kOther, f_metadata)},
      // --- Composites: the kernels are the ops they call (recorded beneath them).
      {"aten::linear", R(K::kGemm, f_composite)},       // addmm / mm (+ views)
      {"aten::matmul", R(K::kGemm, f_composite)},       // mm / bmm (+ expand, reshape)
      {"aten::einsum", R(K::kGemm, f_composite)},       // bmm (+ permutes)
      {"aten::conv1d", R(K::kConv, f_composite)},       // convolution
      {"aten::conv2d", R(K::kConv, f_composite)},
      {"aten::conv3d", R(K::kConv, f_composite)},
      {"aten::conv_transpose1d", R(K::kConv, f_composite)},
      {"aten::conv_transpose2d", R(K::kConv, f_composite)},
      {"aten::conv_transpose3d", R(K::kConv, f_composite)},
      {"aten::scaled_dot_product_attention", R(K::kAttention, f_composite)},  // a fused SDPA op
      {"aten::layer_norm", R(K::kNorm, f_composite)},   // native_layer_norm
      {"aten::rms_norm", R(K::kNorm, f_composite)},     // _fused_rms_norm or element-wise ops
      {"aten::batch_norm", R(K::kNorm, f_composite)},   // _batch_norm_impl_index -> cudnn/native
      {"aten::_batch_norm_impl_index", R(K::kNorm, f_composite)},
      {"aten::group_norm", R(K::kNorm, f_composite)},   // native_group_norm
      {"aten::instance_norm", R(K::kNorm, f_composite)},
      {"aten::softmax", R(K::kSoftmax, f_composite)},   // _softmax
      {"aten::log_softmax", R(K::kSoftmax, f_composite)},
      {"aten::cross_entropy_loss", R(K::kLoss, f_composite)},  // _log_softmax + nll_loss
      {"aten::nll_loss", R(K::kLoss, f_composite)},      // nll_loss_forward
      {"aten::nll_loss_nd", R(K::kLoss, f_composite)},
      {"aten::dropout", R(K::kElementwise, f_composite)},  // native_dropout
      {"aten::to", R(K::kCopy, f_composite)},           // _to_copy (or nothing)
      {"aten::type_as", R(K::kCopy, f_composite)},
      {"aten::reshape", R(K::kOther, f_composite)},      // view, or clone + _unsafe_view
      {"aten::flatten", R(K::kOther, f_composite)},
      // --- Kernels behind CompositeExplicitAutograd wrappers the meta device answers alone
      // (issue 9, item 4; the wrappers are cost units by unit_rule_ops in cost_model.cpp).
      // Factories and fills: empty + fill_ / zero_ (FillKernel.cu), write-only.
      {"aten::zeros", R(K::kElementwise, f_write_only, 0)},
      {"aten::ones", R(K::kElementwise, f_write_only, 0)},
      {"aten::full", R(K::kElementwise, f_write_only, 0)},
      {"aten::new_zeros", R(K::kElementwise, f_write_only, 0)},
      {"aten::new_ones", R(K::kElementwise, f_write_only, 0)},
      {"aten::new_full", R(K::kElementwise, f_write_only, 0)},
      {"aten::zeros_like", R(K::kElementwise, f_write_only, 0)},
      {"aten::ones_like", R(K::kElementwise, f_write_only, 0)},
      {"aten::full_like", R(K::kElementwise, f_write_only, 0)},
      {"aten::scalar_tensor", R(K::kElementwise, f_write_only, 0)},
      {"aten::eye", R(K::kElementwise, f_write_only, 0, -1, -1, -1, 2)},  // zero_ + diagonal fill_
      // RangeFactories.cu: one index -> value kernel (start + i * step; logspace adds a pow).
      {"aten::linspace", R(K::kElementwise, f_write_only, 2)},
      {"aten::logspace", R(K::kElementwise, f_write_only, 3)},
      // Random factories: empty + the in-place Philox distribution kernel (DistributionKernels).
      {"aten::rand", R(K::kElementwise, f_write_only, 4)},
      {"aten::rand_like", R(K::kElementwise, f_write_only, 4)},
      {"aten::randn", R(K::kElementwise, f_write_only, 6)},
      {"aten::randn_like", R(K::kElementwise, f_write_only, 6)},
      {"aten::randint", R(K::kElementwise, f_write_only, 4)},
      {"aten::randint_like", R(K::kElementwise, f_write_only, 4)},
      {"aten::cauchy", R(K::kElementwise, f_write_only, 6)},
      {"aten::exponential", R(K::kElementwise, f_write_only, 5)},
      {"aten::geometric", R(K::kElementwise, f_write_only, 5)},
      {"aten::log_normal", R(K::kElementwise, f_write_only, 7)},
      // randperm (Randperm.cu): random keys, a radix sort of (key, index), a shuffle pass.
      {"aten::randperm", R(K::kElementwise, f_write_only, 8, -1, -1, -1, 6)},
      // Element-wise ops reached through their .out kernel.
      {"aten::frexp", R(K::kElementwise, f_elementwise, 2)},
      {"aten::nan_to_num", R(K::kElementwise, f_elementwise, 3)},  // isnan / isinf selects
      {"aten::logical_xor", R(K::kElementwise, f_elementwise, 1)},
      // Copies through an expanded or permuted view (repeat: copy_ into the unfolded output).
      {"aten::pixel_shuffle", R(K::kCopy, f_copy, 0, -1)},
      {"aten::pixel_unshuffle", R(K::kCopy, f_copy, 0, -1)},
      // In-place masked copies read and write self (f_copy would see self == output: no copy).
      {"aten::tril_", R(K::kCopy, f_elementwise, 0)},
      {"aten::triu_", R(K::kCopy, f_elementwise, 0)},
      // Sorts, radix selections, scans (formulas above).
      {"aten::sort", R(K::kReduction, f_sort, 0, -1, -1, -1, -1)},
      {"aten::argsort", R(K::kReduction, f_sort, 0, -1, -1, -1, -1)},
      {"aten::msort", R(K::kReduction, f_sort, 0, 0, -1, -1, -1)},
      {"aten::topk", R(K::kReduction, f_select, 0, 2, 0, -1, -1)},
      {"aten::kthvalue", R(K::kReduction, f_select, 0, 2, 1, -1, -1)},
      {"aten::median", R(K::kReduction, f_select, 0, 1, 1, -1, -1)},  // median() is 1 slice
      {"aten::nanmedian", R(K::kReduction, f_select, 0, 1, 1, -1, -1)},
      {"aten::mode", R(K::kReduction, f_sort, 0, -1, -1, -1, -1)},  // sorts each slice, counts runs
      {"aten::cumsum", R(K::kReduction, f_scan, 1, -1)},
      {"aten::cumprod", R(K::kReduction, f_scan, 1, -1)},
      {"aten::logcumsumexp", R(K::kReduction, f_scan, 4, -1)},  // max, sub, exp, log1p
      {"aten::_logcumsumexp", R(K::kReduction, f_scan, 4, -1)},
      {"aten::cummax", R(K::kReduction, f_scan, 1, -1)},
      {"aten::cummin", R(K::kReduction, f_scan, 1, -1)},
      {"aten::_cummax_helper", R(K::kReduction, f_scan, 1, -1)},
      {"aten::_cummin_helper", R(K::kReduction, f_scan, 1, -1)},
      {"aten::masked_scatter", R(K::kEmbedding, f_masked_scatter, 0, -1, -1, -1, -1)},
      // masked_select of the gradient (mask scan + gather) into a zero-padded buffer.
      {"aten::masked_scatter_backward", R(K::kEmbedding, f_elementwise, 0, -1, -1, -1, 3)},
      // --- cuDNN RNNs (the trace records them where RNN.cpp picks cuDNN; blink/cuda_paths.py).
      {"aten::_cudnn_rnn", R(K::kRnn, f_cudnn_rnn, 0, 0, -1, -1, -1)},
      {"aten::_cudnn_rnn_backward", R(K::kRnn, f_cudnn_rnn, 0, 1, -1, -1, -1)},
      // The native LSTM on CUDA (no cuDNN): per step one fused gate kernel (RNN.cpp LSTMCell,
      // FusedRNNKernel.cu): gate nonlinearities, c and h; its backward the gate gradients.
      {"aten::_thnn_fused_lstm_cell", R(K::kElementwise, f_elementwise, 6)},
      {"aten::_thnn_fused_lstm_cell_backward_impl", R(K::kElementwise, f_elementwise, 8)},
      {"aten::_thnn_fused_gru_cell", R(K::kElementwise, f_elementwise, 6)},
      {"aten::_thnn_fused_gru_cell_backward", R(K::kElementwise, f_elementwise, 8)},
      // _cudnn_rnn_flatten_weight: one copy of every weight into the flat buffer.
      {"aten::_cudnn_rnn_flatten_weight", R(K::kCopy, f_copy, 0, -1)},
  };
  return table;
}

const Rule* find_rule(const std::string& name) {
  const auto& table = rule_table();
  auto it = table.find(name);
  if (it != table.end()) return &it->second;
  std::string base = op_base_name(name);
  if (base.size() != name.size()) {
    it = table.find(base);
    if (it != table.end()) return &it->second;
  }
  if (base.size() > 2 && base.back() == '_' && base[base.size() - 2] != '_') {
    base.pop_back();
    it = table.find(base);
    if (it != table.end()) return &it->second;
  }
  return nullptr;
}

// ---- math mode, occupancy, times ----------------------------------------------------------

bool is_float8(int d) { return d == 23 || d == 24 || d == 25 || d == 26 || d == 44; }

// Float types whose element-wise math PyTorch does in FP32 on CUDA cores.
bool is_fp32_math(int d) { return d == 5 || d == 6 || d == 15 || is_float8(d) || d == 45; }

bool is_tensor_core(MathMode m) {
  return m == MathMode::kTf32 || m == MathMode::kBf16Tc || m == MathMode::kFp16Tc ||
         m == MathMode::kFp8Tc || m == MathMode::kTf32x3;
}

MathMode decide_math(const Ctx& c, UnitKind kind, int dtype) {
  const GpuSpec& g = c.gpu;
  if (kind != K::kGemm && kind != K::kConv && kind != K::kAttention && kind != K::kRnn) {
    return is_fp32_math(dtype) ? MathMode::kFp32Simt : MathMode::kOther;
  }
  switch (dtype) {
    case 5:  // Half: tensor cores from sm_70. Before, cuBLAS / cuDNN run half with an FP32
             // compute type (CUBLAS_COMPUTE_32F in at::cuda::blas::gemm<at::Half>) on CUDA
             // cores: the FP32 rate, whatever the board's native half rate (1/64 on sm_61).
      return g.cc_major >= 7 && g.peak_fp16 > 0 ? MathMode::kFp16Tc : MathMode::kFp32Simt;
    case 15:  // BFloat16: tensor cores from sm_80; before, FP32 math on CUDA cores
      return g.cc_major >= 8 && g.peak_bf16 > 0 ? MathMode::kBf16Tc : MathMode::kFp32Simt;
    case 6: {  // Float: TF32 only where the matching torch.backends flag allows it.
      // FP32 mem-efficient attention ignores the flags: on sm_80+ its CUTLASS GEMMs are
      // DefaultGemmType<Sm80, float> = TensorOp with OpMultiplyAddFastF32 (3xTF32,
      // transformers/cuda/mem_eff_attention/gemm_kernel_utils.h); older GPUs run SIMT FP32.
      if (kind == K::kAttention) {
        return g.cc_major >= 8 && g.peak_tf32 > 0 ? MathMode::kTf32x3 : MathMode::kFp32Simt;
      }
      // cuDNN RNNs take cuDNN's flag: cudnn/RNN.cpp asks for CUDNN_FMA_MATH only when
      // torch.backends.cudnn.allow_tf32 is off.
      const bool allow = kind == K::kGemm ? c.opts.allow_tf32_matmul : c.opts.allow_tf32_cudnn;
      return allow && g.cc_major >= 8 && g.peak_tf32 > 0 ? MathMode::kTf32 : MathMode::kFp32Simt;
    }
    default:
      if (is_float8(dtype)) {
        if (g.peak_fp8 <= 0) {
          fail(c, "FP8 matrix math needs FP8 tensor cores (sm_89 or newer), which " + g.name +
                      " does not have");
        }
        return MathMode::kFp8Tc;
      }
      return MathMode::kOther;
  }
}

// Resident threads and CTAs per SM (CUDA C Programming Guide, "Technical Specifications per
// Compute Capability").
int64_t max_threads_per_sm(const GpuSpec& g) {
  if (g.cc_major == 7 && g.cc_minor == 5) return 1024;
  if ((g.cc_major == 8 && (g.cc_minor == 6 || g.cc_minor == 9)) || g.cc_major == 12) return 1536;
  return 2048;
}

int64_t max_ctas_per_sm(const GpuSpec& g) {
  if (g.cc_major == 7 && g.cc_minor == 5) return 16;
  if (g.cc_major == 8 && (g.cc_minor == 6 || g.cc_minor == 9)) return 16;
  if (g.cc_major == 12) return 24;
  return 32;
}

int64_t occupancy(const GpuSpec& g, int64_t cta_threads) {
  return std::max<int64_t>(1, std::min(max_threads_per_sm(g) / std::max<int64_t>(cta_threads, 1),
                                       max_ctas_per_sm(g)));
}

// ATen's element-wise kernels: 128-thread CTAs, 4 elements per thread (Loops.cuh).
constexpr int64_t kElementwiseCta = 128;
constexpr int64_t kElementsPerThread = 4;
// ATen's reduce kernel: up to 512 threads per CTA; 256 taken as typical, 4 values per thread.
constexpr int64_t kReduceCta = 256;
// multi_tensor_apply: 512-thread CTAs, one 64K-element chunk each.
constexpr int64_t kMultiTensorCta = 512;
// GEMM output tiles: 128x128 with a multistage pipeline on tensor cores (1 CTA/SM: ~64-128 KiB
// of shared memory and 256 threads at high register counts), 128x64 for SIMT FP32 (2 CTA/SM).
constexpr int64_t kTcTileM = 128, kTcTileN = 128, kSimtTileM = 128, kSimtTileN = 64;
constexpr int64_t kGemmCta = 256;

// Returns the factor the roofline may divide the FLOPs by (Winograd-eligible convolutions).
double apply_tiling(const Tiling& t, const GpuSpec& g, const FeatureOptions& o, UnitFeatures& f) {
  switch (t.style) {
    case Tiling::kGemm: {
      if (f.kind == K::kConv) return plan_conv(f, t.passes, g, o);
      if (f.kind == K::kGemm && f.m > 0 && f.n > 0 && f.k > 0) {
        plan_gemm_unit(f, g);
        return 1.0;
      }
      const bool tc = is_tensor_core(f.math_mode);
      const int64_t tm = tc ? kTcTileM : kSimtTileM, tn = tc ? kTcTileN : kSimtTileN;
      f.tiles = ceil_div(f.m, tm) * ceil_div(f.n, tn) * std::max<int64_t>(f.batch, 1);
      f.blocks_per_sm = tc ? 1 : 2;
      f.parallelism = static_cast<double>(f.tiles * kGemmCta);
      break;
    }
    case Tiling::kPreset:
      f.tiles = t.tiles;
      f.blocks_per_sm = 1;  // FlashAttention CTAs use most of an SM's shared memory
      f.parallelism = static_cast<double>(t.tiles * t.threads);
      break;
    case Tiling::kElementwise:
    case Tiling::kReduction: {
      const int64_t cta = t.style == Tiling::kElementwise ? kElementwiseCta : kReduceCta;
      const double threads = std::ceil(t.work / kElementsPerThread);
      f.parallelism = threads;
      f.tiles = static_cast<int64_t>(std::ceil(threads / static_cast<double>(cta)));
      f.blocks_per_sm = occupancy(g, cta);
      break;
    }
    case Tiling::kRowwise: {
      // One row per CTA (layer norm, softmax over long rows), threads covering the row 4
      // elements each; short rows are packed several per 128-thread CTA (persistent softmax).
      int64_t per_row = ceil_div(std::max<int64_t>(f.inner, 1), kElementsPerThread);
      per_row = std::min<int64_t>(1024, std::max<int64_t>(32, ceil_div(per_row, 32) * 32));
      const int64_t cta = std::max<int64_t>(per_row, 128);
      f.tiles = ceil_div(f.outer, cta / per_row);
      f.parallelism = static_cast<double>(f.outer) * static_cast<double>(per_row);
      f.blocks_per_sm = occupancy(g, cta);
      if (f.row_cta_threads > 0) {
        // A CTA per row (f_norm): waves of resident CTAs, each living kRowCtaLifetimeS.
        auto waves_of = [&](int64_t threads) {
          return static_cast<double>(
              ceil_div(f.outer, static_cast<int64_t>(g.sm_count) * occupancy(g, threads)));
        };
        f.row_cta_bound_s = waves_of(f.row_cta_threads) * kRowCtaLifetimeS;
        if (f.row_cta_threads == 512) f.row_cta_bound_s += waves_of(256) * kRowCtaLifetimeS;
        f.tiles = f.outer;
        f.blocks_per_sm = occupancy(g, f.row_cta_threads);
      }
      if (f.channel_cta_threads > 0) {
        // A CTA per channel streaming millions of elements: the loads in flight, and so the
        // bandwidth, scale with the resident threads; kBwSaturatingSmFraction of the SMs,
        // fully occupied, saturate DRAM.
        f.tiles = f.outer;
        f.blocks_per_sm = occupancy(g, f.channel_cta_threads);
        const double resident =
            static_cast<double>(std::min<int64_t>(f.tiles, g.sm_count * f.blocks_per_sm)) *
            static_cast<double>(f.channel_cta_threads);
        f.channel_cta_bw_share = std::min(
            1.0, resident / (kBwSaturatingSmFraction * g.sm_count *
                             static_cast<double>(max_threads_per_sm(g))));
      }
      break;
    }
    case Tiling::kMultiTensor:
      f.tiles = t.tiles;
      f.parallelism = static_cast<double>(t.tiles * kMultiTensorCta);
      f.blocks_per_sm = occupancy(g, kMultiTensorCta);
      break;
    case Tiling::kSerialLoop: {
      // Waves of resident CTAs, each thread running its whole loop (f_upsample_bilinear).
      f.tiles = t.tiles;
      f.parallelism = t.work;
      f.blocks_per_sm = occupancy(g, t.threads);
      const int64_t slots = static_cast<int64_t>(g.sm_count) * f.blocks_per_sm;
      f.serial_loop_bound_s = static_cast<double>(ceil_div(f.tiles, slots)) *
                              static_cast<double>(f.serial_loop_iters) * kSerialLoopIterationS;
      break;
    }
    case Tiling::kNone:
      f.tiles = 0;
      f.parallelism = 0.0;
      break;
  }
  const int64_t slots = static_cast<int64_t>(g.sm_count) * f.blocks_per_sm;
  f.waves = f.tiles > 0 ? ceil_div(f.tiles, slots) : 0;
  return 1.0;
}

void check_gpu(const GpuSpec& g) {
  if (g.sm_count <= 0 || !(g.mem_bw > 0) || !(g.peak_fp32 > 0)) {
    throw Error("GpuSpec '" + g.name +
                "': sm_count, mem_bw and peak_fp32 must be positive; fill it from "
                "blink.hardware.get_gpu(...)");
  }
}

}  // namespace

int64_t dtype_itemsize(int dtype) {
  switch (dtype) {
    case 0: case 1: case 11: case 12: case 13: case 16: case 17: case 18: case 19: case 20:
    case 21: case 23: case 24: case 25: case 26: case 44: case 45:
      return 1;  // byte-sized, FP8, packed sub-byte (quint4x2, float4_e2m1fn_x2)
    case 2: case 5: case 15: case 22: case 27:
      return 2;
    case 3: case 6: case 8: case 14: case 28: case 46:
      return 4;
    case 4: case 7: case 9: case 29:
      return 8;
    case 10:
      return 16;
    default:
      if (dtype >= 30 && dtype <= 43) return 1;  // UInt1..7 / Int1..7, stored a byte each
      throw Error("unknown dtype code " + std::to_string(dtype) +
                  " (c10::ScalarType); Blink knows codes 0-46");
  }
}

double peak_flops_for(MathMode mode, int dtype, const GpuSpec& g) {
  switch (mode) {
    case MathMode::kFp32Simt: return g.peak_fp32;
    case MathMode::kTf32: return g.peak_tf32;
    case MathMode::kBf16Tc: return g.peak_bf16;
    case MathMode::kFp16Tc: return g.peak_fp16;
    case MathMode::kFp8Tc: return g.peak_fp8;
    case MathMode::kTf32x3: return g.peak_tf32 / 3.0;  // three TF32 MMAs per product
    case MathMode::kOther:
    default:
      if (dtype == 7 || dtype == 10) return g.peak_fp64 > 0 ? g.peak_fp64 : g.peak_fp32 / 32.0;
      return g.peak_fp32;  // integer ALU rate ~ FP32 rate
  }
}

namespace {
double sustained_ratio(MathMode mode, const GpuSpec& g, UnitKind kind) {
  const bool tc = mode == MathMode::kTf32 || mode == MathMode::kBf16Tc ||
                  mode == MathMode::kFp16Tc || mode == MathMode::kFp8Tc;
  if (tc) return g.sustained_tc_ratio;
  if (kind == UnitKind::kConv) {
    return std::min(std::max(1.0, g.max_clock_ratio),
                    g.sustained_fp32_ratio / kConvSimtPowerFraction);
  }
  return g.sustained_fp32_ratio;
}
}  // namespace

double sustained_time_s(double boost_time_s, MathMode mode, const GpuSpec& g, UnitKind kind) {
  const double ratio = sustained_ratio(mode, g, kind);
  if (!(boost_time_s > 0.0) || !(ratio > 0.0) || ratio == 1.0) return boost_time_s;
  // Above its listed boost (a GeForce board below its power cap) the whole kernel runs faster.
  if (ratio > 1.0) return boost_time_s / ratio;
  const double window = std::max(0.0, g.boost_window_s);
  if (boost_time_s <= window) return boost_time_s;
  return window + (boost_time_s - window) / ratio;
}

const char* unit_kind_name(UnitKind kind) {
  switch (kind) {
    case K::kGemm: return "gemm";
    case K::kConv: return "conv";
    case K::kAttention: return "attention";
    case K::kNorm: return "norm";
    case K::kSoftmax: return "softmax";
    case K::kReduction: return "reduction";
    case K::kElementwise: return "elementwise";
    case K::kEmbedding: return "embedding";
    case K::kCopy: return "copy";
    case K::kOptimizer: return "optimizer";
    case K::kLoss: return "loss";
    case K::kRnn: return "rnn";
    case K::kOther: default: return "other";
  }
}

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::kFp32Simt: return "fp32_simt";
    case MathMode::kTf32: return "tf32";
    case MathMode::kBf16Tc: return "bf16_tc";
    case MathMode::kFp16Tc: return "fp16_tc";
    case MathMode::kFp8Tc: return "fp8_tc";
    case MathMode::kTf32x3: return "3xtf32";
    case MathMode::kOther: default: return "other";
  }
}

bool has_feature_rule(const std::string& op_name) { return find_rule(op_name) != nullptr; }

bool rule_kind(const std::string& op_name, UnitKind* kind) {
  const Rule* r = find_rule(op_name);
  if (r == nullptr) return false;
  *kind = r->kind;
  return true;
}

bool is_composite_op(const std::string& op_name) {
  const Rule* r = find_rule(op_name);
  return r != nullptr && r->formula == f_composite;
}

std::vector<HostCopy> host_copies(const std::string& op_name, const std::vector<Arg>& inputs) {
  // Input positions each op's CUDA implementation makes contiguous before its kernel:
  //  * SoftMax.cu: host_softmax starts with input_.contiguous(), host_softmax_backward with
  //    grad_.contiguous() and output_.contiguous() (_softmax_backward_data(grad, output, ...)).
  //    CaiT's talking-heads softmax runs over attn.permute(0, 3, 1, 2).
  //  * layer_norm_kernel.cu: layer_norm_cuda takes input.expect_contiguous(),
  //    layer_norm_backward_cuda input.expect_contiguous() and LayerNormBackwardKernelImpl
  //    dY.contiguous() (native_layer_norm_backward(grad_out, input, ...)); the fused RMS norm
  //    entry points share that code. timm's LayerNorm2d normalises x.permute(0, 2, 3, 1) of an
  //    NCHW tensor; XCiT's tokens are a transposed view through the whole network.
  //  * Convolutions: cuDNN's (ConvShared.cpp, Conv_v8.cpp: input.contiguous(memory_format),
  //    weight and grad_output likewise) and the native depthwise kernels make their operands
  //    dense in the format the convolution runs in (conv_runs_channels_last): a channel slice
  //    (CSP and Res2Net splits), or an NCHW activation meeting channels-last weights (the
  //    reshapes inside ResNeSt's split attention of a channels-last model) is copied first.
  //    Positions of the input and weight, and of grad_output for the backward.
  struct Entry {
    std::vector<int> positions;
    bool conv;  // the convolution's format (input, weight first); else row-major
  };
  static const std::unordered_map<std::string, Entry> table = {
      {"aten::_softmax", {{0}, false}},
      {"aten::_log_softmax", {{0}, false}},
      {"aten::_softmax_backward_data", {{0, 1}, false}},
      {"aten::_log_softmax_backward_data", {{0, 1}, false}},
      {"aten::native_layer_norm", {{0}, false}},
      {"aten::_fused_rms_norm", {{0}, false}},
      {"aten::native_layer_norm_backward", {{0, 1}, false}},
      {"aten::_fused_rms_norm_backward", {{0, 1}, false}},
      {"aten::convolution", {{0, 1}, true}},
      {"aten::_convolution", {{0, 1}, true}},
      {"aten::cudnn_convolution", {{0, 1}, true}},
      {"aten::cudnn_convolution_transpose", {{0, 1}, true}},
      {"aten::convolution_backward", {{1, 2, 0}, true}},
  };
  std::vector<HostCopy> out;
  auto it = table.find(op_base_name(op_name));
  if (it == table.end()) return out;
  const Entry& e = it->second;
  bool channels_last = false;
  if (e.conv) {
    const TensorInfo* x = tensor_at(inputs, e.positions[0]);
    const TensorInfo* w = tensor_at(inputs, e.positions[1]);
    channels_last = x != nullptr && w != nullptr && conv_runs_channels_last(*x, *w);
  }
  for (int pos : e.positions) {
    const TensorInfo* t = tensor_at(inputs, pos);
    if (t != nullptr && t->dtype >= 0 && t->strides.size() == t->sizes.size() &&
        numel_of(*t) > 0 && !dense_in(*t, channels_last)) {
      out.push_back(HostCopy{t, channels_last});
    }
  }
  return out;
}

UnitFeatures compute_features(const std::string& op_name, const std::vector<Arg>& inputs,
                              const std::vector<Arg>& outputs, const GpuSpec& gpu,
                              const FeatureOptions& opts) {
  check_gpu(gpu);
  const Ctx c{op_name, inputs, outputs, gpu, opts};
  UnitFeatures f;
  Tiling tiling;
  if (const Rule* r = find_rule(op_name)) {
    f.kind = r->kind;
    f.matched = true;
    f.kernels = r->kernels >= 0 ? r->kernels : 1;
    tiling = r->formula(c, *r, f);
  } else {
    // No rule: an op with a kernel we have no formula for. Bytes from its tensors, no FLOPs.
    f.kind = K::kOther;
    tiling = f_generic(c, R(K::kOther, f_generic), f);
  }
  for (const HostCopy& h : host_copies(op_name, inputs)) {
    add_hidden_copy(*h.src, h.channels_last, f);
  }
  f.backward = op_name.find("backward") != std::string::npos;
  if (f.numel == 0) f.numel = largest_numel(outputs);
  if (f.dtype < 0) f.dtype = has_tensor(outputs) ? largest_dtype(outputs) : largest_dtype(inputs);
  f.math_mode = decide_math(c, f.kind, f.dtype);
  const double flop_factor = apply_tiling(tiling, gpu, opts, f);
  const double bytes = f.bytes_read + f.bytes_written;
  const double peak = peak_flops_for(f.math_mode, f.dtype, gpu);
  f.arithmetic_intensity = bytes > 0 ? f.flops / bytes : 0.0;
  f.compute_time_s = f.flops > 0 && peak > 0 ? f.flops / flop_factor / peak : 0.0;
  f.memory_time_s = bytes / gpu.mem_bw;
  f.roofline_time_s = std::max(f.compute_time_s, f.memory_time_s);
  return f;
}

std::vector<std::pair<const char*, double>> feature_values(const UnitFeatures& f) {
  auto d = [](int64_t v) { return static_cast<double>(v); };
  return {
      {"kind", d(static_cast<int64_t>(f.kind))},
      {"matched", f.matched ? 1.0 : 0.0},
      {"backward", f.backward ? 1.0 : 0.0},
      {"flops", f.flops},
      {"bytes_read", f.bytes_read},
      {"bytes_written", f.bytes_written},
      {"arithmetic_intensity", f.arithmetic_intensity},
      {"kernels", d(f.kernels)},
      {"m", d(f.m)},
      {"n", d(f.n)},
      {"k", d(f.k)},
      {"batch", d(f.batch)},
      {"trans_a", f.trans_a ? 1.0 : 0.0},
      {"trans_b", f.trans_b ? 1.0 : 0.0},
      {"conv_n", d(f.conv_n)},
      {"conv_c", d(f.conv_c)},
      {"conv_h", d(f.conv_h)},
      {"conv_w", d(f.conv_w)},
      {"conv_k", d(f.conv_k)},
      {"conv_r", d(f.conv_r)},
      {"conv_s", d(f.conv_s)},
      {"conv_d", d(f.conv_d)},
      {"conv_t", d(f.conv_t)},
      {"out_d", d(f.out_d)},
      {"stride_h", d(f.stride_h)},
      {"stride_w", d(f.stride_w)},
      {"pad_h", d(f.pad_h)},
      {"pad_w", d(f.pad_w)},
      {"dil_h", d(f.dil_h)},
      {"dil_w", d(f.dil_w)},
      {"groups", d(f.groups)},
      {"out_h", d(f.out_h)},
      {"out_w", d(f.out_w)},
      {"transposed", f.transposed ? 1.0 : 0.0},
      {"head_dim_v", d(f.head_dim_v)},
      {"causal", f.causal ? 1.0 : 0.0},
      {"outer", d(f.outer)},
      {"inner", d(f.inner)},
      {"numel", d(f.numel)},
      {"dtype", d(f.dtype)},
      {"math_mode", d(static_cast<int64_t>(f.math_mode))},
      // The forests' precision input (they do not take dtype / math_mode: see
      // blink/train/data.py _NOT_FOREST_INPUTS).
      {"tensor_core", is_tensor_core(f.math_mode) ? 1.0 : 0.0},
      {"tiles", d(f.tiles)},
      {"blocks_per_sm", d(f.blocks_per_sm)},
      {"waves", d(f.waves)},
      {"parallelism", f.parallelism},
      {"compute_time_s", f.compute_time_s},
      {"memory_time_s", f.memory_time_s},
      {"roofline_time_s", f.roofline_time_s},
      {"tile_m", d(f.tile_m)},
      {"tile_n", d(f.tile_n)},
      {"split_k", d(f.split_k)},
      {"conv_algo", d(f.conv_algo)},
      {"channels_last", f.channels_last ? 1.0 : 0.0},
      {"kernel_compute_s", f.kernel_compute_s},
      {"aux_bytes", f.aux_bytes},
      {"input_passes", f.input_passes},
      {"l2_hit_bytes", f.l2_hit_bytes},
  };
}

}  // namespace blink
