// The multi-node bootstrap: blobs gathered from every node, and the errors that say why when a
// node never comes, two nodes claim one rank, nodes disagree on --nnodes, or flags are bad.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "parallel/net.h"
#include "parallel/rendezvous.h"

using namespace ts;
using namespace ts::parallel;

namespace {

int free_port() {
  net::Socket s = net::listen_tcp("127.0.0.1", 0);
  return net::bound_port(s);
}

DistInit node(int nnodes, int rank, int port, int timeout_ms) {
  DistInit d;
  d.nnodes = nnodes;
  d.node_rank = rank;
  d.addr = "127.0.0.1:" + std::to_string(port);
  d.timeout = std::chrono::milliseconds(timeout_ms);
  return d;
}

// Runs the nodes on threads; returns each node's result or error text.
struct Outcome {
  std::vector<std::string> blobs;
  std::string error;
};
std::vector<Outcome> run_nodes(const std::vector<DistInit>& ds) {
  std::vector<Outcome> out(ds.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < ds.size(); ++i)
    th.emplace_back([&, i] {
      try {
        out[i].blobs = rendezvous_all_gather(ds[i], "blob-of-" + std::to_string(ds[i].node_rank));
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    });
  for (auto& t : th) t.join();
  return out;
}

}  // namespace

TEST(Rendezvous, EveryNodeGetsEveryBlob) {
  const int port = free_port();
  auto out = run_nodes({node(3, 2, port, 20000), node(3, 0, port, 20000), node(3, 1, port, 20000)});
  for (auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.blobs, (std::vector<std::string>{"blob-of-0", "blob-of-1", "blob-of-2"}));
  }
  // One node: no network at all.
  DistInit one;
  EXPECT_EQ(rendezvous_all_gather(one, "x"), std::vector<std::string>{"x"});
}

TEST(Rendezvous, NodeZeroNamesTheNodesThatNeverCame) {
  const int port = free_port();
  auto out = run_nodes({node(3, 0, port, 400), node(3, 1, port, 5000)});
  EXPECT_NE(out[0].error.find("2 of 3 nodes joined"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("node rank(s) 2 never connected"), std::string::npos) << out[0].error;
  // Node 1 hears that node 0 gave up.
  EXPECT_NE(out[1].error.find("refused by node 0"), std::string::npos) << out[1].error;
}

TEST(Rendezvous, ANodeWithoutNodeZeroTimesOut) {
  const int port = free_port();
  auto out = run_nodes({node(2, 1, port, 300)});
  EXPECT_NE(out[0].error.find("could not connect to 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << out[0].error;
}

TEST(Rendezvous, DuplicateNodeRanksAndMismatchedNnodesAreRefused) {
  {
    const int port = free_port();
    auto out = run_nodes({node(3, 0, port, 5000), node(3, 1, port, 5000), node(3, 1, port, 5000)});
    EXPECT_NE(out[0].error.find("two nodes were started with --node-rank 1"), std::string::npos) << out[0].error;
  }
  {
    const int port = free_port();
    auto out = run_nodes({node(2, 0, port, 5000), node(3, 1, port, 5000)});
    EXPECT_NE(out[0].error.find("node 1 was started with --nnodes 3, node 0 with --nnodes 2"), std::string::npos)
        << out[0].error;
    EXPECT_NE(out[1].error.find("--nnodes 3"), std::string::npos) << out[1].error;
  }
}

TEST(Rendezvous, BadFlagsNameTheFlag) {
  DistInit d;
  d.nnodes = 2;
  try {
    check_dist_init(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dist-init-addr"), std::string::npos);
  }
  d.addr = "127.0.0.1:5000";
  d.node_rank = 2;
  EXPECT_THROW(check_dist_init(d), Error);
  d.node_rank = 1;
  EXPECT_NO_THROW(check_dist_init(d));
  EXPECT_THROW(net::parse_host_port("localhost", "--dist-init-addr"), Error);
  EXPECT_THROW(net::parse_host_port("localhost:99999", "--dist-init-addr"), Error);
  EXPECT_THROW(net::parse_host_port("a:b:1", "--dist-init-addr"), Error);
  net::HostPort v6 = net::parse_host_port("[::1]:29500", "--dist-init-addr");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 29500);
  EXPECT_EQ(v6.str(), "[::1]:29500");
  EXPECT_EQ(net::parse_host_port("node0.local:29500", "x").host, "node0.local");
}

TEST(Rendezvous, PortInUseIsAClearError) {
  net::Socket busy = net::listen_tcp("127.0.0.1", 0);
  const int port = net::bound_port(busy);
  auto out = run_nodes({node(2, 0, port, 500)});
  EXPECT_NE(out[0].error.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << out[0].error;
}
