// SPDX-License-Identifier: Apache-2.0
// Tar archives as WebDataset stores samples in them: listing, writing, and the index that lets a
// reader start anywhere without reading the archive from its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker {

/// A regular file inside a tar archive.
struct TarMember {
  std::string name;          ///< its path in the archive
  std::uint64_t offset = 0;  ///< of its data, from the archive's start (a multiple of 512)
  std::uint64_t size = 0;    ///< of its data
  bool operator==(const TarMember&) const = default;
};

/// The regular files of a tar archive in archive order, found by reading its 512-byte headers
/// only (one read per member, none of their data). Understands POSIX ustar, pax extended headers
/// (long names) and GNU long names; skips directories, links and other entries. Throws DataError
/// naming the archive for a header with a bad checksum or a member that runs past its end.
std::vector<TarMember> list_tar(const std::filesystem::path& archive);

/// A WebDataset sample key and a member's extension: the name up to, and after, the first dot
/// of its last path component ("train/n0153.seg.png" -> "train/n0153", "seg.png").
std::pair<std::string_view, std::string_view> split_wds_name(std::string_view member) noexcept;

/// The index DALI's `tools/wds2idx.py` writes (format "v1.2"), for the members of one archive:
/// a line "v1.2 <samples>", then a line per sample (consecutive members with one key), each
/// member as "<extension> <offset> <size> <name>". Throws std::invalid_argument for a name with
/// white space, which the format cannot hold, and std::runtime_error when the file cannot be
/// written.
void write_wds_index(const std::filesystem::path& index, std::span<const TarMember> members);

/// The members a wds2idx index lists, in its order. Throws DataError naming the index for a
/// malformed one.
std::vector<TarMember> read_wds_index(const std::filesystem::path& index);

/// Where a reader looks for an archive's index: beside it, with ".idx" for its extension, as
/// wds2idx names it by default ("shards/a-000.tar" -> "shards/a-000.idx").
std::filesystem::path wds_index_path(const std::filesystem::path& archive);

/// Writes a tar archive member by member (POSIX ustar; a name over 100 bytes goes in a pax
/// extended header). Not thread-safe.
///
///   stoker::TarWriter tar("shard-000.tar");
///   tar.add("n0153/img7.jpg", jpeg_bytes);
///   tar.add("n0153/img7.cls", "3");
///   tar.finish();
///   stoker::write_wds_index(stoker::wds_index_path("shard-000.tar"), tar.members());
class TarWriter {
 public:
  /// Throws std::runtime_error naming the file when it cannot be created.
  explicit TarWriter(const std::filesystem::path& path);
  /// Closes the file; an archive not finish()ed lacks its end marker (two zero blocks).
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  void add(std::string_view name, std::span<const std::byte> data);
  void add(std::string_view name, std::string_view text) { add(name, std::as_bytes(std::span(text))); }
  /// Writes the end marker and closes the file; throws std::runtime_error if a write failed.
  void finish();
  /// The members added so far, with where their data lies.
  const std::vector<TarMember>& members() const noexcept { return members_; }

 private:
  void write(const void* data, std::size_t size);
  void header(std::string_view name, std::uint64_t size, char type);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::uint64_t written_ = 0;
  std::vector<TarMember> members_;
};

}  // namespace stoker
