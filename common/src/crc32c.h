// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) and the TFRecord "masked" form
// of it. Internal to kf_common: the TensorBoard event writer (metrics.cpp) frames every
// record with these, and the common tests check them against known vectors.
// Pure functions; any thread.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kf::detail {

// CRC32C of `n` bytes, continuing from `crc` (0 for a fresh checksum), so a checksum can
// be computed over pieces: crc32c(b, nb, crc32c(a, na)) == crc32c(a+b).
uint32_t crc32c(const void* data, std::size_t n, uint32_t crc = 0);

// TFRecord masks stored checksums, because a CRC over data that itself embeds CRCs is
// weak: rotate right by 15 bits, then add a constant.
inline uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace kf::detail
