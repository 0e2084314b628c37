// SPDX-License-Identifier: Apache-2.0
// NumPy .npy files: 2D images and 3D volumes of uint8, uint16 or float32, one array a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/stages/reader.h"

namespace stoker {

/// What a .npy header says about the array after it.
struct NpyHeader {
  DType dtype = DType::u8;
  std::vector<std::uint64_t> dims;  ///< as in the file: (H, W) or (D, H, W)
  std::uint64_t data_offset = 0;    ///< where the array's bytes start in the file

  /// (H, W) gives 1 x H x W; (D, H, W) gives the volume 1 x D x H x W.
  Shape shape() const noexcept;
  std::uint64_t data_bytes() const noexcept { return shape().elements() * dtype_size(dtype); }
};

/// Parse the header at the start of a .npy file (format 1.0 or 2.0). `head` is the file or
/// a prefix of it holding at least the whole header; `file_size` is the whole file's size,
/// which must be exactly the header plus the array it describes. Supported: dtype '|u1',
/// '<u2' or '<f4', C order, 2 or 3 dimensions, none of them 0. Never reads outside `head`;
/// throws DataError naming `name` for anything else.
NpyHeader parse_npy_header(std::span<const std::byte> head, std::uint64_t file_size, const std::string& name);

/// The array in a whole .npy file held in memory, as a sample. Throws DataError naming `name`.
Sample parse_npy(std::span<const std::byte> file, const std::string& name, BufferPool& pool, std::int32_t label = 0,
                 std::uint64_t id = 0);

/// The array in a .npy file, read straight into the sample's storage. Throws DataError
/// naming the file when it is missing or malformed.
Sample load_npy(const std::filesystem::path& file, BufferPool& pool, std::int32_t label = 0, std::uint64_t id = 0);

/// One sample of an NpyReader.
struct NpyFile {
  std::filesystem::path path;
  std::int32_t label = 0;
};

/// `filename,label` lines of a CSV file, names relative to `dir` (or absolute). Blank lines
/// are skipped, and so is a first line whose label is not a number (a header). Throws
/// DataError naming the CSV file and the line for anything else malformed.
std::vector<NpyFile> read_labels_csv(const std::filesystem::path& csv, const std::filesystem::path& dir);

/// Yields .npy files as samples, one file a sample, read from disk when asked for: a data
/// set of big volumes need not fit in memory. Files may differ in shape and dtype.
class NpyReader final : public Reader {
 public:
  /// Sample i is `files[i]`. Throws DataError naming the first file that does not exist.
  explicit NpyReader(std::vector<NpyFile> files, ReaderOptions options = {});

  /// The files listed in `labels_csv` (see read_labels_csv), or, when `labels_csv` is
  /// empty, every *.npy file in `dir` in name order, with label 0.
  static NpyReader from_directory(const std::filesystem::path& dir, const std::filesystem::path& labels_csv = {},
                                  ReaderOptions options = {});

  std::uint64_t dataset_size() const override { return files_->size(); }
  Sample read(std::uint64_t id) const override;
  const std::vector<NpyFile>& files() const noexcept { return *files_; }

 private:
  std::shared_ptr<const std::vector<NpyFile>> files_;
};

}  // namespace stoker
