// kiln_safetensors.h: a header-only reader of safetensors files. C++17, the standard library and POSIX
// only, so that a generated model.so can include it without ATen.
//
// Format: a little-endian u64 N, N bytes of JSON header, then the data. The header is an object mapping
// each tensor name to {"dtype": "F32", "shape": [16, 8], "data_offsets": [begin, end]} (offsets count
// from the first byte after the header), plus an optional "__metadata__" object of string -> string,
// which is checked and skipped.
//
//   kiln::SafetensorsFile f;
//   std::string error;
//   if (!f.open("weights.safetensors", &error)) { ...report error... }
//   const kiln::TensorEntry* w = f.find("fc1.weight");
//
// No exception leaves this API: every failure is a `false` and a message naming the file.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// Note: `data` is not assumed to be aligned. Tensors are packed back to back (a 3-byte U8 tensor shifts
// every later one) and writers other than safetensors' own need not pad the header, so a pointer into
// the mapping may sit at any byte. Callers that need alignment (vector loads, typed pointers) copy.
struct TensorEntry {
  std::string name;
  std::string dtype;           // as written: "F32", "BF16", "BOOL", ...
  std::vector<int64_t> shape;  // empty for a 0-d tensor
  const void* data = nullptr;  // into the mapping; valid while the SafetensorsFile that owns it lives
  size_t nbytes = 0;           // numel * itemsize, checked against data_offsets
};

// A "__metadata__" entry: its key, its value and the file offset of the value's first byte.
struct MetadataEntry {
  std::string key;
  std::string value;
  size_t offset = 0;
};

class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept { swap(other); }
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept {
    SafetensorsFile old(std::move(other));
    swap(old);
    return *this;
  }
  ~SafetensorsFile() { close(); }

  // Maps `path` and reads its header. On failure returns false, leaves this object empty and sets
  // *error (when not null) to "weights file 'PATH': what is wrong".
  bool open(const std::string& path, std::string* error) noexcept;
  // The entry named `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const noexcept;
  // Every tensor in the file, sorted by name.
  const std::vector<TensorEntry>& entries() const noexcept { return entries_; }
  // The "__metadata__" entry `key`, or nullptr.
  const MetadataEntry* metadata(const std::string& key) const noexcept {
    for (const MetadataEntry& m : metadata_)
      if (m.key == key) return &m;
    return nullptr;
  }
  // The whole file, as mapped.
  const unsigned char* bytes() const noexcept { return static_cast<const unsigned char*>(map_); }
  size_t size() const noexcept { return map_size_; }

 private:
  void close() noexcept;
  void swap(SafetensorsFile& other) noexcept;
  bool map_file(const std::string& path, std::string* why);
  bool read_header(std::string* why);

  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorEntry> entries_;
  std::vector<MetadataEntry> metadata_;
};

// Checks that `f` holds `name` with this dtype and shape. On a mismatch returns false and sets *error to,
// e.g.: weights file 'w.safetensors': 'fc1.weight' has shape [16, 8], the model expects [32, 8]
bool check_entry(const SafetensorsFile& f, const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& shape, const std::string& path, std::string* error) noexcept;

namespace detail {

// Bytes per element of a dtype kiln reads, 0 for any other.
// Note: safetensors has more dtypes (U16, F8_E4M3, ...). kiln never writes them, so one here means the
// file is not the one the model was built for; refusing it by name says so at load time.
inline size_t dtype_itemsize(const std::string& dtype) {
  static const std::pair<const char*, size_t> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}, {"C64", 8},
  };
  for (const auto& [known, size] : kSizes) {
    if (dtype == known) return size;
  }
  return 0;
}

inline std::string format_shape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// `text` in single quotes for a message, control bytes written as \xNN.
// Note: names come from the file, and a hostile one must not be able to put a newline or a terminal
// escape into a log line. Other bytes pass as they are, so UTF-8 names read as written.
inline std::string quoted(const std::string& text) {
  const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "'";
}

// A header entry as parsed, before its offsets are checked against the data.
struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> offsets;
};

// A strict JSON reader for just what the header holds: objects, arrays, strings, non-negative integers.
// Note: the schema drives the parse (an object of objects of strings and integer arrays) instead of
// building a general tree, so there is no recursion that hostile nesting could drive off the stack, and
// every error, schema errors included, carries the byte where it was found.
class HeaderParser {
 public:
  // `text` is the header; `base` is its offset in the file, so that messages give file positions.
  HeaderParser(const char* text, size_t size, size_t base) : text_(text), size_(size), base_(base) {}

  bool parse(std::vector<RawEntry>* out, std::vector<MetadataEntry>* metadata) {
    bool ok = parse_object([&](const std::string& key, size_t) {
      if (key == "__metadata__") return parse_metadata(metadata);
      out->push_back(RawEntry{key, {}, {}, {}});
      return parse_tensor(&out->back());
    });
    if (!ok) return false;
    skip_ws();
    if (pos_ != size_) return fail("unexpected " + found() + " after the header object");
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  bool fail(const std::string& what) { return fail_at(pos_, what); }
  bool fail_at(size_t pos, const std::string& what) {
    error_ = "malformed JSON header at byte " + std::to_string(base_ + pos) + ": " + what;
    return false;
  }

  bool at_end() const { return pos_ >= size_; }
  char peek() const { return text_[pos_]; }

  std::string found() const {
    if (at_end()) return "end of header";
    unsigned char c = static_cast<unsigned char>(peek());
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    const char* hex = "0123456789abcdef";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
  }

  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  bool expect(char c) {
    skip_ws();
    if (!at_end() && peek() == c) {
      ++pos_;
      return true;
    }
    return fail(std::string("expected '") + c + "', found " + found());
  }

  // Calls member(key, key_position) with the cursor on each value; rejects duplicate keys.
  template <class Member>
  bool parse_object(Member&& member) {
    if (!expect('{')) return false;
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return true;
    }
    std::set<std::string> seen;
    while (true) {
      skip_ws();
      size_t key_pos = pos_;
      std::string key;
      if (!parse_string(&key)) return false;
      if (!seen.insert(key).second) return fail_at(key_pos, "duplicate key " + quoted(key));
      if (!expect(':') || !member(key, key_pos)) return false;
      skip_ws();
      if (!at_end() && peek() == ',') {
        ++pos_;
        continue;
      }
      return expect('}');
    }
  }

  bool parse_metadata(std::vector<MetadataEntry>* out) {
    return parse_object([&](const std::string& key, size_t) {
      skip_ws();
      size_t offset = base_ + pos_ + 1;  // past the opening quote
      std::string value;
      if (!parse_string(&value)) return false;
      out->push_back(MetadataEntry{key, std::move(value), offset});
      return true;
    });
  }

  // Note: unknown fields are refused rather than skipped: a field this reader does not understand may
  // change what the bytes mean, and a load that fails by name beats one that silently misreads.
  bool parse_tensor(RawEntry* e) {
    skip_ws();
    size_t start = pos_;
    int fields = 0;
    bool ok = parse_object([&](const std::string& key, size_t key_pos) {
      ++fields;
      if (key == "dtype") return parse_string(&e->dtype);
      if (key == "shape") return parse_int_array(&e->shape);
      if (key == "data_offsets") return parse_int_array(&e->offsets);
      return fail_at(key_pos, "unknown field " + quoted(key) + " in tensor " + quoted(e->name));
    });
    if (!ok) return false;
    // Duplicates and unknown keys are refused above, so three fields means all three are present.
    if (fields != 3) {
      return fail_at(start, "tensor " + quoted(e->name) + " needs \"dtype\", \"shape\" and \"data_offsets\"");
    }
    if (e->offsets.size() != 2) {
      return fail_at(start, "tensor " + quoted(e->name) + " has \"data_offsets\" that are not [begin, end]");
    }
    return true;
  }

  bool parse_int_array(std::vector<int64_t>* out) {
    if (!expect('[')) return false;
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      int64_t value = 0;
      if (!parse_int(&value)) return false;
      out->push_back(value);
      skip_ws();
      if (!at_end() && peek() == ',') {
        ++pos_;
        continue;
      }
      return expect(']');
    }
  }

  // A non-negative JSON integer up to INT64_MAX: no sign, no leading zeros, no fraction or exponent.
  bool parse_int(int64_t* out) {
    skip_ws();
    if (at_end() || peek() < '0' || peek() > '9') {
      return fail("expected a non-negative integer, found " + found());
    }
    size_t start = pos_;
    uint64_t value = 0;
    const uint64_t max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      uint64_t digit = static_cast<uint64_t>(peek() - '0');
      if (value > (max - digit) / 10) return fail_at(start, "integer too large");
      value = value * 10 + digit;
      ++pos_;
    }
    if (text_[start] == '0' && pos_ - start > 1) return fail_at(start, "integer with a leading zero");
    if (!at_end() && (peek() == '.' || peek() == 'e' || peek() == 'E')) {
      return fail_at(start, "expected an integer, found a fraction or exponent");
    }
    *out = static_cast<int64_t>(value);
    return true;
  }

  // Note: string bytes other than escapes are passed through unvalidated as UTF-8: names are only ever
  // compared byte for byte, so a bad sequence can make a name unfindable but never misread.
  bool parse_string(std::string* out) {
    skip_ws();
    if (at_end() || peek() != '"') return fail("expected a string, found " + found());
    size_t start = pos_++;
    while (!at_end()) {
      unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("control character " + found() + " in a string");
      if (c == '\\') {
        if (!parse_escape(out)) return false;
      } else {
        out->push_back(static_cast<char>(c));
        ++pos_;
      }
    }
    return fail_at(start, "unterminated string");
  }

  bool parse_escape(std::string* out) {
    size_t start = pos_++;  // the backslash
    if (at_end()) return fail_at(start, "unterminated escape");
    char c = text_[pos_++];
    switch (c) {
      case '"': case '\\': case '/': out->push_back(c); return true;
      case 'b': out->push_back('\b'); return true;
      case 'f': out->push_back('\f'); return true;
      case 'n': out->push_back('\n'); return true;
      case 'r': out->push_back('\r'); return true;
      case 't': out->push_back('\t'); return true;
      case 'u': return parse_unicode(start, out);
      default: return fail_at(start, "invalid escape");
    }
  }

  bool parse_hex4(size_t start, uint32_t* out) {
    if (size_ - pos_ < 4) return fail_at(start, "truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      uint32_t digit = (c >= '0' && c <= '9') ? static_cast<uint32_t>(c - '0')
                       : (c >= 'a' && c <= 'f') ? static_cast<uint32_t>(c - 'a' + 10)
                       : (c >= 'A' && c <= 'F') ? static_cast<uint32_t>(c - 'A' + 10)
                                                : 16;
      if (digit == 16) return fail_at(start, "invalid hex digit in \\u escape");
      value = value * 16 + digit;
    }
    *out = value;
    return true;
  }

  // After "\u": four hex digits, or a surrogate pair "\uD8xx\uDCxx"; appends the code point as UTF-8.
  bool parse_unicode(size_t start, std::string* out) {
    uint32_t cp = 0;
    if (!parse_hex4(start, &cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(start, "lone low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      const char* unpaired = "high surrogate without a low one in \\u escape";
      if (size_ - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') return fail_at(start, unpaired);
      pos_ += 2;
      uint32_t low = 0;
      if (!parse_hex4(start, &low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return fail_at(start, unpaired);
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(cp, out);
    return true;
  }

  static void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  const char* text_;
  size_t size_;
  size_t base_;
  size_t pos_ = 0;
  std::string error_;
};

// Sets *why and returns false, so that checks read as one line each.
inline bool fail(std::string* why, std::string message) {
  *why = std::move(message);
  return false;
}

// numel * itemsize, or false when it overflows size_t.
inline bool tensor_nbytes(const std::vector<int64_t>& shape, size_t itemsize, size_t* out) {
  *out = 0;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;  // empty, whatever the rest
  uint64_t total = itemsize;
  for (int64_t dim : shape) {
    uint64_t d = static_cast<uint64_t>(dim);  // >= 1: the parser takes no negative integers
    if (total > std::numeric_limits<size_t>::max() / d) return false;
    total *= d;
  }
  *out = static_cast<size_t>(total);
  return true;
}

// Checks a parsed entry against the data section [data, data + data_size) and makes it a TensorEntry.
inline bool make_entry(RawEntry raw, const char* data, size_t data_size, TensorEntry* out, std::string* why) {
  const std::string tensor = "tensor " + quoted(raw.name) + " ";
  size_t itemsize = dtype_itemsize(raw.dtype);
  if (itemsize == 0) return fail(why, tensor + "has unknown dtype " + quoted(raw.dtype));
  uint64_t begin = static_cast<uint64_t>(raw.offsets[0]);
  uint64_t end = static_cast<uint64_t>(raw.offsets[1]);
  std::string offsets = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) return fail(why, tensor + "has " + offsets + ", which run backwards");
  if (end > data_size) {
    std::string size = std::to_string(data_size);
    return fail(why, tensor + "has " + offsets + " outside the data (" + size + " bytes)");
  }
  size_t nbytes = 0;
  if (!tensor_nbytes(raw.shape, itemsize, &nbytes)) {
    return fail(why, tensor + "has shape " + format_shape(raw.shape) + ", too large to address");
  }
  if (nbytes != end - begin) {
    return fail(why, tensor + "has " + offsets + " (" + std::to_string(end - begin) + " bytes), but " +
                         raw.dtype + " " + format_shape(raw.shape) + " needs " + std::to_string(nbytes));
  }
  *out = TensorEntry{std::move(raw.name), std::move(raw.dtype), std::move(raw.shape), data + begin, nbytes};
  return true;
}

// Sets *error to "weights file 'PATH': why". Never throws: if even that allocation fails, *error is
// left as it was (the caller still sees `false`).
inline void set_error(std::string* error, const std::string& path, const char* why) noexcept {
  if (error == nullptr) return;
  try {
    *error = "weights file '" + path + "': " + why;
  } catch (...) {
  }
}

}  // namespace detail

inline void SafetensorsFile::close() noexcept {
  if (map_ != nullptr) munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  entries_.clear();
  metadata_.clear();
}

inline void SafetensorsFile::swap(SafetensorsFile& other) noexcept {
  std::swap(map_, other.map_);
  std::swap(map_size_, other.map_size_);
  entries_.swap(other.entries_);
  metadata_.swap(other.metadata_);
}

inline bool SafetensorsFile::open(const std::string& path, std::string* error) noexcept {
  close();
  std::string why;
  const char* failure = nullptr;  // set by the handlers, which must not allocate
  bool ok = false;
  try {
    ok = map_file(path, &why) && read_header(&why);
  } catch (const std::bad_alloc&) {
    failure = "out of memory while reading the header";
  } catch (...) {
    failure = "unexpected error while reading the header";
  }
  if (!ok) {
    close();
    detail::set_error(error, path, failure != nullptr ? failure : why.c_str());
  }
  return ok;
}

// Note: the mapping is PROT_READ and MAP_PRIVATE: nothing kiln does can write through to the checkpoint,
// even if a caller later makes pages writable to convert weights in place, and for reads a private
// mapping shares the page cache just as a shared one does, so it costs nothing. The descriptor is closed at
// once; the mapping keeps the file alive. Replace a checkpoint by writing a new file and renaming it over
// the old one: a mapped file that is truncated in place makes later reads of it fault (SIGBUS).
inline bool SafetensorsFile::map_file(const std::string& path, std::string* why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int open_errno = errno;
    return detail::fail(why, std::string("cannot open: ") + std::strerror(open_errno));
  }
  struct stat st {};
  int stat_errno = fstat(fd, &st) == 0 ? 0 : errno;
  if (stat_errno != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
    ::close(fd);  // before building a message, which may throw
    if (stat_errno != 0) return detail::fail(why, std::string("cannot stat: ") + std::strerror(stat_errno));
    if (!S_ISREG(st.st_mode)) return detail::fail(why, "not a regular file");
    std::string size = std::to_string(st.st_size);
    return detail::fail(why, "too short (" + size + " bytes) to hold the 8-byte header length");
  }
  size_t size = static_cast<size_t>(st.st_size);  // off_t is 64-bit on every target kiln builds for
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return detail::fail(why, std::string("cannot map: ") + std::strerror(map_errno));
  map_ = map;
  map_size_ = size;
  return true;
}

inline bool SafetensorsFile::read_header(std::string* why) {
  const unsigned char* bytes = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  size_t rest = map_size_ - 8;
  if (header_len > rest) {
    return detail::fail(why, "header length " + std::to_string(header_len) +
                                 " runs past the end of the file (" + std::to_string(map_size_) + " bytes)");
  }
  const char* header = static_cast<const char*>(map_) + 8;
  detail::HeaderParser parser(header, static_cast<size_t>(header_len), 8);
  std::vector<detail::RawEntry> raw;
  if (!parser.parse(&raw, &metadata_)) return detail::fail(why, parser.error());
  const char* data = header + header_len;
  size_t data_size = rest - static_cast<size_t>(header_len);
  entries_.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (!detail::make_entry(std::move(raw[i]), data, data_size, &entries_[i], why)) return false;
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return true;
}

inline const TensorEntry* SafetensorsFile::find(const std::string& name) const noexcept {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const TensorEntry& e, const std::string& n) { return e.name < n; });
  return (it != entries_.end() && it->name == name) ? &*it : nullptr;
}

namespace detail {

// Why `e` is not `name` with this dtype and shape, or "" when it is.
inline std::string entry_mismatch(const TensorEntry* e, const std::string& name, const std::string& dtype,
                                  const std::vector<int64_t>& shape) {
  if (e == nullptr) {
    return "no tensor " + quoted(name) + " (the model expects " + dtype + " " + format_shape(shape) + ")";
  }
  if (e->dtype != dtype) return quoted(name) + " has dtype " + e->dtype + ", the model expects " + dtype;
  if (e->shape != shape) {
    std::string expected = format_shape(shape);
    return quoted(name) + " has shape " + format_shape(e->shape) + ", the model expects " + expected;
  }
  return "";
}

}  // namespace detail

inline bool check_entry(const SafetensorsFile& f, const std::string& name, const std::string& dtype,
                        const std::vector<int64_t>& shape, const std::string& path,
                        std::string* error) noexcept {
  try {
    std::string why = detail::entry_mismatch(f.find(name), name, dtype, shape);
    if (why.empty()) return true;
    detail::set_error(error, path, why.c_str());
  } catch (...) {
    detail::set_error(error, path, "out of memory while checking a tensor");
  }
  return false;
}

}  // namespace kiln
