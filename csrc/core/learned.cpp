// Per-unit forests applied to a costed trace (see blink/learned.h).
#include "blink/learned.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "blink/error.h"
#include "blink/timeline.h"

namespace blink {
namespace {

constexpr UnitKind kAllKinds[] = {
    UnitKind::kGemm,   UnitKind::kConv,      UnitKind::kAttention, UnitKind::kNorm,
    UnitKind::kSoftmax, UnitKind::kReduction, UnitKind::kElementwise, UnitKind::kEmbedding,
    UnitKind::kCopy,   UnitKind::kOptimizer, UnitKind::kLoss,      UnitKind::kOther,
};

// The GPU fields, in input order (after the unit's features and analytic_time_s).
constexpr const char* kGpuNames[] = {
    "gpu_sm_count",  "gpu_clock_hz",  "gpu_mem_bw",    "gpu_l2_bytes", "gpu_peak_fp32",
    "gpu_peak_tf32", "gpu_peak_bf16", "gpu_peak_fp16", "gpu_peak_fp8", "gpu_cc",
};

}  // namespace

const std::vector<std::string>& unit_model_input_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& kv : feature_values(UnitFeatures{})) out.emplace_back(kv.first);
    out.emplace_back("analytic_time_s");
    for (const char* g : kGpuNames) out.emplace_back(g);
    return out;
  }();
  return names;
}

std::vector<double> unit_model_inputs(const UnitFeatures& f, double analytic_s,
                                      const GpuSpec& gpu) {
  std::vector<double> out;
  out.reserve(unit_model_input_names().size());
  for (const auto& kv : feature_values(f)) out.push_back(kv.second);
  out.push_back(analytic_s);
  out.push_back(gpu.sm_count);
  out.push_back(gpu.clock_hz);
  out.push_back(gpu.mem_bw);
  out.push_back(gpu.l2_bytes);
  out.push_back(gpu.peak_fp32);
  out.push_back(gpu.peak_tf32);
  out.push_back(gpu.peak_bf16);
  out.push_back(gpu.peak_fp16);
  out.push_back(gpu.peak_fp8);
  out.push_back(10.0 * gpu.cc_major + gpu.cc_minor);
  // A non-finite input (an intensity over zero bytes) is a missing value, as in training.
  for (double& v : out) {
    if (!std::isfinite(v)) v = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

bool unit_kind_from_name(const std::string& name, UnitKind* kind) {
  for (UnitKind k : kAllKinds) {
    if (name == unit_kind_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

std::string unit_model_op_key(const std::string& op_name) {
  std::string key = op_name.substr(0, op_name.find('.'));
  // "aten::__and__" is a name of its own; only a single trailing underscore marks in-place.
  if (key.size() > 1 && key.back() == '_' && key[key.size() - 2] != '_') key.pop_back();
  return key;
}

void UnitModels::add(const std::string& kind, std::shared_ptr<const Forest> forest,
                     const std::vector<std::string>& features, double clip_lo, double clip_hi,
                     double scale, const std::vector<std::string>& ops, int cc_major_lo,
                     int cc_major_hi) {
  BLINK_CHECK(forest != nullptr, "UnitModels.add: no forest for kind \"" + kind + "\"");
  const std::string& src = forest->source;
  UnitModel m;
  if (!unit_kind_from_name(kind, &m.kind)) {
    std::string known;
    for (UnitKind k : kAllKinds) known += std::string(known.empty() ? "" : ", ") + unit_kind_name(k);
    throw Error(src + ": unit kind \"" + kind + "\" is not one of " + known);
  }
  BLINK_CHECK(find(m.kind) == nullptr, src + ": a model for unit kind \"" + kind +
                                           "\" was already added");
  BLINK_CHECK(static_cast<int64_t>(features.size()) == forest->num_features,
              src + ": the card lists " + std::to_string(features.size()) +
                  " features but the forest takes " + std::to_string(forest->num_features));
  BLINK_CHECK(std::isfinite(clip_lo) && std::isfinite(clip_hi) && clip_lo <= clip_hi,
              src + ": clip range [" + std::to_string(clip_lo) + ", " + std::to_string(clip_hi) +
                  "] is not a finite range with lo <= hi");
  // Not a range check on a fit: 0 would silently switch the forest off, > 1 would amplify it.
  BLINK_CHECK(std::isfinite(scale) && scale > 0.0 && scale <= 1.0,
              src + ": scale " + std::to_string(scale) + " is not in (0, 1]");
  BLINK_CHECK(cc_major_lo >= 0 && cc_major_lo <= cc_major_hi && cc_major_hi <= 99,
              src + ": compute-capability major range [" + std::to_string(cc_major_lo) + ", " +
                  std::to_string(cc_major_hi) + "] is not 0 <= lo <= hi <= 99");
  const std::vector<std::string>& names = unit_model_input_names();
  for (const std::string& f : features) {
    const auto it = std::find(names.begin(), names.end(), f);
    BLINK_CHECK(it != names.end(),
                src + ": feature \"" + f + "\" is not a unit-model input this build knows (a "
                "model trained on another feature schema? retrain with `blink train`)");
    m.columns.push_back(static_cast<int32_t>(it - names.begin()));
  }
  if (!forest->feature_names.empty()) {
    BLINK_CHECK(forest->feature_names == features,
                src + ": the forest's own feature names differ from the card's list");
  }
  for (const std::string& op : ops) {
    BLINK_CHECK(!op.empty(), src + ": an empty op name in the forest's op list");
    const std::string key = unit_model_op_key(op);
    if (std::find(m.ops.begin(), m.ops.end(), key) == m.ops.end()) m.ops.push_back(key);
  }
  m.forest = std::move(forest);
  m.clip_lo = clip_lo;
  m.clip_hi = clip_hi;
  m.scale = scale;
  m.cc_major_lo = cc_major_lo;
  m.cc_major_hi = cc_major_hi;
  models_.push_back(std::move(m));
}

const UnitModel* UnitModels::find(UnitKind kind) const {
  for (const UnitModel& m : models_) {
    if (m.kind == kind) return &m;
  }
  return nullptr;
}

std::vector<std::string> UnitModels::kinds() const {
  std::vector<std::string> out;
  for (const UnitModel& m : models_) out.emplace_back(unit_kind_name(m.kind));
  return out;
}

const char* fallback_name(Fallback f) {
  switch (f) {
    case Fallback::kNone: return "";
    case Fallback::kNoForest: return "no_forest";
    case Fallback::kOpNotFitted: return "op_not_fitted";
    case Fallback::kOtherGeneration: return "other_generation";
  }
  return "no_forest";
}

LearnedResult apply_unit_models(const TraceData& trace, TraceCost& cost, const UnitModels& models,
                                const GpuSpec& gpu, bool extrapolate) {
  LearnedResult r;
  const size_t n = cost.units.size();
  r.analytic_s.resize(n);
  r.log_ratio.assign(n, std::numeric_limits<double>::quiet_NaN());
  r.fallback.assign(n, Fallback::kNoForest);
  std::vector<double> row;
  for (size_t i = 0; i < n; ++i) {
    UnitCost& u = cost.units[i];
    r.analytic_s[i] = u.time_s;
    if (!u.error.empty() || !(u.time_s > 0.0)) continue;
    const UnitModel* m = models.find(u.features.kind);
    if (m == nullptr) continue;
    if (!m->ops.empty()) {
      BLINK_CHECK(u.op >= 0 && static_cast<size_t>(u.op) < trace.ops.size(),
                  "apply_unit_models: unit " + std::to_string(i) + " names op " +
                      std::to_string(u.op) + ", not an op of the trace it was costed from");
      const int32_t name = trace.ops[static_cast<size_t>(u.op)].name;
      const std::string key = name >= 0 && static_cast<size_t>(name) < trace.names.size()
                                  ? unit_model_op_key(trace.names[static_cast<size_t>(name)])
                                  : std::string();
      if (std::find(m->ops.begin(), m->ops.end(), key) == m->ops.end()) {
        r.fallback[i] = Fallback::kOpNotFitted;
        continue;
      }
    }
    if (!extrapolate && !m->covers_generation(gpu.cc_major)) {
      r.fallback[i] = Fallback::kOtherGeneration;
      continue;
    }
    const std::vector<double> all = unit_model_inputs(u.features, u.time_s, gpu);
    row.resize(m->columns.size());
    for (size_t c = 0; c < m->columns.size(); ++c) row[c] = all[static_cast<size_t>(m->columns[c])];
    const double p = m->forest->predict(row.data());
    // A NaN prediction cannot come from finite leaves; clip keeps exp() bounded either way.
    const double sp = m->scale * p;
    const double q = std::isfinite(sp) ? std::min(std::max(sp, m->clip_lo), m->clip_hi) : 0.0;
    r.log_ratio[i] = q;
    r.fallback[i] = Fallback::kNone;
    u.time_s *= std::exp(q);
    ++r.covered;
  }
  if (r.covered > 0) retime_trace(cost);
  return r;
}

}  // namespace blink
