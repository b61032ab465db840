// Point-to-point messages between the ranks of a CPU world, the one primitive the CPU backend's
// collectives are built from (comm_cpu.cpp). Ranks are threads; a world may span processes
// ("nodes", one per --node-rank) joined by one TCP connection per pair of processes.
//
// Ordering: messages from one rank to another under one tag arrive in the order they were sent
// (per-pair FIFO). send() never blocks on the receiver (the message is copied into the
// receiver's mailbox or onto the socket); recv() blocks until the message arrives, the sending
// process disconnects, or the transport's timeout passes — each a clear error naming both
// ranks. Message buffers are pooled per mailbox, so a steady stream of same-sized collectives
// stops allocating after the first.
//
// Threading: send/recv may be called from any thread; each rank's thread uses its own rank id.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/net.h"
#include "parallel/rendezvous.h"

namespace ts::parallel {

class CpuTransport {
 public:
  // All `world` ranks in this process.
  static std::shared_ptr<CpuTransport> local(int world, std::chrono::milliseconds timeout = std::chrono::seconds(300));
  // This process is node d.node_rank of d.nnodes and hosts `local_ranks` ranks: global ranks
  // [node_rank * local_ranks, (node_rank + 1) * local_ranks). Rendezvous at d.addr, then one
  // connection per pair of nodes. Every node must pass the same local_ranks.
  static std::shared_ptr<CpuTransport> connect(const DistInit& d, int local_ranks);
  ~CpuTransport();
  CpuTransport(const CpuTransport&) = delete;
  CpuTransport& operator=(const CpuTransport&) = delete;

  int world() const { return world_; }
  int first_local() const { return first_; }
  int local_count() const { return local_; }
  bool is_local(int rank) const { return rank >= first_ && rank < first_ + local_; }
  int node_of(int rank) const { return rank / local_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Sends `bytes` bytes from local rank src to rank dst under tag.
  void send(int src, int dst, uint64_t tag, const void* data, size_t bytes);
  // Receives the next message from src to local rank dst under tag into data, which must be
  // exactly `bytes` long (a different size is an error naming both sizes and `what`).
  void recv(int dst, int src, uint64_t tag, void* data, size_t bytes, const char* what);

 private:
  CpuTransport(int world, int first, int local, std::chrono::milliseconds timeout);
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::pair<int, uint64_t>, std::deque<std::vector<char>>> queues;  // (src, tag)
    std::vector<std::vector<char>> pool;                                        // spent buffers
  };
  struct Link {  // to one other node
    net::Socket sock;
    std::mutex send_mu;
    std::thread reader;
    std::atomic<bool> dead{false};
    std::string why;  // set before dead
  };
  void deliver(int src, int dst, uint64_t tag, const void* data, size_t bytes);
  void read_loop(int node);
  void link_failed(int node, const std::string& why);

  int world_, first_, local_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Mailbox>> boxes_;  // per local rank
  std::vector<std::unique_ptr<Link>> links_;     // per node (null for this node)
  std::atomic<bool> closing_{false};
};

}  // namespace ts::parallel
