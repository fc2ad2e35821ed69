// The cryptography of SecAgg+, libsodium only (no home-made primitives):
//
//  - key agreement: X25519 (crypto_scalarmult), the shared point hashed with both public keys and a purpose
//    label by BLAKE2b (crypto_generichash) into a 32-byte key;
//  - the shares travel encrypted with XChaCha20-Poly1305 (crypto_aead_xchacha20poly1305_ietf), random 24-byte
//    nonces, the associated data (label, round, sender, receiver): a share moved to another round or pair fails
//    authentication;
//  - masks: the ChaCha20 keystream (crypto_stream_chacha20_ietf_xor_ic) read as little-endian uint32 words,
//    keyed per pair and per round (BLAKE2b of the agreed key and the round); the block counter addresses any
//    offset, so a chunk at any offset is masked or unmasked without generating what comes before it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "fl/secagg/shamir.h"

namespace fl::secagg {

inline constexpr size_t kKeyBytes = 32;
using Key = std::array<uint8_t, kKeyBytes>;

// libsodium's initialisation (idempotent, thread-safe); every entry point of the library calls it.
void EnsureSodium();

// Randomness: libsodium's CSPRNG (randombytes_buf), or, for tests only, a deterministic stream from a seed
// (randombytes_buf_deterministic over BLAKE2b(seed, counter)) so that a test's keys and shares repeat.
class RandomSource {
 public:
  static RandomSource System();
  static RandomSource SeededForTests(uint64_t seed);
  void Fill(std::span<uint8_t> out);
  RandomFill AsFill();  // valid while this object lives

 private:
  std::optional<Key> seed_;
  uint64_t counter_ = 0;
};

struct KeyPair {
  Key public_key{};
  Key secret_key{};
};

// An X25519 key pair from 32 random bytes (the secret key; its public key by crypto_scalarmult_base).
KeyPair NewKeyPair(RandomSource& random);
// The public key of a secret key (the server checks a reconstructed mask key against the advertised one).
Key PublicKeyOf(const Key& secret_key);

enum class KeyPurpose { kShareEncryption, kMask };

// The 32-byte key two parties agree on: BLAKE2b(label(purpose) || X25519(own_secret, peer_public) || the two
// public keys in byte order). Refused (kBadKey) when the peer's key is of low order (the shared point is 0).
absl::StatusOr<Key> AgreeKey(KeyPurpose purpose, const Key& own_secret, const Key& own_public, const Key& peer_public);

// The mask key of a pair or of a self-mask seed for one round: BLAKE2b keyed with `secret`, over the round.
Key RoundMaskKey(const Key& secret, uint64_t round);

// Adds (sign +1) or subtracts (sign -1) the mask keystream of `key` at words [offset, offset + words.size())
// to `words`, modulo 2^32. `words` may be any length; offset + size must stay below 2^36 (the 32-bit block
// counter of 16-word blocks).
void ApplyMask(const Key& key, int sign, uint64_t offset, std::span<uint32_t> words);

// Several masks at once: the same as ApplyMask for each, but piece by piece (16 KiB of words at a time, every
// key's keystream added to that piece before the next), so that the words stay in the cache while the keys
// pass over them instead of the whole chunk streaming through memory once per key.
struct SignedKey {
  Key key{};
  int sign = +1;
};
void ApplyMasks(std::span<const SignedKey> keys, uint64_t offset, std::span<uint32_t> words);

// The associated data of a share: purpose label, round, sender, receiver (little-endian).
std::string ShareAssociatedData(uint64_t round, uint64_t sender, uint64_t receiver);

inline constexpr size_t kNonceBytes = 24;
inline constexpr size_t kTagBytes = 16;

// XChaCha20-Poly1305 of `plaintext` under `key` with a random nonce: (nonce, ciphertext with tag).
std::pair<std::string, std::string> Seal(const Key& key, std::string_view associated_data,
                                         std::span<const uint8_t> plaintext, RandomSource& random);
// The plaintext, or kAuthenticationFailed when the nonce, the ciphertext, the key or the associated data differ
// from the sealed ones.
absl::StatusOr<std::string> Open(const Key& key, std::string_view associated_data, std::string_view nonce,
                                 std::string_view ciphertext);

// Wipes a buffer (sodium_memzero: not optimised away).
void Wipe(std::span<uint8_t> bytes);

}  // namespace fl::secagg
