// `tokenspeed comm-selftest`: runs every collective (and the expert-parallel dispatch) of the CPU
// backend over a world of --nnodes processes x --ranks-per-node threads and checks each result.
// The multi-node CI test starts one process per node:
//   tokenspeed comm-selftest --nnodes 2 --node-rank R --dist-init-addr 127.0.0.1:PORT
#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/selftest.h"
#include "parallel/world.h"

namespace {

int cmd_comm_selftest(int argc, char** argv) {
  CLI::App app{"check every CPU-backend collective across threads and processes (multi-node bootstrap test)"};
  ts::parallel::ParallelOptions p;
  int per_node = 2;
  app.add_option("--nnodes", p.nnodes, "processes (nodes) in the world");
  app.add_option("--node-rank", p.node_rank, "this process's node rank (node 0 hosts the rendezvous)");
  app.add_option("--dist-init-addr", p.dist_init_addr, "host:port of node 0's rendezvous");
  app.add_option("--dist-timeout", p.dist_timeout_s, "seconds to wait for peers");
  app.add_option("--ranks-per-node", per_node, "rank threads per process");
  CLI11_PARSE(app, argc, argv);
  TS_CHECK(per_node >= 1, "--ranks-per-node must be at least 1 (got {})", per_node);
  p.tp_size = p.nnodes * per_node;
  auto comms = ts::parallel::make_cpu_world(p);
  std::vector<ts::parallel::SelftestResult> res(comms.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] { res[i] = ts::parallel::comm_selftest(*comms[i]); });
  for (auto& t : threads) t.join();
  int checks = 0, failed = 0;
  for (auto& r : res) {
    checks += r.checks;
    failed += int(r.failures.size());
    for (auto& f : r.failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
  }
  const int first = p.node_rank * per_node;
  std::printf("comm-selftest: node %d of %d, ranks %d..%d of %d: %d checks, %d failed\n", p.node_rank, p.nnodes, first,
              first + per_node - 1, p.nnodes * per_node, checks, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

TS_COMMAND("comm-selftest", "check the CPU collectives across threads and processes (multi-node bootstrap test)",
           cmd_comm_selftest);
