// UTF-8 decoding and encoding, the L/N/White_Space categories and NFC for the tokenizer
// (declared in unicode.h), over the tables of unicode_tables.inc.
#include "unicode.h"

#include <algorithm>
#include <unordered_map>

namespace kf::policy::unicode {
namespace {

struct CpRange {
  uint32_t lo, hi;
};
struct CpValue {
  uint32_t cp;
  uint8_t value;
};
struct DecompEntry {
  uint32_t cp;
  uint32_t offset;
  uint32_t length;
};
struct CompEntry {
  uint32_t a, b, c;
};
#include "unicode_tables.inc"

template <std::size_t N>
bool in_ranges(const CpRange (&table)[N], uint32_t cp) {
  auto it =
      std::upper_bound(std::begin(table), std::end(table), cp, [](uint32_t v, const CpRange& r) { return v < r.lo; });
  return it != std::begin(table) && cp <= (it - 1)->hi;
}

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](const CpValue& e, uint32_t v) { return e.cp < v; });
  return (it != std::end(kCombiningClass) && it->cp == cp) ? it->value : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                             [](const DecompEntry& e, uint32_t v) { return e.cp < v; });
  if (it != std::end(kDecomp) && it->cp == cp) {
    out.insert(out.end(), kDecompData + it->offset, kDecompData + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// Returns the primary composite of (a, b), or 0 when there is none.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::make_pair(a, b),
                             [](const CompEntry& e, const std::pair<uint32_t, uint32_t>& v) {
                               return e.a < v.first || (e.a == v.first && e.b < v.second);
                             });
  return (it != std::end(kCompose) && it->a == a && it->b == b) ? it->c : 0;
}

}  // namespace

std::vector<uint32_t> utf8_decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    uint32_t cp = 0;
    std::size_t len = 0;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07;
      len = 4;
    }
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80)
        ok = false;
      else
        cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and out-of-range values, as Rust's from_utf8 does.
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok && (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      i += 1;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
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

std::string utf8_encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) utf8_append(out, cp);
  return out;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetter, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumber, cp);
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string nfc(const std::string& s) {
  // Fast path: text below U+0300 is already in NFC (nothing there decomposes or composes).
  bool simple = true;
  for (unsigned char c : s)
    if (c >= 0xCC) {
      simple = false;
      break;
    }  // lead bytes >= 0xCC start code points >= U+0300
  if (simple) return s;
  const std::vector<uint32_t> in = utf8_decode(s);
  std::vector<uint32_t> d;
  d.reserve(in.size() + 8);
  for (uint32_t cp : in) decompose(cp, d);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (std::size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition. The input is canonically ordered, so the last mark appended
  // after the starter has the highest class seen: C is blocked iff that class >= ccc(C).
  std::vector<uint32_t> out;
  out.reserve(d.size());
  std::ptrdiff_t starter = -1;
  int last_cc = 0;
  for (uint32_t cp : d) {
    const int cc = combining_class(cp);
    if (starter >= 0) {
      const bool adjacent = static_cast<std::size_t>(starter) + 1 == out.size();
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (const uint32_t c = compose_pair(out[starter], cp)) {
          out[starter] = c;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    last_cc = cc;
    out.push_back(cp);
  }
  return utf8_encode(out);
}

}  // namespace kf::policy::unicode
