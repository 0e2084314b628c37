// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/npy.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "file_io.h"

namespace stoker {

// .npy data is little-endian ('<u2', '<f4') and is copied as it is.
static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian machine");

namespace {

// "\x93NUMPY", major, minor, then the header length: 2 bytes (1.0) or 4 bytes (2.0).
constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kPreamble = 12;  // enough for either version's preamble
// numpy itself refuses headers over 10,000 bytes by default; a length far beyond that is
// corrupt data, and refusing it early bounds what a reader buffers.
constexpr std::uint64_t kMaxHeaderLength = std::uint64_t{1} << 20;

// Where the header's dictionary starts and ends, from the preamble.
struct HeaderSpan {
  std::size_t begin, end;
};

HeaderSpan header_span(std::span<const std::byte> head, const std::string& name) {
  auto byte = [&](std::size_t i) { return std::to_integer<std::uint32_t>(head[i]); };
  if (head.size() < 10 || std::memcmp(head.data(), kMagic.data(), kMagic.size()) != 0)
    throw DataError(name, "not a .npy file: it does not start with \\x93NUMPY");
  const std::uint32_t major = byte(6), minor = byte(7);
  std::uint64_t length = 0;
  std::size_t begin = 0;
  if (major == 1) {
    length = byte(8) | byte(9) << 8;
    begin = 10;
  } else if (major == 2) {
    if (head.size() < 12) throw DataError(name, "truncated .npy preamble");
    length = byte(8) | byte(9) << 8 | byte(10) << 16 | std::uint64_t{byte(11)} << 24;
    begin = 12;
  } else {
    throw DataError(name, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                              " is not supported (1.0 and 2.0 are)");
  }
  if (length > kMaxHeaderLength)
    throw DataError(name, ".npy header length " + std::to_string(length) + " is implausibly large");
  return {begin, begin + static_cast<std::size_t>(length)};
}

// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (16, 64, 64), }
// followed by spaces and a newline. This parses just that subset: string keys; string,
// True/False and tuple-of-integer values.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  struct Fields {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::uint64_t>> shape;
  };

  Fields parse() {
    Fields fields;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') fail("structured dtypes are not supported (descr is not a string)");
        fields.descr = parse_string();
      } else if (key == "fortran_order") {
        fields.fortran_order = parse_bool();
      } else if (key == "shape") {
        fields.shape = parse_tuple();
      } else {
        fail("unknown header key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header's dictionary");
    return fields;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw DataError(name_, "malformed .npy header at character " + std::to_string(pos_) + ": " + problem);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const auto end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    if (s.find('\\') != std::string::npos) fail("escapes in strings are not supported");
    pos_ = end + 1;
    return s;
  }
  bool parse_bool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::uint64_t parse_int() {
    std::uint64_t v = 0;
    const char* first = text_.data() + pos_;
    const auto [ptr, ec] = std::from_chars(first, text_.data() + text_.size(), v);
    if (ec == std::errc::result_out_of_range) fail("dimension too large");
    if (ec != std::errc{}) fail("expected a dimension");
    pos_ += static_cast<std::size_t>(ptr - first);
    if (peek() == 'L') ++pos_;  // Python 2's long literals: (3L, 4L)
    return v;
  }
  std::vector<std::uint64_t> parse_tuple() {
    std::vector<std::uint64_t> dims;
    expect('(');
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (dims.size() == 32) fail("more than 32 dimensions");
      dims.push_back(parse_int());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') fail("expected ',' or ')' in shape");
    }
    ++pos_;  // ')'
    return dims;
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

std::string dims_text(const std::vector<std::uint64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace

Shape NpyHeader::shape() const noexcept {
  auto dim = [&](std::size_t i) { return i < dims.size() ? static_cast<std::uint32_t>(dims[i]) : 1u; };
  if (dims.size() == 3) return {1, dim(0), dim(1), dim(2), true};
  return {1, 1, dim(0), dim(1), false};
}

NpyHeader parse_npy_header(std::span<const std::byte> head, std::uint64_t file_size, const std::string& name) {
  const HeaderSpan span = header_span(head, name);
  if (head.size() < span.end || file_size < span.end)
    throw DataError(name, "truncated .npy header: it needs " + std::to_string(span.end) + " bytes, the file has " +
                              std::to_string(std::min<std::uint64_t>(head.size(), file_size)));
  const std::string_view text(reinterpret_cast<const char*>(head.data()) + span.begin, span.end - span.begin);
  const auto fields = HeaderParser(text, name).parse();
  if (!fields.descr || !fields.fortran_order || !fields.shape)
    throw DataError(name, "malformed .npy header: 'descr', 'fortran_order' and 'shape' are all required");

  NpyHeader header;
  header.data_offset = span.end;
  const std::string& descr = *fields.descr;
  if (descr == "|u1" || descr == "<u1" || descr == "u1")
    header.dtype = DType::u8;
  else if (descr == "<u2")
    header.dtype = DType::u16;
  else if (descr == "<f4")
    header.dtype = DType::f32;
  else
    throw DataError(name, "unsupported .npy dtype '" + descr +
                              "': supported are '|u1' (uint8), '<u2' (uint16) and '<f4' (float32)");
  if (*fields.fortran_order)
    throw DataError(name,
                    "Fortran order (column-major) is not supported: save the array in C order, "
                    "e.g. np.save(path, np.ascontiguousarray(a))");

  header.dims = *fields.shape;
  const auto& dims = header.dims;
  if (dims.size() != 2 && dims.size() != 3)
    throw DataError(name, "shape " + dims_text(dims) + " has " + std::to_string(dims.size()) +
                              " dimensions: only 2D (H, W) and 3D (D, H, W) arrays are supported");
  std::uint64_t bytes = dtype_size(header.dtype);
  for (const auto d : dims) {
    // Shape holds 32-bit sizes; anything near that is corrupt rather than big.
    if (d == 0 || d > 0xFFFFFFFFu)
      throw DataError(name, "unsupported shape " + dims_text(dims) + ": every dimension must be 1 .. 2^32-1");
    if (!detail::checked_mul(bytes, d, bytes)) throw DataError(name, "shape " + dims_text(dims) + " overflows 64 bits");
  }
  const std::uint64_t data_end = header.data_offset + bytes;
  if (data_end < bytes /* wrapped around */ || file_size < data_end)
    throw DataError(name, "the header says " + dims_text(dims) + " " + dtype_name(header.dtype) + " = " +
                              std::to_string(bytes) + " bytes of data after a " + std::to_string(header.data_offset) +
                              "-byte header, but the file has only " + std::to_string(file_size) + " bytes");
  if (file_size > data_end)
    throw DataError(name, std::to_string(file_size - data_end) + " unexpected bytes after the " + dims_text(dims) +
                              " " + dtype_name(header.dtype) + " array the header describes");
  return header;
}

Sample parse_npy(std::span<const std::byte> file, const std::string& name, BufferPool& pool, std::int32_t label,
                 std::uint64_t id) {
  const NpyHeader header = parse_npy_header(file, file.size(), name);
  Sample sample(pool, header.shape(), header.dtype, label, id);
  std::memcpy(sample.data.data(), file.data() + header.data_offset, header.data_bytes());
  return sample;
}

Sample load_npy(const std::filesystem::path& path, BufferPool& pool, std::int32_t label, std::uint64_t id) {
  const detail::InputFile file(path);
  // Two small reads for the header, then the array straight into the sample's storage:
  // a volume of gigabytes is not read twice.
  std::vector<std::byte> head(std::min<std::uint64_t>(file.size(), kPreamble));
  file.read_at(0, head);
  const HeaderSpan span = header_span(head, file.name());
  head.resize(std::min<std::uint64_t>(file.size(), span.end));
  file.read_at(0, head);
  const NpyHeader header = parse_npy_header(head, file.size(), file.name());
  Sample sample(pool, header.shape(), header.dtype, label, id);
  file.read_at(header.data_offset, {sample.data.data(), sample.data.size()});
  return sample;
}

std::vector<NpyFile> read_labels_csv(const std::filesystem::path& csv, const std::filesystem::path& dir) {
  const auto bytes = detail::read_file(csv);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  };
  std::vector<NpyFile> files;
  std::size_t line_no = 0, pos = 0;
  bool may_be_header = true;  // the first non-blank line
  while (pos < text.size()) {
    const auto eol = std::min(text.find('\n', pos), text.size());
    const auto line = trim(text.substr(pos, eol - pos));
    pos = eol + 1;
    ++line_no;
    if (line.empty()) continue;
    const bool first = std::exchange(may_be_header, false);
    auto where = [&] { return "line " + std::to_string(line_no) + ": "; };
    // The last comma: file names may contain commas, labels do not.
    const auto comma = line.rfind(',');
    if (comma == std::string_view::npos)
      throw DataError(csv.string(), where() + "expected 'filename,label', got '" + std::string(line) + "'");
    const auto file = trim(line.substr(0, comma)), label_text = trim(line.substr(comma + 1));
    std::int32_t label = 0;
    const auto [end, ec] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (ec != std::errc{} || end != label_text.data() + label_text.size()) {
      if (first) continue;  // a header line such as "filename,label"
      throw DataError(csv.string(), where() + "label '" + std::string(label_text) + "' is not a 32-bit integer");
    }
    if (file.empty()) throw DataError(csv.string(), where() + "empty file name");
    files.push_back({dir / std::filesystem::path(file), label});
  }
  return files;
}

NpyReader::NpyReader(std::vector<NpyFile> files, ReaderOptions options)
    : Reader(std::move(options)), files_(std::make_shared<const std::vector<NpyFile>>(std::move(files))) {
  // Failing here, rather than some minutes into an epoch, for a file that is not there.
  for (const auto& f : *files_) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f.path, ec))
      throw DataError(f.path.string(), std::filesystem::exists(f.path, ec) ? "is not a regular file"
                                                                           : "cannot open: No such file or directory");
  }
}

NpyReader NpyReader::from_directory(const std::filesystem::path& dir, const std::filesystem::path& labels_csv,
                                    ReaderOptions options) {
  if (!labels_csv.empty()) return NpyReader(read_labels_csv(labels_csv, dir), std::move(options));
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) throw DataError(dir.string(), "cannot list the directory: " + ec.message());
  std::vector<NpyFile> files;
  for (const auto& entry : it)
    if (entry.path().extension() == ".npy") files.push_back({entry.path(), 0});
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return NpyReader(std::move(files), std::move(options));
}

Sample NpyReader::read(std::uint64_t id) const {
  check_id(id);
  const auto& f = (*files_)[id];
  return load_npy(f.path, *pool(), f.label, id);
}

}  // namespace stoker
