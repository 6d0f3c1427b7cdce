#pragma once
// The embedded evaluator of boosted trees: reads XGBoost's native JSON model format (what
// Booster.save_model("m.json") writes; schema: xgboost/doc/model.schema) into flat arrays and
// evaluates it with XGBoost's own rules, so predict needs no xgboost, pickle or joblib.
//
// XGBoost's rules mirrored here (src/predictor/predict_fn.h, src/tree/tree_model.cc):
// - features are float32: each input is rounded to float before comparison;
// - an internal node sends x to the left child iff x < split_condition, a missing value (NaN)
//   to its default_left direction;
// - a leaf's value is its split_condition entry (learning rate already applied);
// - the margin is base_margin + the sum of one leaf per tree, added in tree order in float32
//   (so margins equal XGBoost's bit for bit), where base_margin is base_score (stored in
//   output space) mapped through the objective's link (identity, logit or log).
//
// Supported: gbtree boosters of one output (num_class <= 1, num_target == 1, scalar leaves),
// numerical splits only, with the regression / binary objectives whose link is listed in
// forest.cpp, written by XGBoost 1.0 to 3.x. Anything else is rejected at load with a
// blink::Error naming the file and what is unsupported; every index is range-checked at load
// and every tree checked to be a tree (no cycles, no shared nodes), so evaluation never reads
// out of bounds or loops.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blink/error.h"

namespace blink {

enum class ForestLink : uint8_t { kIdentity, kLogistic, kLog };

struct Forest {
  std::string source;     // the file (or name) it was read from, for messages
  std::string objective;  // "reg:squarederror", ...
  int version[3] = {0, 0, 0};  // XGBoost version that wrote it
  int64_t num_features = 0;
  double base_score = 0.0;   // as stored (output space)
  double base_margin = 0.0;  // base_score through the link's inverse (margin space)
  ForestLink link = ForestLink::kIdentity;
  std::vector<std::string> feature_names;  // the model's own names when saved with them

  // All trees' nodes in one flat array; roots[t] is tree t's root. One 16-byte record per
  // node, so that a step of the traversal touches one cache line.
  struct Node {
    int32_t left = -1;   // child index into nodes, -1 at a leaf
    int32_t right = -1;
    uint32_t split = 0;  // feature index in bits 0..30; bit 31: a missing value goes left
    float value = 0.0f;  // threshold at an internal node, leaf value at a leaf
    int32_t feature() const { return static_cast<int32_t>(split & 0x7FFFFFFFu); }
    bool default_left() const { return (split >> 31) != 0; }
  };
  std::vector<int32_t> roots;
  std::vector<Node> nodes;

  size_t num_trees() const { return roots.size(); }
  size_t num_nodes() const { return nodes.size(); }

  // One row of exactly num_features values (NaN = missing). Margin: base_margin + leaves.
  double margin(const double* row) const;
  // The margin through the objective's link (XGBoost's default predict output).
  double predict(const double* row) const;
  // Row-major rows x cols (cols must equal num_features); out has `rows` entries.
  void predict_batch(const double* x, size_t rows, size_t cols, bool output_margin,
                     double* out) const;
};

// Parses the JSON text of an XGBoost model; `source` names it in errors.
Forest parse_forest(const std::string& text, const std::string& source);

// Reads and parses an XGBoost JSON model file.
Forest load_forest(const std::string& path);

}  // namespace blink
