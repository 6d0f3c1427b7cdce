#pragma once
// The graph stage: a small message-passing network over the unit graph that predicts a log
// correction of the end-to-end time (what per-unit costs miss: overlap, launch gaps, cache
// effects between units). Trained in PyTorch (blink/gnn.py defines the same network); the
// weights ship as safetensors with a JSON header; this is the forward pass, in the core.
//
// Graph: one node per cost unit (TraceCost order) with gnn_node_feature_names() features;
// an edge u -> v when v reads a storage that u wrote last (tensor dataflow, from the trace's
// storage ids); graph-level features gnn_graph_feature_names().
//
// Network (hidden size H, L layers; x normalised by the shipped mean / std):
//   h0 = relu(W_in x + b_in)
//   h_{l+1} = relu(S_l h_l + b_l + A_l mean_{u->v} h_l[u] + B_l mean_{v->w} h_l[w])
//   r = [mean_v h_L, max_v h_L, (g - g_mean) / g_std]
//   u_v = w_node . h_L[v] + b_node                  (a per-unit log correction)
//   t_v = max(expm1(x[v][log_time_us]), kGnnMinUnitUs)   (the unit's time, microseconds)
//   c = clip(w_head . relu(W_r r + b_r) + b_head + log(sum_v t_v exp(u_v) / sum_v t_v),
//            clip_lo, clip_hi)
// averaged over the ensemble's K networks, and end_to_end *= exp(mean c). An empty graph
// gives c = 0. The time-weighted term lets each unit's correction count by its share of the
// model's unit time (blink/gnn.py says why).
#include <cstdint>
#include <string>
#include <vector>

#include "blink/cost_model.h"
#include "blink/features.h"
#include "blink/learned.h"
#include "blink/trace_types.h"

namespace blink {

inline constexpr int kGnnFormatVersion = 3;
// The smallest time a unit weighs in the per-unit term (microseconds).
inline constexpr double kGnnMinUnitUs = 1e-6;

const std::vector<std::string>& gnn_node_feature_names();
const std::vector<std::string>& gnn_graph_feature_names();

struct UnitGraph {
  int64_t num_nodes = 0;
  std::vector<double> x;        // num_nodes x gnn_node_feature_names().size(), row-major
  std::vector<int64_t> src;     // edges: producer unit index
  std::vector<int64_t> dst;     //        consumer unit index (src < dst, unique pairs)
  std::vector<double> g;        // gnn_graph_feature_names().size()
};

// The unit graph of a costed trace (after apply_unit_models when `lr` is given: node times are
// the times the units carry, with their analytic times and log ratios from `lr`).
UnitGraph build_unit_graph(const TraceData& trace, const TraceCost& cost, const LearnedResult* lr,
                           const GpuSpec& gpu);

// Weight matrices are kept transposed (in x out, row-major) for the forward's loops.
struct GnnLayer {
  std::vector<double> self_w, self_b, in_w, out_w;  // H x H, H
};

// One trained network of the ensemble.
struct GnnNet {
  std::vector<double> node_mean, node_std, graph_mean, graph_std;
  std::vector<double> in_w, in_b;  // F x H, H
  std::vector<GnnLayer> layers;
  std::vector<double> readout_w, readout_b;  // (2H + G) x H, H
  std::vector<double> head_w;                // H
  double head_b = 0.0;
  std::vector<double> node_head_w;           // H
  double node_head_b = 0.0;
};

// K networks of one configuration, trained from different seeds; their clipped corrections are
// averaged (a seed ensemble: one network's held-out error depends on its seed).
struct Gnn {
  std::string source;
  int64_t hidden = 0;
  double clip_lo = -1.0, clip_hi = 1.0;
  std::vector<GnnNet> members;

  // The clipped log correction c of the graph's end-to-end time: the members' mean.
  double forward(const UnitGraph& graph) const;
  // One member's clipped correction.
  double forward_member(size_t member, const UnitGraph& graph) const;
};

// Parses a safetensors file's bytes: header metadata format "blink.gnn", format_version 3,
// members (K, 1..16), hidden, layers, clip and the node / graph feature names (which must
// equal this build's); tensors "members.<k>.<name>" (PyTorch's state_dict names of
// blink.gnn.GnnEnsemble), each F32 or F64 with the shape the config implies and offsets
// inside the file.
// Throws blink::Error naming `source` and what is wrong.
Gnn parse_gnn(const std::string& bytes, const std::string& source);
Gnn load_gnn(const std::string& path);

}  // namespace blink
