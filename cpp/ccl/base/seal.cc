#include "base/seal.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

uint64_t rotate(uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

void sipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1, v1 = rotate(v1, 13), v1 ^= v0, v0 = rotate(v0, 32);
  v2 += v3, v3 = rotate(v3, 16), v3 ^= v2;
  v0 += v3, v3 = rotate(v3, 21), v3 ^= v0;
  v2 += v1, v1 = rotate(v1, 17), v1 ^= v2, v2 = rotate(v2, 32);
}

uint64_t littleEndian(const unsigned char* bytes, size_t count) {
  uint64_t word = 0;
  for (size_t i = 0; i < count; ++i) word |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return word;
}

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::string readKeyFile(const std::string& path) {
  struct stat status {};
  if (stat(path.c_str(), &status) != 0)
    fail(ncclInvalidArgument, "MOJOCCL_JOB_KEY_FILE=" + path + " cannot be read: " + strerror(errno));
  if (status.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(status.st_mode & 0777));
    fail(ncclInvalidArgument, "MOJOCCL_JOB_KEY_FILE=" + path + " can be read by others (mode " + mode +
                                  "): a job key only its owner reads keeps a job sealed; chmod 600 " + path);
  }
  std::ifstream file(path);
  if (!file)
    fail(ncclInvalidArgument, "MOJOCCL_JOB_KEY_FILE=" + path + " cannot be read: " + strerror(errno) +
                                  " (it must be readable by the user the ranks run as)");
  std::stringstream contents;
  contents << file.rdbuf();
  std::string key = trimmed(contents.str());
  if (key.empty())
    fail(ncclInvalidArgument, "MOJOCCL_JOB_KEY_FILE=" + path + " holds no key: write a secret into it, e.g. "
                                  "head -c 32 /dev/urandom | base64 > " + path);
  return key;
}

// Fixed, public: it only spreads a job key's text over 64 bits.
constexpr uint64_t kJobKeySpread0 = 0x6d6f6a6f63636c2dull, kJobKeySpread1 = 0x6a6f622d6b657921ull;

}  // namespace

uint64_t sipHash(uint64_t k0, uint64_t k1, const void* data, size_t length) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  const size_t whole = length / 8 * 8;
  for (size_t offset = 0; offset < whole; offset += 8) {
    const uint64_t word = littleEndian(bytes + offset, 8);
    v3 ^= word;
    sipRound(v0, v1, v2, v3), sipRound(v0, v1, v2, v3);
    v0 ^= word;
  }
  const uint64_t last = (static_cast<uint64_t>(length & 0xff) << 56) | littleEndian(bytes + whole, length - whole);
  v3 ^= last;
  sipRound(v0, v1, v2, v3), sipRound(v0, v1, v2, v3);
  v0 ^= last;
  v2 ^= 0xff;
  for (int round = 0; round < 4; ++round) sipRound(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

std::string jobKey() {
  const std::string key = settingText("MOJOCCL_JOB_KEY");
  const std::string path = settingText("MOJOCCL_JOB_KEY_FILE");
  if (!key.empty() && !path.empty())
    fail(ncclInvalidArgument, "MOJOCCL_JOB_KEY and MOJOCCL_JOB_KEY_FILE are both set: set one");
  return path.empty() ? key : readKeyFile(path);
}

SealKeys deriveSealKeys(uint64_t secret) {
  const std::string job = jobKey();
  const uint64_t k1 = sipHash(kJobKeySpread0, kJobKeySpread1, job.data(), job.size());
  auto derive = [&](const char* purpose) { return sipHash(secret, k1, purpose, strlen(purpose)); };
  return {derive("bootstrap hello"), derive("peer watch"), derive("fabric message")};
}

void Rejections::record(const std::string& what) {
  const uint64_t count = ++count_;
  // The first, then at 10, 100, 1000...: a flood stays a few lines.
  uint64_t power = 1;
  while (power < count) power *= 10;
  if (power != count) return;
  fprintf(stderr, "[mojoccl] WARNING: %s turned away %s%s (docs/security.md)\n", where_.c_str(), what.c_str(),
          count == 1 ? "" : (" (" + std::to_string(count) + " so far)").c_str());
}

}  // namespace mojoccl
