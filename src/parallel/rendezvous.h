// Multi-node bootstrap (SGLang's --nnodes / --node-rank / --dist-init-addr): node 0 listens at
// the init address, every other node connects to it, and each node contributes one blob that
// every node gets back (index = node rank). The NCCL backend sends its unique id as node 0's
// blob; the CPU backend sends each node's transport endpoint. One TCP exchange at start-up;
// nothing here runs on the hot path.
//
// Errors say why: a node that never connects (node 0 names the missing node ranks), node 0 not
// reachable, two nodes with the same --node-rank, nodes started with different --nnodes, a
// port already in use.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace ts::parallel {

struct DistInit {
  int nnodes = 1, node_rank = 0;
  std::string addr;  // "host:port" of node 0
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Checks the fields (node rank in range, an address when nnodes > 1); throws naming the flag.
void check_dist_init(const DistInit& d);

// Every node calls this once with its blob (any bytes); returns all nodes' blobs, index = node
// rank. nnodes 1: returns {blob} without touching the network.
std::vector<std::string> rendezvous_all_gather(const DistInit& d, const std::string& blob);

}  // namespace ts::parallel
