#include "fl/secagg/crypto.h"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/secagg/events.h"

namespace fl::secagg {
namespace {

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The keystream is generated in pieces of this many words, so that masking a chunk of any size needs a
// bounded scratch buffer (16 KiB) and no allocation proportional to the model.
constexpr size_t kPieceWords = 4096;
constexpr size_t kBlockWords = 16;  // a ChaCha20 block is 64 bytes

}  // namespace

void EnsureSodium() {
  // sodium_init is idempotent and thread-safe; -1 means the library cannot work at all.
  if (sodium_init() < 0) std::abort();
}

RandomSource RandomSource::System() {
  EnsureSodium();
  return RandomSource();
}

RandomSource RandomSource::SeededForTests(uint64_t seed) {
  EnsureSodium();
  RandomSource r;
  Key k{};
  for (int i = 0; i < 8; ++i) k[i] = static_cast<uint8_t>(seed >> (8 * i));
  r.seed_ = k;
  return r;
}

void RandomSource::Fill(std::span<uint8_t> out) {
  if (!seed_.has_value()) {
    randombytes_buf(out.data(), out.size());
    return;
  }
  std::string input(seed_->begin(), seed_->end());
  PutU64(input, counter_++);
  Key call_seed{};
  crypto_generichash(call_seed.data(), call_seed.size(), reinterpret_cast<const uint8_t*>(input.data()), input.size(),
                     nullptr, 0);
  randombytes_buf_deterministic(out.data(), out.size(), call_seed.data());
}

RandomFill RandomSource::AsFill() {
  return [this](std::span<uint8_t> out) { Fill(out); };
}

KeyPair NewKeyPair(RandomSource& random) {
  KeyPair pair;
  random.Fill(pair.secret_key);
  crypto_scalarmult_base(pair.public_key.data(), pair.secret_key.data());
  return pair;
}

Key PublicKeyOf(const Key& secret_key) {
  EnsureSodium();
  Key pk{};
  crypto_scalarmult_base(pk.data(), secret_key.data());
  return pk;
}

absl::StatusOr<Key> AgreeKey(KeyPurpose purpose, const Key& own_secret, const Key& own_public, const Key& peer_public) {
  EnsureSodium();
  Key point{};
  if (crypto_scalarmult(point.data(), own_secret.data(), peer_public.data()) != 0) {
    return Refusal(SecurityEventKind::kBadKey, absl::StatusCode::kInvalidArgument,
                   "a peer's X25519 public key is of low order (no shared secret); the peer must send a real key");
  }
  const std::string_view label = purpose == KeyPurpose::kMask ? "fl-secagg-v1 mask" : "fl-secagg-v1 share";
  const bool own_first =
      std::lexicographical_compare(own_public.begin(), own_public.end(), peer_public.begin(), peer_public.end());
  const Key& lo = own_first ? own_public : peer_public;
  const Key& hi = own_first ? peer_public : own_public;
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, kKeyBytes);
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  crypto_generichash_update(&state, point.data(), point.size());
  crypto_generichash_update(&state, lo.data(), lo.size());
  crypto_generichash_update(&state, hi.data(), hi.size());
  Key key{};
  crypto_generichash_final(&state, key.data(), key.size());
  sodium_memzero(point.data(), point.size());
  return key;
}

Key RoundMaskKey(const Key& secret, uint64_t round) {
  std::string input = "fl-secagg-v1 round";
  PutU64(input, round);
  Key key{};
  crypto_generichash(key.data(), key.size(), reinterpret_cast<const uint8_t*>(input.data()), input.size(),
                     secret.data(), secret.size());
  return key;
}

void ApplyMask(const Key& key, int sign, uint64_t offset, std::span<uint32_t> words) {
  const SignedKey one{key, sign};
  ApplyMasks(std::span<const SignedKey>(&one, 1), offset, words);
}

void ApplyMasks(std::span<const SignedKey> keys, uint64_t offset, std::span<uint32_t> words) {
  static_assert(std::endian::native == std::endian::little, "the mask words are the keystream's little-endian words");
  // The nonce is constant: every key is used for one stream only (a pair and a round, or one self-mask seed).
  const std::array<uint8_t, crypto_stream_chacha20_ietf_NONCEBYTES> nonce{};
  // The keystream is the encryption of zeros; a constant zero input spares a memset per piece.
  static const std::array<uint32_t, kPieceWords + kBlockWords> kZeros{};
  std::array<uint32_t, kPieceWords + kBlockWords> stream;
  size_t done = 0;
  while (done < words.size()) {
    const uint64_t position = offset + done;
    const uint64_t block = position / kBlockWords;
    const size_t skip = static_cast<size_t>(position % kBlockWords);
    const size_t count = std::min(kPieceWords, words.size() - done);
    const size_t bytes = (skip + count + kBlockWords - 1) / kBlockWords * kBlockWords * sizeof(uint32_t);
    uint32_t* out = words.data() + done;
    for (const SignedKey& k : keys) {
      crypto_stream_chacha20_ietf_xor_ic(reinterpret_cast<uint8_t*>(stream.data()),
                                         reinterpret_cast<const uint8_t*>(kZeros.data()), bytes, nonce.data(),
                                         static_cast<uint32_t>(block), k.key.data());
      const uint32_t* mask = stream.data() + skip;
      if (k.sign > 0) {
        for (size_t i = 0; i < count; ++i) out[i] += mask[i];
      } else {
        for (size_t i = 0; i < count; ++i) out[i] -= mask[i];
      }
    }
    done += count;
  }
  sodium_memzero(stream.data(), sizeof(stream));
}

std::string ShareAssociatedData(uint64_t round, uint64_t sender, uint64_t receiver) {
  std::string ad = "fl-secagg-v1 share";
  PutU64(ad, round);
  PutU64(ad, sender);
  PutU64(ad, receiver);
  return ad;
}

std::pair<std::string, std::string> Seal(const Key& key, std::string_view associated_data,
                                         std::span<const uint8_t> plaintext, RandomSource& random) {
  std::string nonce(kNonceBytes, '\0');
  random.Fill(std::span<uint8_t>(reinterpret_cast<uint8_t*>(nonce.data()), nonce.size()));
  std::string ciphertext(plaintext.size() + kTagBytes, '\0');
  unsigned long long length = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(reinterpret_cast<uint8_t*>(ciphertext.data()), &length, plaintext.data(),
                                             plaintext.size(), reinterpret_cast<const uint8_t*>(associated_data.data()),
                                             associated_data.size(), nullptr,
                                             reinterpret_cast<const uint8_t*>(nonce.data()), key.data());
  ciphertext.resize(length);
  return {nonce, ciphertext};
}

absl::StatusOr<std::string> Open(const Key& key, std::string_view associated_data, std::string_view nonce,
                                 std::string_view ciphertext) {
  if (nonce.size() != kNonceBytes || ciphertext.size() < kTagBytes) {
    return Refusal(
        SecurityEventKind::kWrongLength, absl::StatusCode::kInvalidArgument,
        fl::StrCat("an encrypted share has a ", nonce.size(), "-byte nonce and a ", ciphertext.size(),
                   "-byte ciphertext; expected a ", kNonceBytes, "-byte nonce and at least ", kTagBytes, " bytes"));
  }
  std::string plaintext(ciphertext.size() - kTagBytes, '\0');
  unsigned long long length = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(reinterpret_cast<uint8_t*>(plaintext.data()), &length, nullptr,
                                                 reinterpret_cast<const uint8_t*>(ciphertext.data()), ciphertext.size(),
                                                 reinterpret_cast<const uint8_t*>(associated_data.data()),
                                                 associated_data.size(), reinterpret_cast<const uint8_t*>(nonce.data()),
                                                 key.data()) != 0) {
    return Refusal(SecurityEventKind::kAuthenticationFailed, absl::StatusCode::kPermissionDenied,
                   "an encrypted share failed authentication (altered, or sealed for another round, sender or "
                   "receiver); it is dropped and recorded");
  }
  plaintext.resize(length);
  return plaintext;
}

void Wipe(std::span<uint8_t> bytes) { sodium_memzero(bytes.data(), bytes.size()); }

}  // namespace fl::secagg
