#include "fl/secagg/shamir.h"

#include <array>

#include "fl/core/str_cat.h"

namespace fl::secagg {
namespace {

// The Lagrange basis at point `at` for the coordinates xs: l_i(at) = prod_{j != i} (at - x_j) / (x_i - x_j);
// in characteristic 2, minus is xor.
std::vector<uint8_t> LagrangeAt(std::span<const Share> shares, uint32_t count, uint8_t at) {
  std::vector<uint8_t> basis(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t num = 1;
    uint8_t den = 1;
    for (uint32_t j = 0; j < count; ++j) {
      if (j == i) continue;
      num = GfMul(num, static_cast<uint8_t>(at ^ shares[j].x));
      den = GfMul(den, static_cast<uint8_t>(shares[i].x ^ shares[j].x));
    }
    basis[i] = GfMul(num, GfInv(den));
  }
  return basis;
}

}  // namespace

uint8_t GfMul(uint8_t a, uint8_t b) {
  uint8_t product = 0;
  for (int bit = 0; bit < 8; ++bit) {
    // Masks instead of branches: -(b & 1) is 0xff when the bit is set.
    product ^= static_cast<uint8_t>(a & static_cast<uint8_t>(-(b & 1)));
    const uint8_t carry = static_cast<uint8_t>(-(a >> 7));
    a = static_cast<uint8_t>((a << 1) ^ (carry & 0x1b));
    b >>= 1;
  }
  return product;
}

uint8_t GfInv(uint8_t a) {
  // a^254 = a^-1 in GF(2^8) (the multiplicative group has order 255); square-and-multiply over 254's bits.
  uint8_t result = 1;
  uint8_t power = a;
  for (int e = 254; e > 0; e >>= 1) {
    if (e & 1) result = GfMul(result, power);  // the exponent is public: branching on it leaks nothing
    power = GfMul(power, power);
  }
  return result;
}

absl::StatusOr<std::vector<Share>> ShamirSplit(std::span<const uint8_t> secret, uint32_t threshold,
                                               std::span<const uint8_t> xs, const RandomFill& random) {
  if (threshold == 0 || threshold > xs.size()) {
    return absl::InvalidArgumentError(fl::StrCat("Shamir threshold ", threshold, " must be in [1, ", xs.size(),
                                                 "] (the number of holders); lower it or add holders"));
  }
  std::array<bool, 256> seen{};
  for (uint8_t x : xs) {
    if (x == 0 || seen[x]) {
      return absl::InvalidArgumentError(fl::StrCat("Shamir holder coordinate ", static_cast<int>(x),
                                                   " is 0 or repeated; holders need distinct coordinates 1..255"));
    }
    seen[x] = true;
  }
  std::vector<Share> shares(xs.size());
  for (size_t h = 0; h < xs.size(); ++h) {
    shares[h].x = xs[h];
    shares[h].y.resize(secret.size());
  }
  std::vector<uint8_t> coefficients(threshold);
  for (size_t byte = 0; byte < secret.size(); ++byte) {
    coefficients[0] = secret[byte];
    if (threshold > 1) random(std::span<uint8_t>(coefficients).subspan(1));
    for (size_t h = 0; h < xs.size(); ++h) {
      uint8_t value = 0;  // Horner, highest coefficient first
      for (uint32_t c = threshold; c-- > 0;) value = static_cast<uint8_t>(GfMul(value, xs[h]) ^ coefficients[c]);
      shares[h].y[byte] = value;
    }
  }
  coefficients.assign(coefficients.size(), 0);
  return shares;
}

absl::StatusOr<std::vector<uint8_t>> ShamirCombine(std::span<const Share> shares, uint32_t threshold) {
  if (threshold == 0 || shares.size() < threshold) {
    return absl::FailedPreconditionError(
        fl::StrCat("Shamir reconstruction needs ", threshold, " shares, has ", shares.size()));
  }
  std::array<bool, 256> seen{};
  const size_t length = shares[0].y.size();
  for (const Share& s : shares) {
    if (s.x == 0 || seen[s.x]) {
      return absl::InvalidArgumentError(
          fl::StrCat("Shamir share coordinate ", static_cast<int>(s.x), " is 0 or repeated"));
    }
    seen[s.x] = true;
    if (s.y.size() != length) {
      return absl::InvalidArgumentError(fl::StrCat("Shamir share of coordinate ", static_cast<int>(s.x), " has ",
                                                   s.y.size(), " bytes, the first has ", length));
    }
  }
  const std::vector<uint8_t> at_zero = LagrangeAt(shares, threshold, 0);
  std::vector<uint8_t> secret(length, 0);
  for (uint32_t i = 0; i < threshold; ++i) {
    for (size_t byte = 0; byte < length; ++byte) secret[byte] ^= GfMul(at_zero[i], shares[i].y[byte]);
  }
  for (size_t extra = threshold; extra < shares.size(); ++extra) {
    const std::vector<uint8_t> at_x = LagrangeAt(shares, threshold, shares[extra].x);
    for (size_t byte = 0; byte < length; ++byte) {
      uint8_t value = 0;
      for (uint32_t i = 0; i < threshold; ++i) value ^= GfMul(at_x[i], shares[i].y[byte]);
      if (value != shares[extra].y[byte]) {
        return absl::DataLossError(fl::StrCat("Shamir share of coordinate ", static_cast<int>(shares[extra].x),
                                              " is inconsistent with the first ", threshold,
                                              " shares: a share was altered"));
      }
    }
  }
  return secret;
}

}  // namespace fl::secagg
