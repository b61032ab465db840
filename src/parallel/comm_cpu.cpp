// The CPU backend of Comm: ranks are threads (possibly of several processes), collectives are
// built from the transport's point-to-point messages (cpu_transport.h).
//
// Determinism: a reduction receives every rank's contribution (its own included) and sums them
// in rank order 0, 1, ..., n-1 — the same additions in the same order on every rank, so all
// ranks hold bit-identical results, independent of message timing, of which rank finished
// first and of the thread count. Bandwidth is n x the data (each rank sends its buffer to every
// rank): this backend is the tested reference for TP/EP layouts, not a fast path.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/cpu_transport.h"
#include "parallel/world.h"

namespace ts::parallel {

namespace {

size_t row_bytes(const Tensor& t) { return t.ndim == 0 || t.size(0) == 0 ? 0 : t.nbytes() / size_t(t.size(0)); }

// Stable per-group message tags: every member derives the same value from its parent's tag,
// the split count and the color, without communicating.
uint64_t mix_tag(uint64_t parent, uint64_t split, uint64_t color) {
  uint64_t z = parent * 0x9e3779b97f4a7c15ull + (split + 1) * 0xbf58476d1ce4e5b9ull + (color + 7) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  z *= 0xd6e8feb86659fd93ull;
  z ^= z >> 32;
  return z | 1;  // 0 is never a group tag
}

template <class T>
void add_into(T* acc, const T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += v[i];
}

class CpuComm final : public Comm {
 public:
  CpuComm(std::shared_ptr<CpuTransport> t, std::vector<int> members, int me, uint64_t tag)
      : t_(std::move(t)), members_(std::move(members)), tag_(tag) {
    rank_ = me;
    size_ = int(members_.size());
  }
  CommBackend backend() const override { return CommBackend::cpu; }

  void all_reduce(Tensor& x) override {
    check(x, "all_reduce");
    TS_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::i32 || x.dtype == DType::i64,
             "all_reduce: dtype {} not supported", dtype_name(x.dtype));
    const size_t bytes = x.nbytes();
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, x.data, bytes);
    // Contributions in rank order: the own one from a copy (x is the destination).
    own_.resize(bytes);
    if (bytes) std::memcpy(own_.data(), x.data, bytes);
    const int64_t n = x.numel();
    if (x.dtype == DType::bf16) {
      acc_f32_.assign(size_t(n), 0.0f);
      for (int p = 0; p < size_; ++p) {
        const uint16_t* v = reinterpret_cast<const uint16_t*>(contribution(p, bytes, "all_reduce"));
        for (int64_t i = 0; i < n; ++i) acc_f32_[size_t(i)] += bf16_to_f32(v[i]);
      }
      for (int64_t i = 0; i < n; ++i) x.ptr<uint16_t>()[i] = f32_to_bf16(acc_f32_[size_t(i)]);
      return;
    }
    acc_.resize(bytes);
    for (int p = 0; p < size_; ++p) {
      const char* v = contribution(p, bytes, "all_reduce");
      if (p == 0) {
        if (bytes) std::memcpy(acc_.data(), v, bytes);
        continue;
      }
      switch (x.dtype) {
        case DType::f32: add_into(reinterpret_cast<float*>(acc_.data()), reinterpret_cast<const float*>(v), n); break;
        case DType::i32: add_into(reinterpret_cast<int32_t*>(acc_.data()), reinterpret_cast<const int32_t*>(v), n); break;
        default: add_into(reinterpret_cast<int64_t*>(acc_.data()), reinterpret_cast<const int64_t*>(v), n); break;
      }
    }
    if (bytes) std::memcpy(x.data, acc_.data(), bytes);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather");
    check(out, "all_gather");
    TS_CHECK(in.dtype == out.dtype && out.numel() == int64_t(size_) * in.numel(), "all_gather: in {} out {} over {} ranks",
             in.shape_str(), out.shape_str(), size_);
    const size_t bytes = in.nbytes();
    char* o = static_cast<char*>(out.data);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, in.data, bytes);
    if (bytes) std::memmove(o + size_t(rank_) * bytes, in.data, bytes);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) recv(p, o + size_t(p) * bytes, bytes, "all_gather");
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    TS_CHECK(in.dtype == out.dtype && in.numel() == int64_t(size_) * out.numel() &&
                 (in.dtype == DType::f32 || in.dtype == DType::i32),
             "reduce_scatter: in {} out {} ({}) over {} ranks", in.shape_str(), out.shape_str(), dtype_name(in.dtype),
             size_);
    const size_t bytes = out.nbytes();
    const char* src = static_cast<const char*>(in.data);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, src + size_t(p) * bytes, bytes);
    own_.resize(bytes);
    if (bytes) std::memcpy(own_.data(), src + size_t(rank_) * bytes, bytes);
    acc_.resize(bytes);
    const int64_t n = out.numel();
    for (int p = 0; p < size_; ++p) {
      const char* v = contribution(p, bytes, "reduce_scatter");
      if (p == 0) {
        if (bytes) std::memcpy(acc_.data(), v, bytes);
      } else if (in.dtype == DType::f32) {
        add_into(reinterpret_cast<float*>(acc_.data()), reinterpret_cast<const float*>(v), n);
      } else {
        add_into(reinterpret_cast<int32_t*>(acc_.data()), reinterpret_cast<const int32_t*>(v), n);
      }
    }
    if (bytes) std::memcpy(out.data, acc_.data(), bytes);
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    check(in, "all_to_all");
    check(out, "all_to_all");
    TS_CHECK(in.dtype == out.dtype && in.numel() == out.numel() && in.numel() % size_ == 0,
             "all_to_all: in {} out {} over {} ranks", in.shape_str(), out.shape_str(), size_);
    const size_t bytes = in.nbytes() / size_t(size_);
    const char* src = static_cast<const char*>(in.data);
    char* dst = static_cast<char*>(out.data);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, src + size_t(p) * bytes, bytes);
    if (bytes) std::memmove(dst + size_t(rank_) * bytes, src + size_t(rank_) * bytes, bytes);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) recv(p, dst + size_t(p) * bytes, bytes, "all_to_all");
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor& out,
                    const std::vector<int64_t>& recv_rows) override {
    check(in, "all_to_all_v");
    check(out, "all_to_all_v");
    TS_CHECK(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_, "all_to_all_v: {} / {} counts for {} ranks",
             send_rows.size(), recv_rows.size(), size_);
    const size_t rb = in.size(0) ? row_bytes(in) : row_bytes(out);
    TS_CHECK(in.dtype == out.dtype && (in.size(0) == 0 || out.size(0) == 0 || row_bytes(in) == row_bytes(out)),
             "all_to_all_v: in {} and out {} rows differ", in.shape_str(), out.shape_str());
    int64_t st = 0, rt = 0;
    for (int p = 0; p < size_; ++p) {
      TS_CHECK(send_rows[size_t(p)] >= 0 && recv_rows[size_t(p)] >= 0, "all_to_all_v: negative count for rank {}", p);
      st += send_rows[size_t(p)];
      rt += recv_rows[size_t(p)];
    }
    TS_CHECK(st <= in.size(0) && rt <= out.size(0), "all_to_all_v: {} rows to send from {}, {} to receive into {}", st,
             in.shape_str(), rt, out.shape_str());
    const char* src = static_cast<const char*>(in.data);
    char* dst = static_cast<char*>(out.data);
    // Every pair exchanges a message, empty ones too: a count mismatch is then a size error
    // at the receiver instead of a hang.
    int64_t so = 0;
    for (int p = 0; p < size_; ++p) {
      const size_t b = size_t(send_rows[size_t(p)]) * rb;
      if (p == rank_) {
        own_.resize(b);
        if (b) std::memcpy(own_.data(), src + size_t(so) * rb, b);
        TS_CHECK(send_rows[size_t(p)] == recv_rows[size_t(p)], "all_to_all_v: rank {} sends itself {} rows but expects {}",
                 rank_, send_rows[size_t(p)], recv_rows[size_t(p)]);
      } else {
        send(p, src + size_t(so) * rb, b);
      }
      so += send_rows[size_t(p)];
    }
    int64_t ro = 0;
    for (int p = 0; p < size_; ++p) {
      const size_t b = size_t(recv_rows[size_t(p)]) * rb;
      if (p == rank_) {
        if (b) std::memcpy(dst + size_t(ro) * rb, own_.data(), b);
      } else {
        recv(p, dst + size_t(ro) * rb, b, "all_to_all_v");
      }
      ro += recv_rows[size_t(p)];
    }
  }

  void all_gather_v(const Tensor& in, const std::vector<int64_t>& rows, Tensor& out) override {
    check(in, "all_gather_v");
    check(out, "all_gather_v");
    TS_CHECK(int(rows.size()) == size_, "all_gather_v: {} counts for {} ranks", rows.size(), size_);
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const size_t rb = out.size(0) ? row_bytes(out) : row_bytes(in);
    TS_CHECK(in.dtype == out.dtype && in.size(0) >= rows[size_t(rank_)] && out.size(0) >= total &&
                 (in.size(0) == 0 || out.size(0) == 0 || row_bytes(in) == row_bytes(out)),
             "all_gather_v: in {} out {} ({} rows in all, {} from rank {})", in.shape_str(), out.shape_str(), total,
             rows[size_t(rank_)], rank_);
    const size_t mine = size_t(rows[size_t(rank_)]) * rb;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, in.data, mine);
    char* dst = static_cast<char*>(out.data);
    int64_t off = 0;
    for (int p = 0; p < size_; ++p) {
      const size_t b = size_t(rows[size_t(p)]) * rb;
      if (p == rank_) {
        if (b) std::memmove(dst + size_t(off) * rb, in.data, b);
      } else {
        recv(p, dst + size_t(off) * rb, b, "all_gather_v");
      }
      off += rows[size_t(p)];
    }
  }

  void broadcast(Tensor& x, int root) override {
    check(x, "broadcast");
    TS_CHECK(root >= 0 && root < size_, "broadcast: root {} outside 0..{}", root, size_ - 1);
    if (rank_ == root) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) send(p, x.data, x.nbytes());
    } else {
      recv(root, x.data, x.nbytes(), "broadcast");
    }
  }

  void barrier() override {
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(p, nullptr, 0);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) recv(p, nullptr, 0, "barrier");
  }

  std::shared_ptr<Comm> split(int color, int key) override {
    // Everyone's (color, key), then the members of my color ordered by (key, rank).
    int32_t mine[2] = {color, key};
    std::vector<int32_t> all(size_t(2 * size_));
    Tensor a = Tensor::from_blob(mine, {2}, DType::i32, Device::cpu);
    Tensor b = Tensor::from_blob(all.data(), {int64_t(all.size())}, DType::i32, Device::cpu);
    all_gather(a, b);
    const uint64_t n = splits_++;
    if (color < 0) return nullptr;
    std::vector<int> idx;
    for (int p = 0; p < size_; ++p)
      if (all[size_t(2 * p)] == color) idx.push_back(p);
    std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return all[size_t(2 * x + 1)] < all[size_t(2 * y + 1)]; });
    std::vector<int> members;
    int me = -1;
    for (int p : idx) {
      if (p == rank_) me = int(members.size());
      members.push_back(members_[size_t(p)]);
    }
    return std::make_shared<CpuComm>(t_, std::move(members), me, mix_tag(tag_, n, uint64_t(uint32_t(color))));
  }

 private:
  static void check(const Tensor& t, const char* what) {
    TS_CHECK(t.device == Device::cpu && t.is_contiguous(), "{}: the cpu backend needs contiguous host tensors ({} on {})",
             what, t.shape_str(), device_name(t.device));
  }
  void send(int p, const void* data, size_t bytes) {
    t_->send(members_[size_t(rank_)], members_[size_t(p)], tag_, data, bytes);
  }
  void recv(int p, void* data, size_t bytes, const char* what) {
    t_->recv(members_[size_t(rank_)], members_[size_t(p)], tag_, data, bytes, what);
  }
  // Rank p's contribution to a reduction (the own copy, or received into scratch).
  const char* contribution(int p, size_t bytes, const char* what) {
    if (p == rank_) return own_.data();
    peer_.resize(bytes);
    recv(p, peer_.data(), bytes, what);
    return peer_.data();
  }

  std::shared_ptr<CpuTransport> t_;
  std::vector<int> members_;  // global transport ranks, index = rank in this group
  uint64_t tag_;
  uint64_t splits_ = 0;
  std::vector<char> own_, peer_, acc_;  // reused scratch
  std::vector<float> acc_f32_;
};

}  // namespace

std::vector<std::shared_ptr<Comm>> make_cpu_comms(int n) {
  TS_CHECK(n >= 1, "cpu world of {} ranks", n);
  return make_cpu_comms(CpuTransport::local(n));
}

std::vector<std::shared_ptr<Comm>> make_cpu_comms(const std::shared_ptr<CpuTransport>& t) {
  std::vector<int> members(size_t(t->world()));
  for (int r = 0; r < t->world(); ++r) members[size_t(r)] = r;
  std::vector<std::shared_ptr<Comm>> out;
  for (int i = 0; i < t->local_count(); ++i)
    out.push_back(std::make_shared<CpuComm>(t, members, t->first_local() + i, uint64_t(1)));
  return out;
}

}  // namespace ts::parallel
