#include "runtime/node_link.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "core/error.h"
#include "runtime/model_runner.h"

namespace ts {

namespace {

using parallel::net::Clock;
using parallel::net::Socket;

void send_str(const Socket& s, const std::string& v, const char* what) {
  uint32_t n = uint32_t(v.size());
  parallel::net::send_all(s, &n, sizeof n, what);
  if (n) parallel::net::send_all(s, v.data(), n, what);
}

std::string recv_str(const Socket& s, const char* what, Clock::time_point deadline) {
  uint32_t n = 0;
  TS_CHECK(parallel::net::recv_all(s, &n, sizeof n, what, deadline), "{}: the peer closed the connection", what);
  TS_CHECK(n < (1u << 20), "{}: a {}-byte message (not a tokenspeed step channel?)", what, n);
  std::string v(n, '\0');
  if (n) TS_CHECK(parallel::net::recv_all(s, v.data(), n, what, deadline), "{}: the peer closed the connection", what);
  return v;
}

parallel::net::HostPort step_addr(const parallel::ParallelOptions& p) {
  auto hp = parallel::net::parse_host_port(p.dist_init_addr, "--dist-init-addr");
  TS_CHECK(hp.port < 65535, "--dist-init-addr {}: the step channel takes the next port", p.dist_init_addr);
  hp.port += 1;  // the world's rendezvous owns PORT
  return hp;
}

}  // namespace

std::shared_ptr<StepChannel> StepChannel::serve(const parallel::ParallelOptions& p, const std::string& fingerprint) {
  std::shared_ptr<StepChannel> ch(new StepChannel());
  ch->node_rank_ = 0;
  const auto at = step_addr(p);
  Socket listener = parallel::net::listen_tcp(at.host, at.port);
  const auto deadline = Clock::now() + std::chrono::seconds(p.dist_timeout_s);
  ch->peers_.resize(size_t(p.nnodes - 1));
  for (int got = 0; got < p.nnodes - 1; ++got) {
    Socket s = parallel::net::accept_until(listener, deadline);
    TS_CHECK(s.valid(), "step channel {}: {} of {} worker node(s) connected within --dist-timeout {} s", at.str(), got,
             p.nnodes - 1, p.dist_timeout_s);
    const std::string hello = recv_str(s, "step channel handshake", deadline);
    const size_t bar = hello.find('|');
    const int node = bar == std::string::npos ? -1 : std::atoi(hello.substr(0, bar).c_str());
    const std::string theirs = bar == std::string::npos ? hello : hello.substr(bar + 1);
    std::string err;
    if (node < 1 || node >= p.nnodes) err = fmt::format("node rank {} is not in 1..{}", node, p.nnodes - 1);
    else if (ch->peers_[size_t(node - 1)].valid()) err = fmt::format("two nodes with --node-rank {}", node);
    else if (theirs != fingerprint)
      err = fmt::format("node {} was started with another configuration: node 0 has [{}], node {} has [{}]", node,
                        fingerprint, node, theirs);
    send_str(s, err, "step channel handshake");
    TS_CHECK(err.empty(), "multi-node start-up: {}", err);
    ch->peers_[size_t(node - 1)] = std::move(s);
  }
  spdlog::info("multi-node: node 0 drives {} worker node(s) over {}", p.nnodes - 1, at.str());
  return ch;
}

std::shared_ptr<StepChannel> StepChannel::join(const parallel::ParallelOptions& p, const std::string& fingerprint) {
  std::shared_ptr<StepChannel> ch(new StepChannel());
  ch->node_rank_ = p.node_rank;
  const auto at = step_addr(p);
  const auto deadline = Clock::now() + std::chrono::seconds(p.dist_timeout_s);
  Socket s = parallel::net::connect_until(at, deadline, "node 0's step channel");
  send_str(s, fmt::format("{}|{}", p.node_rank, fingerprint), "step channel handshake");
  const std::string err = recv_str(s, "step channel handshake (node 0's answer)", deadline);
  TS_CHECK(err.empty(), "multi-node start-up (node 0 says): {}", err);
  ch->peers_.push_back(std::move(s));
  return ch;
}

StepChannel::~StepChannel() {
  if (node_rank_ != 0) return;
  const uint64_t quit = 0;
  for (auto& s : peers_) {
    try {
      if (s.valid()) parallel::net::send_all(s, &quit, sizeof quit, "step channel (quit)");
    } catch (...) {  // a worker already gone: nothing to tell it
    }
  }
}

// Wire format of one step: u64 element count n (0: quit), then n i32s:
// [capture_aux, S, then per chunk {num_tokens, start_pos, logits, state_slot, table_len}, then
//  every chunk's tokens, then every chunk's block table].
void StepChannel::send_step(const std::vector<SeqChunk>& chunks, bool capture_aux) {
  buf_.clear();
  buf_.push_back(capture_aux ? 1 : 0);
  buf_.push_back(int32_t(chunks.size()));
  for (const SeqChunk& c : chunks)
    buf_.insert(buf_.end(), {c.num_tokens, c.start_pos, int32_t(c.logits), c.state_slot,
                             c.block_table ? int32_t(c.block_table->size()) : 0});
  for (const SeqChunk& c : chunks) buf_.insert(buf_.end(), c.tokens, c.tokens + c.num_tokens);
  for (const SeqChunk& c : chunks)
    if (c.block_table) buf_.insert(buf_.end(), c.block_table->begin(), c.block_table->end());
  const uint64_t n = buf_.size();
  for (size_t i = 0; i < peers_.size(); ++i) {
    const std::string what = fmt::format("step channel to node {}", i + 1);
    parallel::net::send_all(peers_[i], &n, sizeof n, what.c_str());
    parallel::net::send_all(peers_[i], buf_.data(), n * sizeof(int32_t), what.c_str());
  }
}

bool StepChannel::recv_step(std::vector<SeqChunk>& chunks, bool& capture_aux) {
  const Socket& s = peers_.at(0);
  uint64_t n = 0;
  // No deadline: a worker waits for node 0's next step as long as node 0 lives (an idle server
  // sends nothing); node 0 exiting closes the socket, which ends the wait.
  TS_CHECK(parallel::net::recv_all(s, &n, sizeof n, "step channel from node 0"),
           "node {}: node 0 closed the step channel (it exited or died)", node_rank_);
  if (n == 0) return false;
  TS_CHECK(n >= 2 && n < (1ull << 32), "step channel: a step of {} elements", n);
  buf_.resize(n);
  TS_CHECK(parallel::net::recv_all(s, buf_.data(), n * sizeof(int32_t), "step channel from node 0"),
           "node {}: node 0 closed the step channel mid-step", node_rank_);
  capture_aux = buf_[0] != 0;
  const size_t S = size_t(buf_[1]);
  size_t at = 2 + 5 * S;
  TS_CHECK(at <= n, "step channel: a truncated step");
  chunks.assign(S, SeqChunk{});
  tables_.resize(S);
  for (size_t i = 0; i < S; ++i) {
    const int32_t* h = buf_.data() + 2 + 5 * i;
    chunks[i].num_tokens = h[0];
    chunks[i].start_pos = h[1];
    chunks[i].logits = SeqChunk::Logits(h[2]);
    chunks[i].state_slot = h[3];
    chunks[i].tokens = buf_.data() + at;
    at += size_t(h[0]);
  }
  for (size_t i = 0; i < S; ++i) {
    const int32_t len = buf_[2 + 5 * i + 4];
    TS_CHECK(at + size_t(len) <= n, "step channel: a truncated step");
    tables_[i].assign(buf_.data() + at, buf_.data() + at + len);
    chunks[i].block_table = &tables_[i];
    at += size_t(len);
  }
  return true;
}

void run_worker_steps(ModelRunner& runner, StepChannel& ch) {
  std::vector<SeqChunk> chunks;
  bool capture = false;
  int64_t steps = 0;
  while (ch.recv_step(chunks, capture)) {
    runner.run(chunks, capture, /*host_logits=*/false);
    ++steps;
  }
  spdlog::info("multi-node worker: node 0 finished after {} steps", steps);
}

}  // namespace ts
