// Multi-node engine (--nnodes N --node-rank R --dist-init-addr HOST:PORT): node 0 runs the
// scheduler and serves; nodes 1..N-1 run worker ranks only. Every forward node 0's ModelRunner
// runs is sent first over a step channel (one TCP connection per worker node, rendezvous at
// PORT + 1 after the world's own at PORT) as its chunks (tokens, positions, block tables, state
// slots, logits mode); each worker node runs the same chunks on its ranks, so the collectives
// inside the forward line up across processes. The engine's scheduler, KV bookkeeping and
// sampling exist on node 0 only.
//
// Start-up handshake: each worker sends a fingerprint of what must agree (model, world, KV pool
// size, block size, state slots); node 0 compares it with its own and answers ok or the
// difference — both sides then fail with the same message. Failures never hang: connects and
// the handshake wait --dist-timeout; a worker whose node 0 disappears sees the connection close
// and exits with an error; node 0 sees a dead worker as a send error or, inside the forward, as
// the CPU transport's disconnect/timeout error.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/net.h"
#include "parallel/options.h"

namespace ts {

struct SeqChunk;
class ModelRunner;

class StepChannel {
 public:
  // Node 0: accepts the nnodes - 1 workers and checks their fingerprints against `fingerprint`.
  static std::shared_ptr<StepChannel> serve(const parallel::ParallelOptions& p, const std::string& fingerprint);
  // Node R > 0: connects to node 0 and sends `fingerprint`; throws node 0's answer if it differs.
  static std::shared_ptr<StepChannel> join(const parallel::ParallelOptions& p, const std::string& fingerprint);
  ~StepChannel();  // node 0: tells the workers to quit

  // Node 0: one forward's chunks (before running them locally).
  void send_step(const std::vector<SeqChunk>& chunks, bool capture_aux);
  // Worker: the next forward's chunks (valid until the next call); false when node 0 quit.
  bool recv_step(std::vector<SeqChunk>& chunks, bool& capture_aux);

 private:
  StepChannel() = default;
  int node_rank_ = 0;
  std::vector<parallel::net::Socket> peers_;  // node 0: index = node - 1; worker: [0] = node 0
  std::vector<int32_t> buf_;                   // packed step (send and receive)
  std::vector<std::vector<int32_t>> tables_;   // worker: the received block tables
};

// Worker node: runs every step node 0 sends on `runner` (all local ranks) until node 0 quits.
void run_worker_steps(ModelRunner& runner, StepChannel& ch);

}  // namespace ts
