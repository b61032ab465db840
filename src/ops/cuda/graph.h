// CUDA graph capture/replay on the backend's stream (plain C++ header: no CUDA includes).
// A failed capture throws ts::Error; callers fall back to eager execution.
#pragma once
#include <memory>

namespace ts::cuda {

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture();  // starts capturing stream()
  void end_capture();    // ends and instantiates; throws on failure
  void replay();         // launches on stream()
  bool valid() const { return exec_ != nullptr; }

 private:
  void* graph_ = nullptr;
  void* exec_ = nullptr;
};

// Test hook: the next `n` captures fail as if a kernel had been illegal during capture.
void inject_capture_failures(int n);

}  // namespace ts::cuda
