// The PDL switch is a caller-owned, per-thread launch config (core/cuda/runtime.h), not a
// process-wide global: a scope restores the previous value, and other threads are not steered.
#include <gtest/gtest.h>

#include <thread>

#include "core/cuda/runtime.h"

using namespace ts;

TEST(LaunchConfig, ScopedPerThreadNotGlobal) {
  EXPECT_TRUE(cuda::launch_config().pdl);  // on by default
  {
    cuda::ScopedLaunchConfig off({.pdl = false});
    EXPECT_FALSE(cuda::launch_config().pdl);
    bool other = false;
    std::thread t([&] { other = cuda::launch_config().pdl; });
    t.join();
    EXPECT_TRUE(other) << "another thread (another engine) must not see this thread's setting";
    {
      cuda::ScopedLaunchConfig on({.pdl = true});
      EXPECT_TRUE(cuda::launch_config().pdl);
    }
    EXPECT_FALSE(cuda::launch_config().pdl);
  }
  EXPECT_TRUE(cuda::launch_config().pdl);
}
