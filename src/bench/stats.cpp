#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace ts::bench {

std::optional<double> percentile(std::vector<double> x, double p) {
  if (x.empty()) return std::nullopt;
  std::sort(x.begin(), x.end());
  p = std::clamp(p, 0.0, 100.0);
  double h = double(x.size() - 1) * p / 100.0;
  size_t lo = size_t(std::floor(h));
  if (lo + 1 >= x.size()) return x.back();
  return x[lo] + (h - double(lo)) * (x[lo + 1] - x[lo]);
}

std::optional<double> mean(const std::vector<double>& x) {
  if (x.empty()) return std::nullopt;
  double s = 0;
  for (double v : x) s += v;
  return s / double(x.size());
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    double pad = std::fabs(lo) > 0 ? std::fabs(lo) * 0.5 : 1.0;
    lo -= pad;
    hi += pad;
  }
  double raw = (hi - lo) / std::max(1, target - 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  double first = std::floor(lo / step) * step;
  std::vector<double> t;
  for (int i = 0; i < 1000; ++i) {
    double v = first + i * step;
    if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0"
    t.push_back(v);
    if (v >= hi - step * 1e-9) break;
  }
  return t;
}

}  // namespace ts::bench
