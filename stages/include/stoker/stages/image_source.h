// SPDX-License-Identifier: Apache-2.0
// Data sets of image files (a list file, a folder per class, WebDataset tar shards) and the
// pipeline source that reads their bytes, shuffled every epoch and shared out among ranks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/core/stage.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/image.h"
#include "stoker/stages/remote.h"
#include "stoker/stages/shard.h"

namespace stoker {

namespace detail {
class Remote;
}

/// The default limit on an image file's size (ImageSourceOptions::max_file_bytes): 256 MiB, just
/// above an 8-bit RGB image of kDefaultMaxPixels stored without compression (268,435,455 bytes).
inline constexpr std::uint64_t kMaxImageFileBytes = std::uint64_t{256} << 20;

/// Where the images of a data set are and what their labels are. Immutable once made, and
/// thread-safe: share one between sources (ranks, copies) through the shared_ptr.
///
/// Images have ids 0 .. size() - 1, in a fixed order: the list's, or the folders' sorted order,
/// or the shards' in the order given and their members' in archive order.
class ImageDataset {
 public:
  /// A list file of `path label` lines (the classic `train.txt`): the label is the line's last
  /// word, a whole number 0 to 2^31 - 1; the path is everything before it, relative to the list
  /// file's folder unless absolute. Blank lines are skipped. Throws DataError naming the list and
  /// the line for a malformed line, and for a list with no image.
  ///
  /// The list may be a URL (http://, https://, s3://; docs/remote.md), and its paths too: a path
  /// in a list at a URL is a URL or relative to the list's folder there, and each image at a URL
  /// is read whole with one request, made as `remote` says (its cache is for tar shards only).
  static std::shared_ptr<const ImageDataset> from_list(const std::filesystem::path& list,
                                                       const RemoteOptions& remote = {});

  /// A folder with one subfolder per class, as torchvision's ImageFolder reads it: classes sorted
  /// by name get labels 0 .. n - 1 (classes() says which), and each class holds the .jpg, .jpeg
  /// and .png files (any case) below its subfolder, in the order os.walk gives them sorted (a
  /// folder's files, then its subfolders'). Other files are left out. Throws DataError naming the
  /// folder when it has no class subfolder, or a class has no image.
  static std::shared_ptr<const ImageDataset> from_folder(const std::filesystem::path& root);

  /// WebDataset tar shards: each sample is the members sharing a key (the name up to the first
  /// dot of its last component), one image (.jpg, .jpeg or .png) and its label (.cls: the label
  /// as decimal text). A shard's members are found from the index beside it
  /// (wds_index_path(): DALI's wds2idx format) when it is there and no older than the shard, and
  /// by reading the shard's headers otherwise. Throws DataError naming the shard for a sample
  /// without exactly one image or without a label, and for a shard with no sample.
  ///
  /// A shard may be a URL (is_url(): http://, https:// or s3://bucket/key; docs/remote.md): its
  /// index is the URL with ".idx" for ".tar" when the server has it (one request), and its
  /// headers are read otherwise (one range request each). Each image is then one range request
  /// for its bytes and its label, made as `remote` says (timeouts, retries, a cache).
  static std::shared_ptr<const ImageDataset> from_tars(const std::vector<std::filesystem::path>& shards,
                                                       const RemoteOptions& remote = {});

  /// What `path` is: a folder -> from_folder(), a file ending in ".tar" -> from_tars({path}),
  /// any other file -> from_list(). A name with braces that is not a file, or a URL with
  /// braces, stands for the shards expand_braces() makes of it ("train-{000..127}.tar"); a URL
  /// ending in ".tar" is a shard, any other a list. Throws DataError when it does not exist, a
  /// name in braces does not end in ".tar", or a URL ends in "/" (a folder at a URL cannot be
  /// listed).
  static std::shared_ptr<const ImageDataset> open(const std::filesystem::path& path, const RemoteOptions& remote = {});

  /// The images `ids` (strictly increasing, each below size()) as a data set of their own, with
  /// ids 0 .. ids.size() - 1 in that order and the same files, labels and classes: a held-out
  /// split, or the first n images. Tar shards left with no image are left out. Throws
  /// std::invalid_argument for no id, or ids out of order or out of range.
  std::shared_ptr<const ImageDataset> subset(std::span<const std::uint64_t> ids) const;

  std::uint64_t size() const noexcept { return items_.size(); }
  /// The file (list, folder) or "shard.tar:member" (tar) of image `id`, as errors name it.
  std::string name(std::uint64_t id) const;
  /// Class names, label i being classes()[i]: from the folders of from_folder(); empty otherwise.
  const std::vector<std::string>& classes() const noexcept { return classes_; }
  /// Tar shards; a list or a folder counts as one.
  std::uint32_t shards() const noexcept { return static_cast<std::uint32_t>(shard_begin_.size() - 1); }
  /// The ids of shard `s`: shard_begin(s) .. shard_begin(s + 1) - 1.
  std::uint64_t shard_begin(std::uint32_t s) const noexcept { return shard_begin_[s]; }

  /// Image `id`'s bytes, label and name, its bytes read (with pread, once, straight into a buffer
  /// of `pool`, acquired with `ctx`). Thread-safe. Throws std::out_of_range for an id not below
  /// size(), and DataError naming the file for a file that is missing or cannot be read, holds
  /// more than `max_bytes` (refused before anything is read), or a tar label that is not a number.
  EncodedImage read(std::uint64_t id, BufferPool& pool, const StageContext& ctx = {},
                    std::uint64_t max_bytes = kMaxImageFileBytes) const;

  /// Tells data sets apart, for a resumed pipeline to refuse a state taken on other data: the
  /// kind, the count and a hash of every name and label (tar: of names and member offsets).
  const std::string& fingerprint() const noexcept { return fingerprint_; }

  /// What the reads of its remote shards did so far (all zero for local data).
  RemoteCounts remote_counts() const noexcept;

  /// The tar shard that holds image `id` (0 for a list or a folder); `id` below size().
  std::uint32_t shard_of(std::uint64_t id) const noexcept { return kind_ == Kind::tar ? items_[id].shard : 0; }
  /// How many shards ahead of the one it reads a reader in shard order asks prefetch() for:
  /// RemoteOptions::prefetch where remote shards go through a cache, else 0.
  std::uint32_t prefetch_depth() const noexcept;
  /// Asks for shard `s` to be fetched into the cache in the background; nothing for a local
  /// shard, or without a cache. An ImageSource in ImageOrder::shards asks for the epoch's next
  /// prefetch_depth() shards each time it comes to a shard.
  void prefetch(std::uint32_t s) const;

 private:
  enum class Kind : std::uint8_t { list, folder, tar };
  struct Item {
    std::uint64_t name_at = 0;  // in names_
    std::uint32_t name_size = 0;
    std::int32_t label = 0;                                // list, folder
    std::uint32_t shard = 0;                               // tar
    std::uint32_t label_size = 0;                          // tar: of the .cls member
    std::uint64_t offset = 0, size = 0, label_offset = 0;  // tar
  };
  ImageDataset() = default;
  void add(std::string_view name, Item item);
  std::string_view stored_name(const Item& item) const noexcept {
    return {names_.data() + item.name_at, item.name_size};
  }
  void seal(const std::string& what);
  // A list's or a folder's image: its path, or its URL.
  std::string path_of(const Item& item) const;

  Kind kind_ = Kind::list;
  std::filesystem::path root_;                 // list, folder: what names are relative to
  std::vector<std::filesystem::path> shards_;  // tar
  std::vector<Item> items_;
  std::string names_;
  std::vector<std::string> classes_;
  std::vector<std::uint64_t> shard_begin_{0};
  std::string fingerprint_;
  std::shared_ptr<const detail::Remote> remote_;  // remote shards: how they are read
  std::vector<std::uint64_t> shard_bytes_;        // tar: each remote shard's size, 0 for a local one
};

/// In what order an epoch reads a data set.
enum class ImageOrder : std::uint8_t {
  /// Each epoch a new random order of all images, drawn from the pipeline's seed and the epoch.
  shuffle,
  /// Each epoch a new random order of the tar shards, each shard read front to back: reads move
  /// forward through each file, as WebDataset's do. Mix with a shuffle buffer after decoding.
  /// A list or a folder is one shard, so this is `fixed` for them.
  shards,
  /// The data set's order every epoch: for evaluation.
  fixed,
};

/// Where a run that goes on from the middle of an epoch starts it, when the caller keeps count of
/// what was taken (a loader's own resume, PipelineBuilder::first_epoch): the first `taken`
/// positions of epoch `epoch`'s order were taken before, by any number of ranks.
struct EpochCut {
  std::uint32_t epoch = 0;
  std::uint64_t taken = 0;
};

struct ImageSourceOptions {
  ShardOptions shard{};  ///< this rank's share: the epoch's k-th image goes to rank k % world
  /// A file (or tar member) larger than this is a DataError naming it, refused before it is read,
  /// as the decoder's DecodeOptions::max_pixels refuses a header that claims too many pixels.
  std::uint64_t max_file_bytes = kMaxImageFileBytes;
  ImageOrder order = ImageOrder::shuffle;
  std::shared_ptr<BufferPool> pool = nullptr;  ///< where the files' bytes go; null: a pool of its own
  /// In that epoch only the rest of its order, dealt to the ranks as a whole epoch is (the k-th
  /// image of the rest to rank k % world, the remainder dropped or padded from the rest's first):
  /// the same images in the same epoch, whatever the ranks were and are. Other epochs are whole.
  std::optional<EpochCut> resume_at{};
};

/// A pipeline source of one rank's images, as EncodedImage (bytes, label, id, name), for a map
/// stage to decode on many threads:
///
///   auto data = stoker::ImageDataset::open("train.txt");
///   auto pipe = stoker::PipelineBuilder{}
///                   .source("read", stoker::ImageSource(data, {.shard = {.rank = r, .world = w}}))
///                   .map("decode", stoker::ImageDecoder(), {.threads = 4})
///                   ...
///
/// Every epoch, each image reaches exactly one rank (Remainder::drop leaves out `size % world` of
/// them, Remainder::pad sends those to a second rank), and every rank gets as many. Reading is
/// this stage's work: one file (or tar member) per call, read once with pread into a recycled
/// buffer. Resumable (Pipeline::state): which image a call reads follows from the pipeline's seed,
/// the epoch and the call's index alone, so seek() has nothing to do, and no shard is read from
/// its start to get there.
class ImageSource {
 public:
  /// Throws std::invalid_argument naming the option when the ranks are impossible, or
  /// `resume_at` takes the whole data set or more.
  explicit ImageSource(std::shared_ptr<const ImageDataset> data, ImageSourceOptions options = {});

  /// Images this rank reads per epoch (a whole one's: see size_of(epoch)).
  std::uint64_t size() const noexcept { return per_rank_; }
  /// Images this rank reads in epoch `epoch`: size(), but in the epoch of `resume_at`.
  std::uint64_t size_of(std::uint32_t epoch) const noexcept;
  /// The id of this rank's k-th image in epoch `epoch` of a pipeline seeded with `seed`
  /// (ImageOrder::shards: O(shards) per call, where the source itself keeps the epoch's plan).
  std::uint64_t id_at(std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const;

  std::optional<EncodedImage> operator()(const StageContext& ctx);
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const;

  const ImageDataset& dataset() const noexcept { return *data_; }
  const std::shared_ptr<BufferPool>& pool() const noexcept { return options_.pool; }

 private:
  // ImageOrder::shards: the shards of one epoch in their drawn order, and where each starts in
  // the epoch's order of images.
  struct ShardPlan {
    std::uint64_t seed = 0;
    std::uint32_t epoch = 0;
    std::vector<std::uint32_t> order;
    std::vector<std::uint64_t> starts;
  };
  ShardPlan plan(std::uint64_t seed, std::uint32_t epoch) const;
  std::uint64_t id_in(const ShardPlan* plan, std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const;

  std::shared_ptr<const ImageDataset> data_;
  ImageSourceOptions options_;
  std::uint64_t per_rank_ = 0;
  std::optional<ShardPlan> plan_;  // the current epoch's, for ImageOrder::shards
  std::optional<std::uint32_t> at_shard_;  // the shard the last read was in, for prefetch()
};

}  // namespace stoker
