// SlotPool: a fixed set of row indices handed out as shared handles. A row goes back to the
// pool when its last handle is dropped, even after the pool itself is gone (the free list is
// shared with the handles). Engine-thread only, like the requests that hold the handles.
#pragma once
#include <memory>
#include <vector>

#include "core/error.h"

namespace ts {

class SlotPool {
 public:
  explicit SlotPool(int rows = 0) : free_(std::make_shared<std::vector<int>>()) {
    for (int i = rows - 1; i >= 0; --i) free_->push_back(i);
    rows_ = rows;
  }
  int size() const { return rows_; }
  int available() const { return int(free_->size()); }
  // Takes a free row; throws when every row is held.
  std::shared_ptr<const int> take() {
    TS_CHECK(!free_->empty(), "state slot pool exhausted ({} rows, all held)", rows_);
    int row = free_->back();
    free_->pop_back();
    std::shared_ptr<std::vector<int>> back = free_;
    return std::shared_ptr<const int>(new int(row), [back](const int* p) {
      back->push_back(*p);
      delete p;
    });
  }

 private:
  std::shared_ptr<std::vector<int>> free_;
  int rows_ = 0;
};

}  // namespace ts
