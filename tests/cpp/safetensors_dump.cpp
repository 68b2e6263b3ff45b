// Test driver for runtime/kiln_safetensors.h (tests/test_safetensors_reader.py compiles and runs it).
//
//   safetensors_dump FILE                          one line per tensor: name dtype shape nbytes checksum
//   safetensors_dump FILE --expect NAME DTYPE DIMS check_entry on one tensor (DIMS "16,8", "" for 0-d)
//   safetensors_dump --each FILE...                one line per file, "ok N" (entries) or "error: <message>";
//                                                  exits 0 (one process for many hostile files)
//
// Otherwise, on any failure prints "error: <message>" and exits 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "kiln_safetensors.h"

namespace {

// 64-bit FNV-1a over the tensor's bytes.
uint64_t fnv1a(const void* data, size_t nbytes) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < nbytes; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::vector<int64_t> parse_dims(const std::string& text) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    dims.push_back(std::strtoll(text.substr(start, comma - start).c_str(), nullptr, 10));
    start = comma + 1;
  }
  return dims;
}

int fail(const std::string& message) {
  std::printf("error: %s\n", message.c_str());
  return 1;
}

// Opens each file and says how it went; the point is that nothing crashes or trips a sanitizer.
int open_each(int count, char** paths) {
  for (int i = 0; i < count; ++i) {
    kiln::SafetensorsFile file;
    std::string error;
    if (file.open(paths[i], &error)) {
      std::printf("ok %zu\n", file.entries().size());
    } else {
      std::printf("error: %s\n", error.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--each") return open_each(argc - 2, argv + 2);
  bool expect = argc == 6 && std::string(argv[2]) == "--expect";
  if (argc != 2 && !expect) {
    return fail("usage: safetensors_dump FILE [--expect NAME DTYPE DIMS] | --each FILE...");
  }
  std::string path = argv[1];
  kiln::SafetensorsFile file;
  std::string error;
  if (!file.open(path, &error)) return fail(error);
  if (expect) {
    if (!kiln::check_entry(file, argv[3], argv[4], parse_dims(argv[5]), path, &error)) return fail(error);
    std::printf("ok\n");
    return 0;
  }
  kiln::SafetensorsFile moved = std::move(file);  // the entries' pointers must survive a move
  for (const kiln::TensorEntry& e : moved.entries()) {
    if (moved.find(e.name) != &e) return fail("find('" + e.name + "') does not return its entry");
    std::printf("%s %s %s %zu %016llx\n", e.name.c_str(), e.dtype.c_str(), shape_text(e.shape).c_str(),
                e.nbytes, static_cast<unsigned long long>(fnv1a(e.data, e.nbytes)));
  }
  return 0;
}
