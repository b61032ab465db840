// Device dispatch of the expert-parallel ops (ops/moe_dispatch.h), as ops.cpp does for the rest:
// the first tensor's device picks the backend; ordinary ops are skipped while a breakable graph
// replays (their work is in a segment graph).
#include "ops/moe_dispatch.h"

#include "core/error.h"
#include "ops/graph_hooks.h"
#include "ops/op_profile.h"

#if defined(TS_WITH_CUDA)
#define TS_EP_DISPATCH(dev, fn, ...)                                     \
  do {                                                                   \
    if ((dev) == Device::cuda) {                                         \
      if (GraphHooks* h_ = graph_hooks(); h_ && h_->skip_ops()) return;  \
      OpProfileScope prof_([] { return std::string(#fn); });             \
      ::ts::ops::cuda::fn(__VA_ARGS__);                                  \
      return;                                                            \
    }                                                                    \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                              \
  } while (0)
#else
#define TS_EP_DISPATCH(dev, fn, ...)                                                \
  do {                                                                              \
    TS_CHECK((dev) == Device::cpu, "op " #fn ": no CUDA backend in this build");     \
    return ::ts::ops::cpu::fn(__VA_ARGS__);                                         \
  } while (0)
#endif

namespace ts::ops {

void ep_plan(const Tensor& ids, int64_t experts, int ranks, Tensor& counts, Tensor& row_pos, Tensor& slot_pos,
             Tensor& row_token) {
  TS_EP_DISPATCH(ids.device, ep_plan, ids, experts, ranks, counts, row_pos, slot_pos, row_token);
}
void ep_pack(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& row_token, const Tensor& counts,
             int64_t experts, Tensor& send_x, Tensor& send_ids, Tensor& send_w) {
  TS_EP_DISPATCH(x.device, ep_pack, x, ids, weights, row_token, counts, experts, send_x, send_ids, send_w);
}
void ep_expand(const Tensor& ids, Tensor& exp_row, Tensor& exp_id, Tensor& exp_w, Tensor& exp_pos) {
  TS_EP_DISPATCH(ids.device, ep_expand, ids, exp_row, exp_id, exp_w, exp_pos);
}
void ep_fold(const Tensor& y, const Tensor& pos, const Tensor* weights, Tensor& out) {
  TS_EP_DISPATCH(pos.device, ep_fold, y, pos, weights, out);
}
void ep_local_ids(const Tensor& ids, int64_t e0, int64_t n, Tensor& local) {
  TS_EP_DISPATCH(ids.device, ep_local_ids, ids, e0, n, local);
}

}  // namespace ts::ops
