// Small statistics helpers for the benchmarks.
#pragma once
#include <optional>
#include <vector>

namespace ts::bench {

// Percentile by linear interpolation between closest ranks (NumPy's default, Hyndman-Fan type 7):
// sort x, h = (n - 1) * p / 100, result = x[floor(h)] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)]).
// p in [0, 100]; p50 of {1,2,3,4} is 2.5, p99 of {1..100} is 99.01. Empty input -> nullopt.
std::optional<double> percentile(std::vector<double> x, double p);

std::optional<double> mean(const std::vector<double>& x);

// "Nice" axis ticks (steps of 1, 2 or 5 x 10^k) covering [lo, hi] with about `target` ticks.
// Returns the tick values; the first is <= lo and the last is >= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace ts::bench
