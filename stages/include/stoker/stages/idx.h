// SPDX-License-Identifier: Apache-2.0
// IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/stages/reader.h"

namespace stoker {

/// Where the Debian package `dataset-fashion-mnist` installs the data set.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

/// The contents of an IDX images file: `count` images of `height` x `width` unsigned bytes.
struct IdxImages {
  std::uint32_t count = 0, height = 0, width = 0;
  std::vector<std::uint8_t> pixels;  ///< count x height x width, row-major
};

/// Images and their labels, decoded into memory once.
struct IdxDataset {
  IdxImages images;
  std::vector<std::int32_t> labels;  ///< one per image

  std::size_t size() const noexcept { return labels.size(); }
  Shape shape() const noexcept { return {1, 1, images.height, images.width, false}; }
  std::span<const std::uint8_t> image(std::size_t i) const noexcept {
    const std::size_t n = std::size_t{images.height} * images.width;
    return {images.pixels.data() + i * n, n};
  }
};

/// True when `bytes` start with the gzip magic (1f 8b). Files are recognised by their
/// contents, never by their names' extension.
bool is_gzip(std::span<const std::byte> bytes) noexcept;

/// The decompressed contents of gzip data (one or more concatenated members). Throws
/// DataError naming `name` when the data is truncated or corrupt.
std::vector<std::byte> gunzip(std::span<const std::byte> gz, const std::string& name);

/// Parse an IDX images file (magic 0x00000803: unsigned bytes, 3 dimensions) from its
/// contents as stored, gzip-compressed or plain. Never reads outside `file`; throws
/// DataError naming `name` for anything malformed, including data shorter or longer than
/// the header says.
IdxImages parse_idx_images(std::span<const std::byte> file, const std::string& name);

/// Parse an IDX labels file (magic 0x00000801: unsigned bytes, 1 dimension), gzip-compressed
/// or plain. Throws DataError naming `name` for anything malformed.
std::vector<std::int32_t> parse_idx_labels(std::span<const std::byte> file, const std::string& name);

/// Load a pair of IDX files. Throws DataError naming the file for a missing or malformed
/// file, and when the two files hold different numbers of items.
IdxDataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels);

/// Fashion-MNIST's `split` ("train": 60,000 images, or "t10k": 10,000) from `dir`, which
/// holds the files `<split>-images-idx3-ubyte.gz` and `<split>-labels-idx1-ubyte.gz`, or the
/// same unpacked, without `.gz`.
IdxDataset fashion_mnist(const std::filesystem::path& dir = kFashionMnistDir, std::string_view split = "train");

/// Yields an IdxDataset's images as 1 x H x W uint8 samples with their labels.
///
/// Nothing is copied: each sample is a read-only view of its image in the data set
/// (Sample::view), which the sample keeps alive; writing to a sample gives it a copy of its
/// own first. The option `pool` is not used.
class IdxReader final : public Reader {
 public:
  explicit IdxReader(IdxDataset data, ReaderOptions options = {});
  /// Shares `data`, e.g. between the readers of several shards.
  explicit IdxReader(std::shared_ptr<const IdxDataset> data, ReaderOptions options = {});

  std::uint64_t dataset_size() const override { return resident_->data->size(); }
  Sample read(std::uint64_t id) const override;
  const IdxDataset& dataset() const noexcept { return *resident_->data; }

 private:
  // The data set and one entry per image that views it: what the samples read() gives are views
  // of, and what they keep alive. Shared by the reader's copies.
  struct Resident {
    std::shared_ptr<const IdxDataset> data;
    std::vector<Sample> entries;
  };
  std::shared_ptr<const Resident> resident_;
};

}  // namespace stoker
