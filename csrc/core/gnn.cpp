// The unit graph and the GNN forward pass (see blink/gnn.h).
#include "blink/gnn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "blink/error.h"
#include "blink/json.h"

namespace blink {
namespace {

constexpr int kNumKinds = static_cast<int>(UnitKind::kOther) + 1;
constexpr int kNodeScalars = 10;  // node features before the kind one-hot
constexpr size_t kGnnTimeFeature = 0;  // "log_time_us": log1p of the unit's time in microseconds

double log1p_pos(double v) { return std::log1p(std::max(v, 0.0)); }

}  // namespace

const std::vector<std::string>& gnn_node_feature_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"log_time_us",  "log_analytic_us", "log_ratio",
                                  "from_trees",   "log_flops",       "log_bytes",
                                  "log_kernels",  "backward",        "log_intensity",
                                  "log_roofline_us"};
    for (int k = 0; k < kNumKinds; ++k) {
      n.push_back(std::string("kind_") + unit_kind_name(static_cast<UnitKind>(k)));
    }
    return n;
  }();
  return names;
}

const std::vector<std::string>& gnn_graph_feature_names() {
  static const std::vector<std::string> names = {
      "log_end_to_end_us", "log_host_us", "log_gpu_busy_us", "log_units",
      "gpu_sm_count_100",  "gpu_log_mem_bw_tbs", "gpu_log_peak_bf16_tflops"};
  return names;
}

UnitGraph build_unit_graph(const TraceData& trace, const TraceCost& cost, const LearnedResult* lr,
                           const GpuSpec& gpu) {
  UnitGraph out;
  const size_t n = cost.units.size();
  const size_t nf = gnn_node_feature_names().size();
  out.num_nodes = static_cast<int64_t>(n);
  out.x.assign(n * nf, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const UnitCost& u = cost.units[i];
    const UnitFeatures& f = u.features;
    double* row = &out.x[i * nf];
    const double analytic = lr != nullptr ? lr->analytic_s[i] : u.time_s;
    const double q = lr != nullptr && std::isfinite(lr->log_ratio[i]) ? lr->log_ratio[i] : 0.0;
    row[kGnnTimeFeature] = log1p_pos(u.time_s * 1e6);
    row[1] = log1p_pos(analytic * 1e6);
    row[2] = q;
    row[3] = lr != nullptr && std::isfinite(lr->log_ratio[i]) ? 1.0 : 0.0;
    row[4] = log1p_pos(f.flops);
    row[5] = log1p_pos(f.bytes_read + f.bytes_written);
    row[6] = log1p_pos(static_cast<double>(f.kernels));
    row[7] = f.backward ? 1.0 : 0.0;
    row[8] = log1p_pos(f.arithmetic_intensity);
    row[9] = log1p_pos(u.roofline_s * 1e6);
    row[kNodeScalars + static_cast<int>(f.kind)] = 1.0;
  }
  // Dataflow: the last unit that wrote a storage feeds every later unit that reads it.
  std::unordered_map<int64_t, int64_t> last_writer;
  std::vector<std::pair<int64_t, int64_t>> edges;
  for (size_t i = 0; i < n; ++i) {
    const OpRecord& op = trace.ops[static_cast<size_t>(cost.units[i].op)];
    for (const Arg& a : op.inputs) {
      for (const TensorInfo& t : a.tensors) {
        if (t.storage == 0) continue;
        const auto it = last_writer.find(t.storage);
        if (it != last_writer.end() && it->second != static_cast<int64_t>(i)) {
          edges.emplace_back(it->second, static_cast<int64_t>(i));
        }
      }
    }
    for (const Arg& a : op.outputs) {
      for (const TensorInfo& t : a.tensors) {
        if (t.storage != 0) last_writer[t.storage] = static_cast<int64_t>(i);
      }
    }
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  for (const auto& e : edges) {
    out.src.push_back(e.first);
    out.dst.push_back(e.second);
  }
  out.g = {log1p_pos(cost.end_to_end_s * 1e6),
           log1p_pos(cost.host_s * 1e6),
           log1p_pos(cost.gpu_busy_s * 1e6),
           log1p_pos(static_cast<double>(n)),
           gpu.sm_count / 100.0,
           std::log(std::max(gpu.mem_bw, 1.0) / 1e12),
           log1p_pos(gpu.peak_bf16 / 1e12)};
  return out;
}

namespace {

// y = W x + b with W given transposed (wt: cols x rows, row-major), so that the inner loop
// runs over contiguous outputs (vectorisable without reassociating a sum). Each y[r] still
// adds its terms in column order.
void affine(const std::vector<double>& wt, const double* b, const double* x, size_t rows,
            size_t cols, double* y) {
  size_t r0 = 0;
  // Eight outputs at a time in registers: eight independent sums per pass over x.
  for (; r0 + 8 <= rows; r0 += 8) {
    double a[8];
    for (size_t k = 0; k < 8; ++k) a[k] = b != nullptr ? b[r0 + k] : 0.0;
    for (size_t c = 0; c < cols; ++c) {
      const double xc = x[c];
      const double* w = &wt[c * rows + r0];
      for (size_t k = 0; k < 8; ++k) a[k] += w[k] * xc;
    }
    for (size_t k = 0; k < 8; ++k) y[r0 + k] = a[k];
  }
  for (size_t r = r0; r < rows; ++r) {
    double a = b != nullptr ? b[r] : 0.0;
    for (size_t c = 0; c < cols; ++c) a += wt[c * rows + r] * x[c];
    y[r] = a;
  }
}

// (rows x cols) row-major -> (cols x rows) row-major.
std::vector<double> transposed(const std::vector<double>& w, size_t rows, size_t cols) {
  std::vector<double> t(w.size());
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  }
  return t;
}

}  // namespace

double Gnn::forward(const UnitGraph& graph) const {
  BLINK_CHECK(!members.empty(), source + ": the GNN has no member networks");
  double sum = 0.0;
  for (size_t k = 0; k < members.size(); ++k) sum += forward_member(k, graph);
  return sum / static_cast<double>(members.size());
}

double Gnn::forward_member(size_t member, const UnitGraph& graph) const {
  BLINK_CHECK(member < members.size(), source + ": member " + std::to_string(member) +
                                           " of " + std::to_string(members.size()));
  const GnnNet& net = members[member];
  const auto& [node_mean, node_std, graph_mean, graph_std, in_w, in_b, layers, readout_w,
               readout_b, head_w, head_b, node_head_w, node_head_b] = net;
  const size_t n = static_cast<size_t>(graph.num_nodes);
  const size_t nf = node_mean.size(), ng = graph_mean.size(), h = static_cast<size_t>(hidden);
  BLINK_CHECK(graph.x.size() == n * nf && graph.g.size() == ng && graph.src.size() == graph.dst.size(),
              source + ": the unit graph does not match the network's feature sizes");
  if (n == 0) return 0.0;
  std::vector<double> hs(n * h), next(n * h), xin(nf), tmp(h);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < nf; ++j) xin[j] = (graph.x[i * nf + j] - node_mean[j]) / node_std[j];
    affine(in_w, in_b.data(), xin.data(), h, nf, &hs[i * h]);
    for (size_t j = 0; j < h; ++j) hs[i * h + j] = std::max(hs[i * h + j], 0.0);
  }
  std::vector<double> indeg(n, 0.0), outdeg(n, 0.0);
  for (size_t e = 0; e < graph.src.size(); ++e) {
    const int64_t s = graph.src[e], d = graph.dst[e];
    BLINK_CHECK(s >= 0 && d >= 0 && static_cast<size_t>(s) < n && static_cast<size_t>(d) < n,
                source + ": an edge names a node outside the graph");
    outdeg[static_cast<size_t>(s)] += 1.0;
    indeg[static_cast<size_t>(d)] += 1.0;
  }
  std::vector<double> m_in(n * h), m_out(n * h);
  for (const GnnLayer& layer : layers) {
    std::fill(m_in.begin(), m_in.end(), 0.0);
    std::fill(m_out.begin(), m_out.end(), 0.0);
    for (size_t e = 0; e < graph.src.size(); ++e) {
      const size_t s = static_cast<size_t>(graph.src[e]), d = static_cast<size_t>(graph.dst[e]);
      for (size_t j = 0; j < h; ++j) {
        m_in[d * h + j] += hs[s * h + j];
        m_out[s * h + j] += hs[d * h + j];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const double ki = std::max(indeg[i], 1.0), ko = std::max(outdeg[i], 1.0);
      for (size_t j = 0; j < h; ++j) {
        m_in[i * h + j] /= ki;
        m_out[i * h + j] /= ko;
      }
      double* y = &next[i * h];
      affine(layer.self_w, layer.self_b.data(), &hs[i * h], h, h, y);
      affine(layer.in_w, nullptr, &m_in[i * h], h, h, tmp.data());
      for (size_t j = 0; j < h; ++j) y[j] += tmp[j];
      affine(layer.out_w, nullptr, &m_out[i * h], h, h, tmp.data());
      for (size_t j = 0; j < h; ++j) y[j] = std::max(y[j] + tmp[j], 0.0);
    }
    hs.swap(next);
  }
  std::vector<double> r(2 * h + ng, 0.0);
  for (size_t j = 0; j < h; ++j) r[h + j] = hs[j];
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < h; ++j) {
      r[j] += hs[i * h + j];
      r[h + j] = std::max(r[h + j], hs[i * h + j]);
    }
  }
  for (size_t j = 0; j < h; ++j) r[j] /= static_cast<double>(n);
  for (size_t j = 0; j < ng; ++j) r[2 * h + j] = (graph.g[j] - graph_mean[j]) / graph_std[j];
  affine(readout_w, readout_b.data(), r.data(), h, r.size(), tmp.data());
  double c = head_b;
  for (size_t j = 0; j < h; ++j) c += head_w[j] * std::max(tmp[j], 0.0);
  // Per-unit corrections u, weighted by the units' times: log(sum t e^u / sum t), shifted by
  // max u so that no exponential overflows (as blink/gnn.py computes it).
  std::vector<double> u(n);
  double umax = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    double a = node_head_b;
    for (size_t j = 0; j < h; ++j) a += node_head_w[j] * hs[i * h + j];
    u[i] = a;
    umax = std::max(umax, a);
  }
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double t = std::max(std::expm1(graph.x[i * nf + kGnnTimeFeature]), kGnnMinUnitUs);
    num += t * std::exp(u[i] - umax);
    den += t;
  }
  c += umax + std::log(num / den);
  if (!std::isfinite(c)) return 0.0;
  return std::min(std::max(c, clip_lo), clip_hi);
}

namespace {

struct Reader {
  const std::string& bytes;
  const std::string& source;
  size_t data_start = 0;
  const json::Value* header = nullptr;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(source + ": not a usable Blink GNN: " + why);
  }

  // A tensor of exactly `shape`, as doubles.
  std::vector<double> tensor(const std::string& name, const std::vector<int64_t>& shape) const {
    const json::Value* t = header->find(name);
    if (t == nullptr) fail("tensor \"" + name + "\" is missing");
    const std::string what = "tensor \"" + name + "\"";
    const std::string& dtype = t->at("dtype", what).as_string(what + ".dtype");
    size_t item = 0;
    if (dtype == "F32") {
      item = 4;
    } else if (dtype == "F64") {
      item = 8;
    } else {
      fail(what + " has dtype " + dtype + " (F32 or F64 expected)");
    }
    const std::vector<double>& sh = t->at("shape", what).as_numbers(what + ".shape");
    std::vector<int64_t> got;
    for (double d : sh) got.push_back(static_cast<int64_t>(d));
    if (got != shape) {
      std::string want, have;
      for (int64_t s : shape) want += (want.empty() ? "" : ", ") + std::to_string(s);
      for (int64_t s : got) have += (have.empty() ? "" : ", ") + std::to_string(s);
      fail(what + " has shape [" + have + "], the config implies [" + want + "]");
    }
    size_t numel = 1;
    for (int64_t s : shape) numel *= static_cast<size_t>(s);
    const std::vector<double>& off = t->at("data_offsets", what).as_numbers(what + ".data_offsets");
    if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || off[0] != std::floor(off[0]) ||
        off[1] != std::floor(off[1])) {
      fail(what + " has malformed data_offsets");
    }
    const size_t b = static_cast<size_t>(off[0]), e = static_cast<size_t>(off[1]);
    if (e - b != numel * item) fail(what + "'s data_offsets do not span its shape x dtype");
    if (data_start + e > bytes.size()) {
      fail(what + "'s data lies past the end of the file (truncated?)");
    }
    std::vector<double> out(numel);
    const char* p = bytes.data() + data_start + b;
    for (size_t i = 0; i < numel; ++i) {
      if (item == 4) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
      } else {
        std::memcpy(&out[i], p + 8 * i, 8);
      }
      if (!std::isfinite(out[i])) fail(what + " has a non-finite value");
    }
    return out;
  }
};

int64_t meta_int(const Reader& r, const json::Value& meta, const std::string& key) {
  const std::string& s = meta.at(key, "__metadata__").as_string("__metadata__." + key);
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size()) r.fail("__metadata__." + key + " is \"" + s + "\", not an integer");
    return v;
  } catch (const std::logic_error&) {
    r.fail("__metadata__." + key + " is \"" + s + "\", not an integer");
  }
}

std::vector<std::string> meta_names(const Reader& r, const json::Value& meta,
                                    const std::string& key) {
  const std::string& s = meta.at(key, "__metadata__").as_string("__metadata__." + key);
  const json::Value v = json::parse(s, r.source + " __metadata__." + key);
  std::vector<std::string> out;
  for (const json::Value& e : v.as_array("__metadata__." + key)) {
    out.push_back(e.as_string("__metadata__." + key + "[]"));
  }
  return out;
}

}  // namespace

Gnn parse_gnn(const std::string& bytes, const std::string& source) {
  Reader r{bytes, source};
  Gnn g;
  g.source = source;
  if (bytes.size() < 8) r.fail("the file is shorter than a safetensors header (truncated?)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (n > bytes.size() - 8 || n > (uint64_t{100} << 20)) {
    r.fail("the header length " + std::to_string(n) + " exceeds the file (truncated or not a "
           "safetensors file?)");
  }
  r.data_start = 8 + static_cast<size_t>(n);
  json::Value header;
  try {
    header = json::parse(bytes.substr(8, static_cast<size_t>(n)), source + " (safetensors header)");
    r.header = &header;
    const json::Value* meta = header.find("__metadata__");
    if (meta == nullptr) r.fail("no __metadata__ in the header (not written by blink.gnn.save)");
    const json::Value* fmt = meta->find("format");
    if (fmt == nullptr || !fmt->is(json::Type::kString) || fmt->as_string("format") != "blink.gnn") {
      r.fail("__metadata__.format is not \"blink.gnn\"");
    }
    const int64_t version = meta_int(r, *meta, "format_version");
    if (version != kGnnFormatVersion) {
      r.fail("format_version " + std::to_string(version) + "; this build reads version " +
             std::to_string(kGnnFormatVersion) + " (retrain with `blink train`)");
    }
    if (meta_names(r, *meta, "node_features") != gnn_node_feature_names() ||
        meta_names(r, *meta, "graph_features") != gnn_graph_feature_names()) {
      r.fail("its node / graph feature names differ from this build's (trained on another "
             "feature schema: retrain with `blink train`)");
    }
    g.hidden = meta_int(r, *meta, "hidden");
    const int64_t nl = meta_int(r, *meta, "layers");
    const int64_t nm = meta_int(r, *meta, "members");
    if (g.hidden < 1 || g.hidden > 1024 || nl < 0 || nl > 16 || nm < 1 || nm > 16) {
      r.fail("hidden " + std::to_string(g.hidden) + " / layers " + std::to_string(nl) +
             " / members " + std::to_string(nm) + " out of range (1..1024, 0..16, 1..16)");
    }
    const json::Value clip = json::parse(
        meta->at("clip", "__metadata__").as_string("__metadata__.clip"), source + " clip");
    const std::vector<double>& cl = clip.as_numbers("__metadata__.clip");
    if (cl.size() != 2 || !(cl[0] <= cl[1])) r.fail("__metadata__.clip is not [lo, hi]");
    g.clip_lo = cl[0];
    g.clip_hi = cl[1];
    const int64_t h = g.hidden;
    const int64_t nf = static_cast<int64_t>(gnn_node_feature_names().size());
    const int64_t ngf = static_cast<int64_t>(gnn_graph_feature_names().size());
    const size_t hs = static_cast<size_t>(h);
    for (int64_t k = 0; k < nm; ++k) {
      const std::string m = "members." + std::to_string(k) + ".";
      GnnNet net;
      net.node_mean = r.tensor(m + "node_mean", {nf});
      net.node_std = r.tensor(m + "node_std", {nf});
      net.graph_mean = r.tensor(m + "graph_mean", {ngf});
      net.graph_std = r.tensor(m + "graph_std", {ngf});
      for (double s : net.node_std) if (!(s > 0.0)) r.fail(m + "node_std has a non-positive entry");
      for (double s : net.graph_std) {
        if (!(s > 0.0)) r.fail(m + "graph_std has a non-positive entry");
      }
      net.in_w = transposed(r.tensor(m + "inp.weight", {h, nf}), hs, static_cast<size_t>(nf));
      net.in_b = r.tensor(m + "inp.bias", {h});
      for (int64_t l = 0; l < nl; ++l) {
        const std::string p = m + "layers." + std::to_string(l) + ".";
        GnnLayer layer;
        layer.self_w = transposed(r.tensor(p + "self.weight", {h, h}), hs, hs);
        layer.self_b = r.tensor(p + "self.bias", {h});
        layer.in_w = transposed(r.tensor(p + "msg_in.weight", {h, h}), hs, hs);
        layer.out_w = transposed(r.tensor(p + "msg_out.weight", {h, h}), hs, hs);
        net.layers.push_back(std::move(layer));
      }
      net.readout_w = transposed(r.tensor(m + "readout.weight", {h, 2 * h + ngf}), hs,
                                 static_cast<size_t>(2 * h + ngf));
      net.readout_b = r.tensor(m + "readout.bias", {h});
      net.head_w = r.tensor(m + "head.weight", {1, h});
      net.head_b = r.tensor(m + "head.bias", {1})[0];
      net.node_head_w = r.tensor(m + "node_head.weight", {1, h});
      net.node_head_b = r.tensor(m + "node_head.bias", {1})[0];
      g.members.push_back(std::move(net));
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind(source, 0) == 0) throw;
    r.fail(what);
  }
  return g;
}

Gnn load_gnn(const std::string& path) {
  return parse_gnn(json::read_file(path, size_t{512} << 20), path);
}

}  // namespace blink
