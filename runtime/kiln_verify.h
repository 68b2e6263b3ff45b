// kiln_verify.h: checking a weights file against the digest it carries, before a model uses it.
//
// kiln writes every weights file with "kiln.xxh3_128" in its safetensors "__metadata__": the
// XXH3-128 of the whole file as it reads with that value set to 32 '0's (the writer hashes the file
// with the placeholder in place, then writes the digest over it; see tasks/trace/weights.py). So the
// digest covers the header and the data, and a file carries its own check: any consumer of model.so
// verifies it with no other file at hand. A damaged, truncated or edited file fails by name, and is
// never used.
//
// Note: XXH3 (xxHash 0.8, vendored under third_party/, BSD-2) hashes at memory speed (tens of GB/s
// a core), so checking bert's 440 MB costs a few tens of ms over reading the pages, which the model
// reads anyway; sha256 would cost ~1 s. It is not a cryptographic hash: it guards against damage,
// not against an attacker who can write the build folder (who could replace model.so itself).
#pragma once

#include <memory>
#include <string>

#include "kiln_safetensors.h"

#define XXH_INLINE_ALL
#include "third_party/xxhash.h"

namespace kiln {

constexpr const char* kDigestKey = "kiln.xxh3_128";
constexpr size_t kDigestChars = 32;

inline std::string xxh3_128_hex(const SafetensorsFile& f, size_t placeholder) {
  static const char zeros[kDigestChars + 1] = "00000000000000000000000000000000";
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  XXH3_128bits_update(state.get(), f.bytes(), placeholder);
  XXH3_128bits_update(state.get(), zeros, kDigestChars);
  size_t after = placeholder + kDigestChars;
  XXH3_128bits_update(state.get(), f.bytes() + after, f.size() - after);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state.get()));
  const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char byte : canonical.digest) {
    out += hex[byte >> 4];
    out += hex[byte & 15];
  }
  return out;
}

// "" when `f` matches the digest it carries, else why not (a sentence naming `path`).
inline std::string digest_mismatch(const SafetensorsFile& f, const std::string& path) {
  const MetadataEntry* m = f.metadata(kDigestKey);
  std::string file = "weights file '" + path + "'";
  if (m == nullptr) {
    return file + " carries no \"" + kDigestKey + "\" digest: kiln did not write it. Recompile the model, or "
                  "create it with KILN_CREATE_NO_VERIFY to use the file unchecked";
  }
  if (m->value.size() != kDigestChars || m->offset + kDigestChars > f.size()) {
    return file + " has a malformed \"" + kDigestKey + "\" digest; recompile the model to write it again";
  }
  std::string found = xxh3_128_hex(f, m->offset);
  if (found == m->value) return "";
  return file + " does not match its digest (xxh3-128 " + found + ", recorded " + m->value +
         "): it was damaged or changed after kiln wrote it; recompile the model to write it again";
}

}  // namespace kiln
