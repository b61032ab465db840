#include "ops/cuda/common.cuh"
#include "ops/cuda/graph.h"

namespace ts::cuda {

static int g_inject_failures = 0;
void inject_capture_failures(int n) { g_inject_failures = n; }

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::begin_capture() {
  // Relaxed: host-side calls that are not stream work (cudaMalloc of a first-time buffer,
  // cuBLASLt's heuristics) are allowed while capturing.
  TS_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
}

void Graph::end_capture() {
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream(), &g);
  if (e == cudaSuccess && g_inject_failures > 0) {
    --g_inject_failures;
    cudaGraphDestroy(g);
    fail("CUDA graph capture failed (injected for a test)");
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    fail("CUDA graph capture failed: {}", cudaGetErrorString(e));
  }
  cudaGraphExec_t x = nullptr;
  e = cudaGraphInstantiateWithFlags(&x, g, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(g);
    fail("CUDA graph instantiation failed: {}", cudaGetErrorString(e));
  }
  // Upload the executable now: otherwise its first launch pays it (about a millisecond for a
  // model-sized graph), inside whatever step first uses the bucket.
  TS_CUDA_CHECK(cudaGraphUpload(x, stream()));
  graph_ = g;
  exec_ = x;
}

void Graph::replay() { TS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream())); }

}  // namespace ts::cuda
