// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/tar.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "stoker/stages/reader.h"
#include "tar_io.h"

namespace stoker {

namespace {

constexpr std::uint64_t kBlock = 512;
constexpr std::uint64_t kMaxLongName = 1 << 20;  // a pax or GNU long-name record

std::uint64_t round_up(std::uint64_t n) noexcept { return (n + kBlock - 1) / kBlock * kBlock; }

// The fields of a ustar header that listing needs, by their offsets in the block.
struct Field {
  std::size_t at, size;
};
constexpr Field kName{0, 100}, kSize{124, 12}, kChecksum{148, 8}, kMagic{257, 6}, kPrefix{345, 155};
constexpr std::size_t kType = 156;

std::string_view text(const std::array<char, kBlock>& block, Field f) {
  const char* begin = block.data() + f.at;
  return {begin, static_cast<std::size_t>(std::find(begin, begin + f.size, '\0') - begin)};
}

// An octal number, space- or NUL-padded, or GNU's base-256 for sizes of 8 GiB and more.
bool parse_number(const std::array<char, kBlock>& block, Field f, std::uint64_t& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(block.data() + f.at);
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return false;  // negative
    out = 0;
    for (std::size_t i = 1; i < f.size; ++i) {
      if (out >> 56) return false;
      out = out << 8 | p[i];
    }
    return true;
  }
  std::size_t i = 0;
  while (i < f.size && p[i] == ' ') ++i;
  out = 0;
  bool any = false;
  for (; i < f.size && p[i] >= '0' && p[i] <= '7'; ++i, any = true) {
    if (out >> 60) return false;
    out = out * 8 + (p[i] - '0');
  }
  for (; i < f.size; ++i)
    if (p[i] != ' ' && p[i] != '\0') return false;
  return any;
}

bool checksum_ok(const std::array<char, kBlock>& block) {
  std::uint64_t stored = 0;
  if (!parse_number(block, kChecksum, stored)) return false;
  std::uint64_t sum = 0;
  std::int64_t signed_sum = 0;  // some old writers summed signed chars
  for (std::size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= kChecksum.at && i < kChecksum.at + kChecksum.size;
    const char c = in_field ? ' ' : block[i];
    sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  return stored == sum || static_cast<std::int64_t>(stored) == signed_sum;
}

// The "path" record of a pax extended header ("<length> path=<name>\n" records), if any.
std::string pax_path(std::string_view records, const std::string& archive) {
  std::string path;
  while (!records.empty()) {
    std::size_t length = 0;
    const auto [end, ec] = std::from_chars(records.data(), records.data() + records.size(), length);
    if (ec != std::errc{} || length == 0 || length > records.size() || *end != ' ')
      throw DataError(archive, "malformed pax extended header record");
    const std::string_view record = records.substr(0, length);
    const auto space = record.find(' '), equals = record.find('=');
    if (equals == std::string_view::npos || record.back() != '\n')
      throw DataError(archive, "malformed pax extended header record");
    if (record.substr(space + 1, equals - space - 1) == "path")
      path.assign(record.substr(equals + 1, record.size() - equals - 2));
    records.remove_prefix(length);
  }
  return path;
}

std::string octal(std::uint64_t value, std::size_t digits) {
  std::string s(digits, '0');
  for (std::size_t i = digits; i-- > 0; value >>= 3) s[i] = static_cast<char>('0' + (value & 7));
  if (value != 0) throw std::invalid_argument("tar: number too large for its header field");
  return s;
}

}  // namespace

std::vector<TarMember> list_tar(const std::filesystem::path& archive) {
  return detail::list_tar(detail::InputFile(archive));
}

std::vector<TarMember> detail::list_tar(const RandomAccessFile& file) {
  const std::string& name = file.name();
  std::vector<TarMember> members;
  std::string long_name;  // from a pax or GNU long-name entry, for the next member
  std::array<char, kBlock> block{};
  for (std::uint64_t at = 0;;) {
    if (at == file.size()) break;  // no end marker: accepted, as GNU tar and Python's tarfile do
    if (at > file.size() || file.size() - at < kBlock)
      throw DataError(name, "truncated tar archive: it ends at byte " + std::to_string(file.size()) +
                                ", inside the block at offset " + std::to_string(at - (at > file.size() ? kBlock : 0)));
    file.read_at(at, std::as_writable_bytes(std::span(block)));
    if (std::all_of(block.begin(), block.end(), [](char c) { return c == 0; })) break;  // end of the archive
    if (!checksum_ok(block))
      throw DataError(name, "bad tar header checksum at offset " + std::to_string(at) +
                                (at == 0 ? " (is this a tar archive?)" : " (the archive is damaged)"));
    std::uint64_t size = 0;
    if (!parse_number(block, kSize, size))
      throw DataError(name, "bad size field in the tar header at offset " + std::to_string(at));
    const std::uint64_t data = at + kBlock;
    if (size > file.size() - data)
      throw DataError(name, "truncated tar archive: the member at offset " + std::to_string(at) + " claims " +
                                std::to_string(size) + " bytes, only " + std::to_string(file.size() - data) +
                                " are left");
    const char type = block[kType];
    if (type == 'x' || type == 'L') {
      if (size > kMaxLongName)
        throw DataError(name,
                        "a long-name record of " + std::to_string(size) + " bytes at offset " + std::to_string(at));
      std::string record(size, '\0');
      file.read_at(data, std::as_writable_bytes(std::span(record)));
      if (type == 'x') {
        if (auto path = pax_path(record, name); !path.empty()) long_name = std::move(path);
      } else {
        long_name.assign(record.c_str());  // NUL-terminated
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string member_name;
      if (!long_name.empty()) {
        member_name = std::move(long_name);
      } else {
        member_name = text(block, kName);
        // POSIX ustar puts the start of a long path in `prefix`; GNU's "ustar  " uses that space
        // for other things.
        if (std::memcmp(block.data() + kMagic.at, "ustar\0", 6) == 0)
          if (const auto prefix = text(block, kPrefix); !prefix.empty())
            member_name = std::string(prefix) + "/" + member_name;
      }
      members.push_back({std::move(member_name), data, size});
      long_name.clear();
    } else if (type != 'g') {
      long_name.clear();  // a directory, link or device: its pending long name was its own
    }
    at = data + round_up(size);
  }
  return members;
}

std::pair<std::string_view, std::string_view> split_wds_name(std::string_view member) noexcept {
  const auto slash = member.rfind('/');
  const auto dot = member.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  if (dot == std::string_view::npos) return {member, {}};
  return {member.substr(0, dot), member.substr(dot + 1)};
}

std::filesystem::path wds_index_path(const std::filesystem::path& archive) {
  auto index = archive;
  return index.replace_extension(".idx");
}

void write_wds_index(const std::filesystem::path& index, std::span<const TarMember> members) {
  std::ostringstream lines;
  std::size_t samples = 0;
  std::string_view key;
  for (const auto& m : members) {
    if (m.name.find_first_of(" \t\n\r") != std::string::npos)
      throw std::invalid_argument("write_wds_index: member '" + m.name + "' has white space in its name");
    const auto [k, ext] = split_wds_name(m.name);
    if (samples == 0 || k != key) {
      if (samples != 0) lines << '\n';
      ++samples;
      key = k;
    } else {
      lines << ' ';
    }
    lines << ext << ' ' << m.offset << ' ' << m.size << ' ' << m.name;
  }
  if (samples != 0) lines << '\n';
  std::ofstream out(index, std::ios::binary | std::ios::trunc);
  out << "v1.2 " << samples << '\n' << lines.str();
  out.close();
  if (!out) throw std::runtime_error("write_wds_index: cannot write " + index.string());
}

std::vector<TarMember> read_wds_index(const std::filesystem::path& index) {
  return detail::parse_wds_index(detail::read_file(index), index.string());
}

std::vector<TarMember> detail::parse_wds_index(std::span<const std::byte> bytes, const std::string& name) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  std::string version;
  std::uint64_t samples = 0;
  if (!(in >> version >> samples) || version != "v1.2")
    throw DataError(name, "not a WebDataset index of version v1.2 (as DALI's wds2idx.py writes)");
  std::vector<TarMember> members;
  std::string line;
  std::getline(in, line);  // the rest of the first line
  for (std::uint64_t s = 0; s < samples; ++s) {
    if (!std::getline(in, line))
      throw DataError(name,
                      "the index lists " + std::to_string(s) + " samples, its header says " + std::to_string(samples));
    std::istringstream fields(line);
    std::string ext, member;
    std::uint64_t offset = 0, size = 0;
    bool any = false;
    while (fields >> ext) {
      if (!(fields >> offset >> size >> member) || offset % kBlock != 0)
        throw DataError(name,
                        "line " + std::to_string(s + 2) +
                            ": expected groups of '<extension> <offset> <size> <name>', offsets multiples of 512");
      if (size > UINT64_MAX - offset)
        throw DataError(name, "line " + std::to_string(s + 2) + ": member " + member + " at offset " +
                                  std::to_string(offset) + " claims " + std::to_string(size) +
                                  " bytes, past any file's end");
      members.push_back({member, offset, size});
      any = true;
    }
    if (!any) throw DataError(name, "line " + std::to_string(s + 2) + " lists no member");
  }
  return members;
}

TarWriter::TarWriter(const std::filesystem::path& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) throw std::runtime_error("cannot create " + path.string() + ": " + std::strerror(errno));
}

TarWriter::~TarWriter() {
  if (file_) std::fclose(file_);
}

void TarWriter::write(const void* data, std::size_t size) {
  if (size != 0 && std::fwrite(data, 1, size, file_) != size)
    throw std::runtime_error("cannot write " + path_.string() + ": " + std::strerror(errno));
  written_ += size;
}

void TarWriter::header(std::string_view name, std::uint64_t size, char type) {
  std::array<char, kBlock> block{};
  std::memcpy(block.data(), name.data(), std::min<std::size_t>(name.size(), kName.size));
  std::memcpy(block.data() + 100, "0000644", 8);  // mode
  std::memcpy(block.data() + 108, "0000000", 8);  // uid
  std::memcpy(block.data() + 116, "0000000", 8);  // gid
  std::memcpy(block.data() + kSize.at, octal(size, 11).c_str(), 12);
  std::memcpy(block.data() + 136, "00000000000", 12);  // mtime: none, so that archives are reproducible
  block[kType] = type;
  std::memcpy(block.data() + kMagic.at,
              "ustar\0"
              "00",
              8);
  std::memset(block.data() + kChecksum.at, ' ', kChecksum.size);
  unsigned sum = 0;
  for (const char c : block) sum += static_cast<unsigned char>(c);
  std::memcpy(block.data() + kChecksum.at, (octal(sum, 6) + '\0' + ' ').data(), 8);
  write(block.data(), block.size());
}

void TarWriter::add(std::string_view name, std::span<const std::byte> data) {
  if (!file_) throw std::logic_error("TarWriter::add after finish()");
  if (name.empty()) throw std::invalid_argument("TarWriter::add: an empty member name");
  if (name.size() > kName.size) {  // a pax record "<length> path=<name>\n"; its length counts itself
    const std::string body = " path=" + std::string(name) + "\n";
    std::size_t length = body.size() + 1;
    while (std::to_string(length).size() + body.size() != length) ++length;
    const std::string record = std::to_string(length) + body;
    header("PaxHeader", record.size(), 'x');
    write(record.data(), record.size());
    write(std::array<char, kBlock>{}.data(), round_up(record.size()) - record.size());
  }
  header(name, data.size(), '0');
  members_.push_back({std::string(name), written_, data.size()});
  write(data.data(), data.size());
  write(std::array<char, kBlock>{}.data(), round_up(data.size()) - data.size());
}

void TarWriter::finish() {
  if (!file_) return;
  write(std::array<char, 2 * kBlock>{}.data(), 2 * kBlock);
  const bool failed = std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) throw std::runtime_error("cannot write " + path_.string());
}

}  // namespace stoker
