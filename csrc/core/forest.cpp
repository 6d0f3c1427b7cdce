// XGBoost JSON models -> flat arrays, and their evaluation (see blink/forest.h).
#include "blink/forest.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "blink/json.h"

namespace blink {
namespace {

// Oldest and newest XGBoost major versions whose JSON layout this reader knows. 1.0 introduced
// the JSON format; 3.1 changed base_score to a bracketed list ("[5E-1]"), handled below.
constexpr int kMinMajor = 1;
constexpr int kMaxMajor = 3;

struct ObjectiveInfo {
  const char* name;
  ForestLink link;
};

// Objectives of one output whose prediction is a link of the margin (XGBoost's
// ProbToMargin / PredTransform pairs in src/objective/regression_loss.h and
// regression_obj.cu): identity for the squared / absolute / Huber / quantile / squared-log
// losses, sigmoid for logistic, exp for the log-link count and positive-value models.
constexpr ObjectiveInfo kObjectives[] = {
    {"reg:squarederror", ForestLink::kIdentity},
    {"reg:linear", ForestLink::kIdentity},  // the pre-1.0 name of reg:squarederror
    {"reg:squaredlogerror", ForestLink::kIdentity},
    {"reg:pseudohubererror", ForestLink::kIdentity},
    {"reg:absoluteerror", ForestLink::kIdentity},
    {"reg:quantileerror", ForestLink::kIdentity},
    {"reg:logistic", ForestLink::kLogistic},
    {"binary:logistic", ForestLink::kLogistic},
    {"count:poisson", ForestLink::kLog},
    {"reg:gamma", ForestLink::kLog},
    {"reg:tweedie", ForestLink::kLog},
};

std::string supported_objectives() {
  std::string s;
  for (const ObjectiveInfo& o : kObjectives) {
    if (!s.empty()) s += ", ";
    s += o.name;
  }
  return s;
}

// All checks of one file share its name as the message prefix.
struct Ctx {
  const std::string& source;
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(source + ": not a usable XGBoost model: " + why);
  }
  void check(bool ok, const std::string& why) const {
    if (!ok) fail(why);
  }
};

int64_t parse_int_string(const Ctx& c, const json::Value& v, const std::string& what) {
  // XGBoost writes its *_param fields as strings ("7"); accept a plain number too.
  if (v.is(json::Type::kNumber)) {
    const double d = v.as_number(what);
    c.check(d == std::floor(d) && std::fabs(d) < 9.0e15, what + " is not an integer");
    return static_cast<int64_t>(d);
  }
  const std::string& s = v.as_string(what);
  int64_t out = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  c.check(r.ec == std::errc() && r.ptr == s.data() + s.size(),
          what + " is \"" + s + "\", not an integer");
  return out;
}

int32_t to_index(const Ctx& c, double d, const std::string& what) {
  c.check(d == std::floor(d) && d >= -2147483648.0 && d <= 2147483647.0,
          what + " is " + std::to_string(d) + ", not a 32-bit integer");
  return static_cast<int32_t>(d);
}

// base_score: "5E-1" before XGBoost 3.1, "[5E-1]" (one entry per target) from 3.1 on.
double parse_base_score(const Ctx& c, const json::Value& param) {
  const std::string what = "learner.learner_model_param.base_score";
  const json::Value& v = param.at("base_score", what);
  if (v.is(json::Type::kNumber)) return v.as_number(what);
  const std::string& s = v.as_string(what);
  json::Value inner;
  try {
    inner = json::parse(s, what);
  } catch (const Error&) {
    c.fail(what + " is \"" + s + "\", not a number or a one-element list");
  }
  if (inner.is(json::Type::kNumber)) return inner.as_number(what);
  c.check(inner.is(json::Type::kArray), what + " is \"" + s + "\", not a number");
  const std::vector<double>& vals = inner.as_numbers(what);
  c.check(vals.size() == 1, what + " has " + std::to_string(vals.size()) +
                                " entries (a multi-target model); only single-output models are "
                                "supported");
  return vals[0];
}

}  // namespace

Forest parse_forest(const std::string& text, const std::string& source) {
  const Ctx c{source};
  Forest f;
  f.source = source;
  const json::Value doc = json::parse(text, source);
  c.check(doc.is(json::Type::kObject), "the document is a JSON " +
                                           std::string(json::type_name(doc.type())) +
                                           ", not an object (is this an XGBoost JSON model?)");
  // Re-label the json layer's type errors with the file name.
  try {
    // ---- version ----
    const json::Value* ver = doc.find("version");
    c.check(ver != nullptr,
            "no \"version\" field: not written by XGBoost's save_model(\"*.json\") (a config "
            "from save_config, a UBJSON or a legacy binary model is not supported)");
    const std::vector<double>& vv = ver->as_numbers("version");
    c.check(vv.size() == 3, "\"version\" has " + std::to_string(vv.size()) +
                                " entries, expected [major, minor, patch]");
    for (int i = 0; i < 3; ++i) f.version[i] = to_index(c, vv[static_cast<size_t>(i)], "version");
    const std::string vs = std::to_string(f.version[0]) + "." + std::to_string(f.version[1]) + "." +
                           std::to_string(f.version[2]);
    c.check(f.version[0] >= kMinMajor && f.version[0] <= kMaxMajor,
            "written by XGBoost " + vs + "; this reader supports models written by XGBoost " +
                std::to_string(kMinMajor) + ".0 to " + std::to_string(kMaxMajor) +
                ".x (re-save the model with a supported XGBoost)");

    const json::Value& learner = doc.at("learner", "the document");
    // ---- objective ----
    const json::Value& obj = learner.at("objective", "learner");
    f.objective = obj.at("name", "learner.objective").as_string("learner.objective.name");
    bool known = false;
    for (const ObjectiveInfo& o : kObjectives) {
      if (f.objective == o.name) {
        f.link = o.link;
        known = true;
      }
    }
    c.check(known, "objective \"" + f.objective + "\" is not supported (supported: " +
                       supported_objectives() + ")");

    // ---- learner_model_param ----
    const json::Value& param = learner.at("learner_model_param", "learner");
    f.num_features =
        parse_int_string(c, param.at("num_feature", "learner.learner_model_param"),
                         "learner.learner_model_param.num_feature");
    c.check(f.num_features > 0 && f.num_features <= (int64_t{1} << 24),
            "num_feature " + std::to_string(f.num_features) + " is out of range");
    if (const json::Value* nc = param.find("num_class")) {
      const int64_t n = parse_int_string(c, *nc, "learner.learner_model_param.num_class");
      c.check(n <= 1, "num_class is " + std::to_string(n) +
                          " (a multi-class model); only single-output models are supported");
    }
    if (const json::Value* nt = param.find("num_target")) {
      const int64_t n = parse_int_string(c, *nt, "learner.learner_model_param.num_target");
      c.check(n == 1, "num_target is " + std::to_string(n) +
                          " (a multi-target model); only single-output models are supported");
    }
    f.base_score = parse_base_score(c, param);
    c.check(std::isfinite(f.base_score), "base_score is not finite");
    switch (f.link) {
      case ForestLink::kIdentity:
        f.base_margin = f.base_score;
        break;
      case ForestLink::kLogistic:
        c.check(f.base_score > 0.0 && f.base_score < 1.0,
                "base_score " + std::to_string(f.base_score) + " is outside (0, 1) for " +
                    f.objective);
        // In float, as XGBoost's ProbToMargin computes it.
        f.base_margin = -std::log(1.0f / static_cast<float>(f.base_score) - 1.0f);
        break;
      case ForestLink::kLog:
        c.check(f.base_score > 0.0, "base_score " + std::to_string(f.base_score) +
                                        " is not positive for " + f.objective);
        f.base_margin = std::log(static_cast<float>(f.base_score));
        break;
    }

    // ---- feature names / types ----
    if (const json::Value* names = learner.find("feature_names")) {
      for (const json::Value& n : names->as_array("learner.feature_names")) {
        f.feature_names.push_back(n.as_string("learner.feature_names[]"));
      }
      c.check(f.feature_names.empty() ||
                  static_cast<int64_t>(f.feature_names.size()) == f.num_features,
              "learner.feature_names has " + std::to_string(f.feature_names.size()) +
                  " names for " + std::to_string(f.num_features) + " features");
    }
    if (const json::Value* types = learner.find("feature_types")) {
      for (const json::Value& t : types->as_array("learner.feature_types")) {
        const std::string& s = t.as_string("learner.feature_types[]");
        c.check(s != "c", "the model has categorical features (feature_types \"c\"); only "
                          "numerical splits are supported");
      }
    }

    // ---- booster ----
    const json::Value& gb = learner.at("gradient_booster", "learner");
    const std::string& gb_name = gb.at("name", "learner.gradient_booster")
                                     .as_string("learner.gradient_booster.name");
    c.check(gb_name == "gbtree", "booster \"" + gb_name +
                                     "\" is not supported (only gbtree; dart and gblinear are "
                                     "not)");
    const json::Value& model = gb.at("model", "learner.gradient_booster");
    const std::string mwhat = "learner.gradient_booster.model";
    if (const json::Value* cats = model.find("cats")) {
      if (const json::Value* enc = cats->find("enc")) {
        c.check(enc->array_size(mwhat + ".cats.enc") == 0,
                "the model carries a categorical encoding (cats.enc); only numerical splits are "
                "supported");
      }
    }
    const json::Value& trees = model.at("trees", mwhat);
    const std::vector<json::Value>& tree_list = trees.as_array(mwhat + ".trees");
    const json::Value& gbp = model.at("gbtree_model_param", mwhat);
    const int64_t num_trees = parse_int_string(c, gbp.at("num_trees", mwhat + ".gbtree_model_param"),
                                               mwhat + ".gbtree_model_param.num_trees");
    c.check(num_trees == static_cast<int64_t>(tree_list.size()),
            "gbtree_model_param.num_trees says " + std::to_string(num_trees) + " but " +
                std::to_string(tree_list.size()) + " trees are stored (truncated or edited file?)");
    if (const json::Value* info = model.find("tree_info")) {
      const std::vector<double>& ti = info->as_numbers(mwhat + ".tree_info");
      c.check(ti.size() == tree_list.size(), "tree_info has " + std::to_string(ti.size()) +
                                                 " entries for " +
                                                 std::to_string(tree_list.size()) + " trees");
      for (double g : ti) {
        c.check(g == 0.0, "tree_info names output group " + std::to_string(g) +
                              "; only single-output models are supported");
      }
    }

    // ---- trees, into flat arrays ----
    std::vector<uint8_t> seen;
    std::vector<int32_t> stack;
    for (size_t t = 0; t < tree_list.size(); ++t) {
      const json::Value& tree = tree_list[t];
      const std::string tw = "trees[" + std::to_string(t) + "]";
      const json::Value& tp = tree.at("tree_param", tw);
      if (const json::Value* slv = tp.find("size_leaf_vector")) {
        const int64_t n = parse_int_string(c, *slv, tw + ".tree_param.size_leaf_vector");
        c.check(n <= 1, tw + " has vector leaves (size_leaf_vector " + std::to_string(n) +
                            "); only scalar leaves are supported");
      }
      const int64_t n = parse_int_string(c, tp.at("num_nodes", tw + ".tree_param"),
                                         tw + ".tree_param.num_nodes");
      c.check(n >= 1 && n <= std::numeric_limits<int32_t>::max(),
              tw + " has " + std::to_string(n) + " nodes");
      const size_t nn = static_cast<size_t>(n);
      const auto& lc = tree.at("left_children", tw).as_numbers(tw + ".left_children");
      const auto& rc = tree.at("right_children", tw).as_numbers(tw + ".right_children");
      const auto& si = tree.at("split_indices", tw).as_numbers(tw + ".split_indices");
      const auto& sc = tree.at("split_conditions", tw).as_numbers(tw + ".split_conditions");
      const json::Value& dl_v = tree.at("default_left", tw);
      for (const auto* arr : {&lc, &rc, &si, &sc}) {
        c.check(arr->size() == nn, tw + ": a node array has " + std::to_string(arr->size()) +
                                       " entries for num_nodes " + std::to_string(nn) +
                                       " (truncated or edited file?)");
      }
      c.check(dl_v.array_size(tw + ".default_left") == nn,
              tw + ".default_left has " + std::to_string(dl_v.array_size(tw + ".default_left")) +
                  " entries for num_nodes " + std::to_string(nn));
      if (const json::Value* st = tree.find("split_type")) {
        for (double s : st->as_numbers(tw + ".split_type")) {
          c.check(s == 0.0, tw + " has a categorical split (split_type " + std::to_string(s) +
                                "); only numerical splits are supported");
        }
      }
      if (const json::Value* cat = tree.find("categories")) {
        c.check(cat->array_size(tw + ".categories") == 0,
                tw + " has categorical splits; only numerical splits are supported");
      }
      const size_t offset = f.nodes.size();
      c.check(offset + nn <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
              "more than 2^31 nodes in all");
      f.roots.push_back(static_cast<int32_t>(offset));
      // default_left: 0/1 integers (XGBoost >= 1.6) or booleans (older).
      std::vector<uint8_t> dl(nn, 0);
      if (dl_v.array_size(tw + ".default_left") > 0) {
        const std::vector<json::Value>& items = dl_v.as_array(tw + ".default_left");
        for (size_t i = 0; i < nn; ++i) {
          if (items[i].is(json::Type::kBool)) {
            dl[i] = items[i].as_bool(tw + ".default_left[]") ? 1 : 0;
          } else {
            const double d = items[i].as_number(tw + ".default_left[]");
            c.check(d == 0.0 || d == 1.0, tw + ".default_left[" + std::to_string(i) +
                                              "] is " + std::to_string(d) + ", not 0 or 1");
            dl[i] = d != 0.0 ? 1 : 0;
          }
        }
      }
      for (size_t i = 0; i < nn; ++i) {
        const std::string nw = tw + " node " + std::to_string(i);
        const int32_t l = to_index(c, lc[i], nw + " left child");
        const int32_t r = to_index(c, rc[i], nw + " right child");
        const float v = static_cast<float>(sc[i]);
        c.check(std::isfinite(v), nw + " has a non-finite split condition / leaf value");
        const bool leaf = l == -1;
        c.check(leaf == (r == -1), nw + " has one child only");
        int32_t feature = 0;
        if (!leaf) {
          c.check(l >= 0 && static_cast<size_t>(l) < nn && r >= 0 && static_cast<size_t>(r) < nn,
                  nw + " has a child index outside 0.." + std::to_string(nn - 1));
          feature = to_index(c, si[i], nw + " split index");
          c.check(feature >= 0 && feature < f.num_features,
                  nw + " splits on feature " + std::to_string(feature) + " but the model has " +
                      std::to_string(f.num_features) + " features");
        }
        Forest::Node node;
        node.left = leaf ? -1 : static_cast<int32_t>(offset) + l;
        node.right = leaf ? -1 : static_cast<int32_t>(offset) + r;
        node.split = static_cast<uint32_t>(feature) | (dl[i] ? 0x80000000u : 0u);
        node.value = v;
        f.nodes.push_back(node);
      }
      // A tree: every node reached from the root at most once (no cycle, no shared child),
      // so evaluation stops within num_nodes steps.
      seen.assign(nn, 0);
      stack.assign(1, 0);
      while (!stack.empty()) {
        const int32_t i = stack.back();
        stack.pop_back();
        c.check(!seen[static_cast<size_t>(i)],
                tw + " node " + std::to_string(i) + " is reached twice (not a tree)");
        seen[static_cast<size_t>(i)] = 1;
        const Forest::Node& node = f.nodes[offset + static_cast<size_t>(i)];
        if (node.left >= 0) {
          stack.push_back(node.left - static_cast<int32_t>(offset));
          stack.push_back(node.right - static_cast<int32_t>(offset));
        }
      }
    }
    c.check(!f.roots.empty(), "the model has no trees");
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind(source, 0) == 0) throw;  // already names the file
    c.fail(what);
  }
  return f;
}

Forest load_forest(const std::string& path) { return parse_forest(json::read_file(path), path); }

namespace {

// One step from internal node n for `row`. XGBoost stores features as float32 and sends
// x < threshold left, a missing value to the default side. Branch-free: a NaN compares false,
// so left = (x < t) or (NaN and default-left).
inline int32_t step(const Forest::Node& n, const double* row) {
  const float x = static_cast<float>(row[n.split & 0x7FFFFFFFu]);
  const int32_t go_left = static_cast<int32_t>(x < n.value) |
                          (static_cast<int32_t>(std::isnan(x)) & static_cast<int32_t>(n.split >> 31));
  return n.right ^ ((n.left ^ n.right) & -go_left);
}

// The leaf one row reaches in the tree rooted at `i`.
inline float leaf_value(const Forest& f, int32_t i, const double* row) {
  const Forest::Node* nodes = f.nodes.data();
  while (nodes[i].left >= 0) i = step(nodes[i], row);
  return nodes[i].value;
}

// kLanes rows down one tree in lockstep: independent load chains the CPU overlaps.
constexpr size_t kLanes = 8;
inline void leaf_values(const Forest& f, int32_t root, const double* const* rows, float* acc) {
  const Forest::Node* nodes = f.nodes.data();
  int32_t idx[kLanes];
  for (size_t k = 0; k < kLanes; ++k) idx[k] = root;
  bool active = true;
  while (active) {
    active = false;
    for (size_t k = 0; k < kLanes; ++k) {
      const Forest::Node& n = nodes[idx[k]];
      if (n.left >= 0) {
        idx[k] = step(n, rows[k]);
        active = true;
      }
    }
  }
  for (size_t k = 0; k < kLanes; ++k) acc[k] += nodes[idx[k]].value;
}

double apply_link(ForestLink link, double m) {
  switch (link) {
    case ForestLink::kLogistic: return 1.0 / (1.0 + std::exp(-m));
    case ForestLink::kLog: return std::exp(m);
    case ForestLink::kIdentity: break;
  }
  return m;
}

}  // namespace

double Forest::margin(const double* row) const {
  // float32 sums in tree order, as XGBoost accumulates its predictions: bit-identical margins.
  float sum = static_cast<float>(base_margin);
  for (int32_t root : roots) sum += leaf_value(*this, root, row);
  return sum;
}

double Forest::predict(const double* row) const { return apply_link(link, margin(row)); }

void Forest::predict_batch(const double* x, size_t rows, size_t cols, bool output_margin,
                           double* out) const {
  BLINK_CHECK(static_cast<int64_t>(cols) == num_features,
              source + ": the model takes " + std::to_string(num_features) +
                  " features per row, got " + std::to_string(cols));
  // Blocks of rows, tree by tree: one tree's nodes stay in L1 while a block walks it (the
  // layout XGBoost's CPU predictor uses too). Each row still sums its trees in order, so the
  // result equals margin(row).
  constexpr size_t kBlock = 64;
  for (size_t r0 = 0; r0 < rows; r0 += kBlock) {
    const size_t nb = std::min(kBlock, rows - r0);
    float acc[kBlock];  // float32, as margin()
    for (size_t b = 0; b < nb; ++b) acc[b] = static_cast<float>(base_margin);
    const double* lanes[kBlock];
    for (size_t b = 0; b < nb; ++b) lanes[b] = x + (r0 + b) * cols;
    const size_t full = nb - nb % kLanes;
    for (int32_t root : roots) {
      for (size_t b = 0; b < full; b += kLanes) leaf_values(*this, root, lanes + b, acc + b);
      for (size_t b = full; b < nb; ++b) acc[b] += leaf_value(*this, root, lanes[b]);
    }
    for (size_t b = 0; b < nb; ++b) out[r0 + b] = output_margin ? acc[b] : apply_link(link, acc[b]);
  }
}

}  // namespace blink
