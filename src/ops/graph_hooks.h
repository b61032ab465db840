// Breakable CUDA graphs (prefill): the forward is captured as segments separated by "break"
// ops — the ones that read per-batch attention metadata (attention, KV-cache writes) — which
// run eagerly between segment replays. While hooks are installed on this thread, the op
// dispatcher asks them what to do:
//  - capture: a break op ends the current segment's capture, runs, then capture resumes;
//  - replay: ordinary ops are skipped (their work is in the segment graphs); a break op first
//    replays the segment that precedes it, then runs eagerly.
// segment_begin()/segment_end() bound the captured region (the embedding before and the LM head
// after stay eager, as their shapes depend on the batch).
#pragma once

namespace ts::ops {

class GraphHooks {
 public:
  virtual ~GraphHooks() = default;
  virtual bool in_segment() const = 0;  // between segment_begin and segment_end
  virtual bool skip_ops() const = 0;    // replay inside a segment
  virtual void before_break() = 0;
  virtual void after_break() = 0;
  virtual void segment_begin() = 0;
  virtual void segment_end() = 0;
};

GraphHooks*& graph_hooks();  // thread-local; null = plain eager execution

// Called by model code around the captured region; no-ops without hooks.
inline void graph_segment_begin() {
  if (auto* h = graph_hooks()) h->segment_begin();
}
inline void graph_segment_end() {
  if (auto* h = graph_hooks()) h->segment_end();
}

}  // namespace ts::ops
