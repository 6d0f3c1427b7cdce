// A torch-free driver over the artifact readers of the C++ core, for tests/test_core_sanitizers.py:
// it is compiled there with AddressSanitizer + UBSan, so any out-of-bounds read, overflow or
// stack exhaustion on a bad file aborts the run instead of passing unnoticed.
//
//   core_artifact_driver forest|gnn FILE...   one line per file: "<i>\tOK <value>" or "<i>\tERR <message>"
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "blink/error.h"
#include "blink/forest.h"
#include "blink/gnn.h"

namespace {

double eval_forest(const blink::Forest& f) {
  // rows that walk every default direction, both sides of typical thresholds, and extremes
  const double nan = std::nan("");
  const double vals[] = {nan, 0.0, 1.0, -1.0, 1e30, -1e30, 0.5, 1e-30};
  const size_t n = sizeof(vals) / sizeof(vals[0]);
  const size_t cols = static_cast<size_t>(f.num_features);
  std::vector<double> x(n * cols);
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < cols; ++c) x[r * cols + c] = vals[(r + c) % n];
  }
  std::vector<double> out(n);
  f.predict_batch(x.data(), n, cols, false, out.data());
  double s = 0.0;
  for (double v : out) s += v;
  return s + f.predict(x.data());
}

double eval_gnn(const blink::Gnn& g) {
  blink::UnitGraph ug;
  ug.num_nodes = 3;
  ug.x.assign(3 * blink::gnn_node_feature_names().size(), 0.5);
  ug.src = {0, 1, 0};
  ug.dst = {1, 2, 2};
  ug.g.assign(blink::gnn_graph_feature_names().size(), 1.0);
  return g.forward(ug);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    try {
      const double v = mode == "forest" ? eval_forest(blink::load_forest(argv[i]))
                                        : eval_gnn(blink::load_gnn(argv[i]));
      std::printf("%d\tOK %.9g\n", i - 2, v);
    } catch (const blink::Error& e) {
      std::printf("%d\tERR %s\n", i - 2, e.what());
    }
  }
  return 0;
}
