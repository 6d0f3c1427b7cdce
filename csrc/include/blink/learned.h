#pragma once
// Learned per-unit time models on top of the analytic cost: one boosted forest per unit kind
// predicts p = log(measured / analytic) from the unit's features, and the unit's time becomes
// analytic * exp(clip(scale * p)). scale (0 < scale <= 1, from the card) shrinks the forest's
// correction towards the analytic time: on GPUs the forest never saw, its correction is right in
// direction more often than in size (blink/train/units.py chooses scale on held-out GPUs). The
// eager timeline is then re-run with the corrected unit times.
//
// The model's input vector is built by name (models/card.json lists each forest's features in
// order; contract in the project's ARTIFACTS notes): every key of feature_values(), then
// "analytic_time_s", then the GPU's fields "gpu_*". Training builds its rows from the same
// names (blink.learned.input_row / blink._C.unit_model_inputs), so both sides agree.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blink/cost_model.h"
#include "blink/features.h"
#include "blink/forest.h"
#include "blink/trace_types.h"

namespace blink {

// All names a unit model may take as an input, in a fixed order.
const std::vector<std::string>& unit_model_input_names();

// The values of those inputs for one unit (same order as unit_model_input_names()); a
// non-finite value is NaN, XGBoost's missing value.
std::vector<double> unit_model_inputs(const UnitFeatures& f, double analytic_s, const GpuSpec& gpu);

// The unit kind named `name` (unit_kind_name's inverse); false when no kind has that name.
bool unit_kind_from_name(const std::string& name, UnitKind* kind);

// The key a forest's op list is matched on: the ATen name without its overload and without an
// in-place variant's trailing underscore ("aten::add_.Tensor" -> "aten::add"): an in-place op
// runs the same kernel as its out-of-place twin, an overload the same one on other arguments.
std::string unit_model_op_key(const std::string& op_name);

struct UnitModel {
  UnitKind kind = UnitKind::kOther;
  std::shared_ptr<const Forest> forest;
  std::vector<int32_t> columns;  // per forest input: index into unit_model_input_names()
  double clip_lo = -4.0, clip_hi = 4.0;
  double scale = 1.0;  // applied to the forest's output before the clip
  // The op keys (unit_model_op_key) of the rows the forest was fitted on; empty: every op of
  // its kind. A layer-norm forest says nothing about a batch norm's kernel, so a unit whose op
  // is not listed keeps its analytic time.
  std::vector<std::string> ops;
  // The compute-capability majors (GPU generations) the forest was fitted on, lo..hi. On a
  // newer or older generation its GPU-spec splits send every unit to the leaves of the nearest
  // trained chip (a Turing T4's for a Hopper GPU), a correction nothing measured: such units
  // keep the analytic time unless the caller extrapolates on purpose (a GNN trained on the
  // forests' output on that GPU). 0..99 (a card without the range): every generation.
  int cc_major_lo = 0, cc_major_hi = 99;
  bool covers_generation(int cc_major) const {
    return cc_major >= cc_major_lo && cc_major <= cc_major_hi;
  }
};

class UnitModels {
 public:
  // Adds the forest for units of `kind` (a unit_kind_name). Throws blink::Error naming the
  // forest's file when the kind is unknown or already has a model, a feature name is not an
  // input name, the number of names differs from the forest's num_features, the clip range
  // is not finite with lo <= hi, scale is not in (0, 1], an op name is empty, or the
  // compute-capability major range is not 0 <= lo <= hi <= 99.
  void add(const std::string& kind, std::shared_ptr<const Forest> forest,
           const std::vector<std::string>& features, double clip_lo, double clip_hi,
           double scale = 1.0, const std::vector<std::string>& ops = {}, int cc_major_lo = 0,
           int cc_major_hi = 99);
  const UnitModel* find(UnitKind kind) const;  // nullptr when no model covers the kind
  std::vector<std::string> kinds() const;
  bool empty() const { return models_.empty(); }

 private:
  std::vector<UnitModel> models_;
};

// Why a unit kept its analytic time (LearnedResult::fallback); kNone where a forest timed it.
// The one place the decision is made: predict reports these per unit and counts them in its
// notes rather than re-deriving them.
enum class Fallback : uint8_t {
  kNone = 0,
  kNoForest,         // no forest for the unit's kind (or a failed / zero-time unit)
  kOpNotFitted,      // the kind's forest lists ops and the unit's op is not among them
  kOtherGeneration,  // the GPU's compute-capability major is outside the forest's range
};
const char* fallback_name(Fallback f);  // "", "no_forest", "op_not_fitted", "other_generation"

struct LearnedResult {
  std::vector<double> analytic_s;  // per unit: the analytic time (before any correction)
  std::vector<double> log_ratio;   // per unit: clip(scale * p) applied; NaN where analytic was kept
  std::vector<Fallback> fallback;  // per unit: why it kept the analytic time (kNone: a forest's)
  int64_t covered = 0;             // units whose time came from a forest
};

// Applies the models to a costed trace (`trace` the one it was costed from, for op names):
// every unit with a model for its kind that lists its op, no feature error and a positive
// analytic time gets time_s = analytic * exp(clip(scale * p)), provided the GPU's
// compute-capability major is in the model's range or `extrapolate` is set; then the issues'
// GPU times, the timeline and the totals are recomputed (retime_trace). lower_bound_s (the
// roofline timeline) is unchanged.
LearnedResult apply_unit_models(const TraceData& trace, TraceCost& cost, const UnitModels& models,
                                const GpuSpec& gpu, bool extrapolate = false);

}  // namespace blink
