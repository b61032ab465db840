#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace ts::tok::unicode {
namespace {

struct CccRange {
  uint32_t lo, hi, value;
};
struct Decomp {
  uint32_t cp, off, len;
};
struct Compose {
  uint32_t a, b, c;
};
#include "tokenizer/unicode_data.inc"

template <size_t N>
uint32_t range_lookup(const CccRange (&t)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(t), std::end(t), cp, [](uint32_t v, const CccRange& r) { return v < r.lo; });
  if (it == std::begin(t)) return 0;
  --it;
  return cp <= it->hi ? it->value : 0;
}

template <size_t N>
const Decomp* decomp_lookup(const Decomp (&t)[N], uint32_t cp) {
  auto it = std::lower_bound(std::begin(t), std::end(t), cp, [](const Decomp& d, uint32_t v) { return d.cp < v; });
  return it != std::end(t) && it->cp == cp ? it : nullptr;
}

constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr uint32_t LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;

uint32_t ccc(uint32_t cp) { return cp < 0x300 || cp == kInvalid ? 0 : range_lookup(kCcc, cp); }

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
    return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
  if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase && b < TBase + TCount)
    return a + (b - TBase);
  auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::pair{a, b},
                             [](const Compose& c, std::pair<uint32_t, uint32_t> k) {
                               return c.a < k.first || (c.a == k.first && c.b < k.second);
                             });
  return it != std::end(kCompose) && it->a == a && it->b == b ? it->c : kInvalid;
}

// Code points, with invalid input bytes kept as (kInvalid, byte) so they survive unchanged.
struct Unit {
  uint32_t cp;
  uint8_t raw;
};

}  // namespace

uint32_t decode(std::string_view s, size_t i, size_t& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char b = p[i];
  len = 1;
  if (b < 0x80) return b;
  size_t need;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // valid range of the first continuation byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1, cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2, cp = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3, cp = b & 0x07;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return kInvalid;
  }
  if (i + need >= n) return kInvalid;
  for (size_t k = 1; k <= need; ++k) {
    unsigned char c = p[i + k];
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return kInvalid;
    cp = (cp << 6) | (c & 0x3F);
  }
  len = need + 1;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t valid_prefix(std::string_view s) {
  size_t i = 0, len;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    if (decode(s, i, len) == kInvalid) break;
    i += len;
  }
  return i;
}

std::string to_valid_lossy(std::string_view s) {
  size_t ok = valid_prefix(s);
  if (ok == s.size()) return std::string(s);
  std::string out(s.substr(0, ok));
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = ok, n = s.size();
  while (i < n) {
    size_t len;
    uint32_t cp = decode(s, i, len);
    if (cp != kInvalid) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    // One U+FFFD per maximal subpart: a lead byte plus the continuation bytes that were still
    // valid for it (e.g. a truncated 3-byte sequence is one replacement, not two).
    unsigned char b = p[i];
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t j = i + 1;
    for (size_t k = 1; k <= need && j < n; ++k, ++j) {
      unsigned char c = p[j];
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_nonspacing_mark(uint32_t cp) { return cp >= 0x300 && cp != kInvalid && range_lookup(kNonspacingMark, cp) != 0; }

namespace {

void decompose_into(uint32_t cp, bool compat, std::vector<Unit>& out) {
  if (cp >= SBase && cp < SBase + SCount) {
    uint32_t s = cp - SBase;
    out.push_back({LBase + s / NCount, 0});
    out.push_back({VBase + (s % NCount) / TCount, 0});
    if (s % TCount) out.push_back({TBase + s % TCount, 0});
    return;
  }
  if (cp >= 0xA0) {
    const Decomp* d = compat ? decomp_lookup(kCompatDecomp, cp) : decomp_lookup(kCanonDecomp, cp);
    if (d) {
      for (uint32_t k = 0; k < d->len; ++k) out.push_back({kDecompPool[d->off + k], 0});
      return;
    }
  }
  out.push_back({cp, 0});
}

}  // namespace

std::string normalize(std::string_view s, Form form) {
  bool compat = form == Form::NFKC || form == Form::NFKD;
  bool compose = form == Form::NFC || form == Form::NFKC;
  // ASCII is invariant under every form. Under NFC so is all text below U+0300 (no byte
  // >= 0xCC): those characters are all starters and none of them composes with another.
  const unsigned char first_unsafe = form == Form::NFC ? 0xCC : 0x80;
  bool quick = std::all_of(s.begin(), s.end(), [&](char c) { return static_cast<unsigned char>(c) < first_unsafe; });
  if (quick) return std::string(s);

  std::vector<Unit> u;
  u.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = decode(s, i, len);
    if (cp == kInvalid) u.push_back({kInvalid, static_cast<uint8_t>(s[i])});
    else decompose_into(cp, compat, u);
    i += len;
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < u.size();) {
    if (ccc(u[i].cp) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < u.size() && ccc(u[j].cp) != 0) ++j;
    std::stable_sort(u.begin() + i, u.begin() + j, [](const Unit& a, const Unit& b) { return ccc(a.cp) < ccc(b.cp); });
    i = j;
  }
  if (compose && !u.empty()) {
    size_t starter = 0, out = 1;
    uint32_t last = ccc(u[0].cp);
    if (last != 0 || u[0].cp == kInvalid) last = 256;  // nothing composes onto a leading non-starter
    for (size_t i = 1; i < u.size(); ++i) {
      uint32_t cp = u[i].cp, c = ccc(cp);
      if (cp != kInvalid && u[starter].cp != kInvalid && (last < c || last == 0)) {
        uint32_t comp = compose_pair(u[starter].cp, cp);
        if (comp != kInvalid) {
          u[starter].cp = comp;
          continue;
        }
      }
      if (c == 0) starter = out;
      last = cp == kInvalid ? 256 : c;
      u[out++] = u[i];
    }
    u.resize(out);
  }
  std::string r;
  r.reserve(s.size() + 8);
  for (const Unit& x : u) {
    if (x.cp == kInvalid) r.push_back(static_cast<char>(x.raw));
    else append_utf8(r, x.cp);
  }
  return r;
}

std::string lowercase(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      r.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp = decode(s, i, len);
    const Decomp* d = cp == kInvalid ? nullptr : decomp_lookup(kLower, cp);
    if (d) {
      for (uint32_t k = 0; k < d->len; ++k) append_utf8(r, kLowerPool[d->off + k]);
    } else {
      r.append(s.data() + i, len);
    }
    i += len;
  }
  return r;
}

}  // namespace ts::tok::unicode
