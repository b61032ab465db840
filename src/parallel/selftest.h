// A check of every collective and of the expert-parallel dispatch over a CPU world, with
// inputs every rank can recompute (functions of rank and index) so each rank checks its own
// results exactly. Used by `tokenspeed comm-selftest` (several processes: the multi-node CI
// test) and by the unit tests (threads, and two "nodes" over TCP in one process).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace ts::parallel {

struct SelftestResult {
  int checks = 0;
  std::vector<std::string> failures;  // one line each, naming the collective and the rank
};

// Every rank of `world` (a CPU-backend Comm) calls it from its own thread.
SelftestResult comm_selftest(Comm& world);

}  // namespace ts::parallel
