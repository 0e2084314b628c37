// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/image_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <system_error>

#include "remote_io.h"
#include "stoker/core/random.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/tar.h"
#include "tar_io.h"

namespace stoker {

namespace {

namespace fs = std::filesystem;

// Which folder a path is, links followed: its device and inode.
using FolderId = std::pair<dev_t, ino_t>;
FolderId folder_id(const fs::path& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0)
    throw DataError(folder.string(), std::string("cannot stat: ") + std::strerror(errno));
  return {st.st_dev, st.st_ino};
}

bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A label: a whole number 0 to 2^31 - 1, as decimal text, with white space around it.
std::optional<std::int32_t> parse_label(std::string_view text) noexcept {
  text = trim(text);
  std::int32_t label = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), label);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || label < 0) return std::nullopt;
  return label;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool image_extension(const fs::path& file) {
  const std::string ext = lower(file.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

bool image_member(std::string_view ext) {
  const std::string e = lower(ext);
  return e == "jpg" || e == "jpeg" || e == "png";
}

std::string hex(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

void ImageDataset::add(std::string_view name, Item item) {
  item.name_at = names_.size();
  item.name_size = static_cast<std::uint32_t>(name.size());
  names_.append(name);
  items_.push_back(item);
}

void ImageDataset::seal(const std::string& what) {
  if (kind_ != Kind::tar) shard_begin_ = {0, items_.size()};
  std::uint64_t hash = hash_name(what.substr(0, what.find(' ')));
  for (const auto& item : items_)
    hash = derive_seed(hash, hash_name(stored_name(item)),
                       kind_ == Kind::tar ? item.offset : static_cast<std::uint64_t>(item.label));
  names_.shrink_to_fit();
  items_.shrink_to_fit();
  fingerprint_ = what + ": " + std::to_string(items_.size()) + " images, hash " + hex(hash);
}

std::shared_ptr<const ImageDataset> ImageDataset::from_list(const fs::path& list, const RemoteOptions& remote) {
  const std::string name = list.string();
  const bool at_url = is_url(name);
  std::shared_ptr<const detail::Remote> fetcher;
  std::vector<std::byte> bytes;
  if (at_url) {
    constexpr std::uint64_t kMaxListBytes = std::uint64_t{1} << 30;
    fetcher = std::make_shared<const detail::Remote>(remote);
    bytes = std::move(*fetcher->read_all(name, kMaxListBytes, /*missing_ok=*/false));
  } else {
    bytes = detail::read_file(list);
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  // An image given where a list was expected (open() on a file): say so, not "line 1 has no label".
  const auto starts = [&](std::string_view magic) { return text.substr(0, magic.size()) == magic; };
  const char* image = starts("\xff\xd8\xff") ? "a JPEG image" : starts("\x89PNG\r\n\x1a\n") ? "a PNG image" : nullptr;
  if (image != nullptr || text.substr(0, 4096).find('\0') != std::string_view::npos)
    throw DataError(name, std::string("is not a list of `path label` lines: it is ") + (image ? image : "binary") +
                              " (ImageDataset::open takes a folder of class folders, a .tar shard or a list file)");
  if (starts("\xef\xbb\xbf")) text.remove_prefix(3);  // a UTF-8 byte order mark, as some editors write
  std::shared_ptr<ImageDataset> data(new ImageDataset());
  data->kind_ = Kind::list;
  data->root_ = at_url ? fs::path(name.substr(0, name.rfind('/'))) : list.parent_path();
  std::size_t line_number = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = trim(text.substr(at, end - at));
    at = end + 1;
    ++line_number;
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(line_number) + ": ";
    const auto space = std::find_if(line.rbegin(), line.rend(), is_space);
    if (space == line.rend())
      throw DataError(name, where + "'" + std::string(line) + "' has no label: expected '<path> <label>'");
    const std::string_view word = line.substr(static_cast<std::size_t>(line.rend() - space));
    const auto label = parse_label(word);
    if (!label)
      throw DataError(name, where + "label '" + std::string(word) +
                                "' is not a whole number from 0 to 2147483647: expected '<path> <label>'");
    const std::string_view path = trim(line.substr(0, static_cast<std::size_t>(line.rend() - space)));
    if (is_url(path) && !fetcher) fetcher = std::make_shared<const detail::Remote>(remote);
    if (at_url && !is_url(path) && path.starts_with('/'))
      throw DataError(name, where + "'" + std::string(path) +
                                "': a path in a list at a URL is a URL or relative to the list's folder");
    data->add(path, Item{.label = *label});
  }
  data->remote_ = std::move(fetcher);
  if (data->items_.empty()) throw DataError(name, "the list names no image");
  data->seal("list " + name);
  return data;
}

std::shared_ptr<const ImageDataset> ImageDataset::from_folder(const fs::path& root) {
  const std::string name = root.string();
  std::error_code error;
  if (!fs::is_directory(root, error)) throw DataError(name, "is not a folder");
  // A folder's entries, files and subfolders apart, each sorted by name (os.walk, sorted). The
  // kind comes from the listing (a stat only for a link). An entry whose kind cannot be known (a
  // dangling link, no permission) is, as for ImageFolder, a file: left out, unless its name is
  // an image's, which cannot be read, named.
  const auto entries = [&](const fs::path& dir, std::vector<std::string>& files, std::vector<std::string>& dirs) {
    std::error_code e;
    for (fs::directory_iterator it(dir, e), end; !e && it != end; it.increment(e)) {
      const auto& entry = *it;
      std::error_code kind;
      if (entry.is_directory(kind)) {
        dirs.push_back(entry.path().filename().string());
      } else if (kind) {
        if (image_extension(entry.path()))
          throw DataError(entry.path().string(), "cannot tell a file from a folder: " + kind.message());
      } else if (entry.is_regular_file(kind)) {
        files.push_back(entry.path().filename().string());
      }
    }
    if (e) throw DataError(dir.string(), "cannot list the folder: " + e.message());
    std::sort(files.begin(), files.end());
    std::sort(dirs.begin(), dirs.end());
  };
  std::shared_ptr<ImageDataset> data(new ImageDataset());
  data->kind_ = Kind::folder;
  data->root_ = root;
  std::vector<std::string> top_files, classes;
  entries(root, top_files, classes);
  if (classes.empty()) throw DataError(name, "has no class subfolder (expected <root>/<class>/<image>)");
  for (std::size_t label = 0; label < classes.size(); ++label) {
    const std::uint64_t before = data->items_.size();
    // Every folder below the class folder, its images sorted by name, the folders sorted by
    // their paths: ImageFolder's order (sorted(os.walk(...)), where "a-b" comes before "a/x").
    // Symbolic links are followed, as ImageFolder does, but a folder that is one of its own
    // ancestors (a link to `.` or above) is a loop, named; `path` holds the folders from the
    // class folder down.
    std::vector<std::pair<fs::path, FolderId>> path;
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;  // relative path, images
    const auto walk = [&](const auto& self, const fs::path& relative) -> void {
      const FolderId id = folder_id(root / relative);
      for (const auto& [above, above_id] : path)
        if (above_id == id)
          throw DataError((root / relative).string(),
                          "is a loop of symbolic links: the folder is " + (root / above).string() + ", which holds it");
      path.emplace_back(relative, id);
      std::vector<std::string> files, dirs;
      entries(root / relative, files, dirs);
      std::erase_if(files, [](const std::string& f) { return !image_extension(f); });
      folders.emplace_back(relative.generic_string(), std::move(files));
      for (const auto& d : dirs) self(self, relative / d);
      path.pop_back();
    };
    walk(walk, classes[label]);
    std::sort(folders.begin(), folders.end());
    for (const auto& [folder, files] : folders)
      for (const auto& f : files) data->add(folder + "/" + f, Item{.label = static_cast<std::int32_t>(label)});
    if (data->items_.size() == before)
      throw DataError((root / classes[label]).string(),
                      "class '" + classes[label] + "' has no image (.jpg, .jpeg or .png file)");
  }
  data->classes_ = std::move(classes);
  data->seal("folder " + name);
  return data;
}

namespace {

// A remote shard's members: from its index when the server has one, else from its headers.
// Every member must lie inside the shard: an index of another version of it is refused here,
// not met as a failed read later.
std::vector<TarMember> remote_members(const detail::RemoteFile& shard, const detail::Remote& remote) {
  constexpr std::uint64_t kMaxIndexBytes = std::uint64_t{1} << 30;
  const std::string index = wds_index_path(shard.name()).string();
  const auto bytes = remote.read_all(index, kMaxIndexBytes, /*missing_ok=*/true);
  if (!bytes) {  // its headers: from the cache where there is one (one fetch), else a request each
    if (const auto local = remote.cached(shard.name(), shard.size(), {})) return detail::list_tar(*local);
    return detail::list_tar(shard);
  }
  auto members = detail::parse_wds_index(*bytes, index);
  for (const TarMember& m : members)
    if (m.offset > shard.size() || m.size > shard.size() - m.offset)
      throw DataError(index, "lists member " + m.name + " at bytes " + std::to_string(m.offset) + ".." +
                                 std::to_string(m.offset + m.size) + ", past the end of " + shard.name() + " (" +
                                 std::to_string(shard.size()) + " bytes): is it the index of another version?");
  return members;
}

}  // namespace

std::shared_ptr<const ImageDataset> ImageDataset::from_tars(const std::vector<fs::path>& shards,
                                                            const RemoteOptions& remote) {
  if (shards.empty()) throw std::invalid_argument("ImageDataset::from_tars: no shard given");
  std::shared_ptr<ImageDataset> data(new ImageDataset());
  data->kind_ = Kind::tar;
  data->shards_ = shards;
  data->shard_begin_ = {0};
  data->shard_bytes_.assign(shards.size(), 0);
  for (std::uint32_t s = 0; s < shards.size(); ++s) {
    const fs::path& shard = shards[s];
    const std::string name = shard.string();
    std::vector<TarMember> members;
    if (is_url(name)) {
      if (!data->remote_) data->remote_ = std::make_shared<const detail::Remote>(remote);
      const detail::RemoteFile file(data->remote_, name);
      data->shard_bytes_[s] = file.size();
      members = remote_members(file, *data->remote_);
    } else {
      std::error_code e1, e2;
      const fs::path index = wds_index_path(shard);
      const bool indexed =
          fs::exists(index, e1) && fs::last_write_time(index, e1) >= fs::last_write_time(shard, e2) && !e1 && !e2;
      members = indexed ? read_wds_index(index) : list_tar(shard);
    }
    // A sample is a run of members with one key.
    for (std::size_t i = 0; i < members.size();) {
      const std::string_view key = split_wds_name(members[i].name).first;
      const TarMember *image = nullptr, *label = nullptr;
      std::size_t j = i;
      for (; j < members.size() && split_wds_name(members[j].name).first == key; ++j) {
        const std::string_view ext = split_wds_name(members[j].name).second;
        if (image_member(ext)) {
          if (image)
            throw DataError(
                name, "sample '" + std::string(key) + "' has two images, " + image->name + " and " + members[j].name);
          image = &members[j];
        } else if (ext == "cls") {
          label = &members[j];
        }
      }
      if (!image && !label) {  // no sample: other members (__meta__.json, a README) are left out
        i = j;
        continue;
      }
      if (!image) throw DataError(name, "sample '" + std::string(key) + "' has no image (.jpg, .jpeg or .png)");
      if (!label) throw DataError(name, "sample '" + std::string(key) + "' has no label (.cls)");
      data->add(image->name,
                Item{.shard = s,
                     .label_size = static_cast<std::uint32_t>(std::min<std::uint64_t>(label->size, 1u << 20)),
                     .offset = image->offset,
                     .size = image->size,
                     .label_offset = label->offset});
      i = j;
    }
    if (data->items_.size() == data->shard_begin_.back()) throw DataError(name, "holds no sample");
    data->shard_begin_.push_back(data->items_.size());
  }
  data->seal("tar " + shards.front().string() +
             (shards.size() > 1 ? " and " + std::to_string(shards.size() - 1) + " more" : ""));
  return data;
}

std::shared_ptr<const ImageDataset> ImageDataset::open(const fs::path& path, const RemoteOptions& remote) {
  const std::string where = path.string();
  std::error_code error;
  const auto status = fs::status(path, error);
  const bool url = is_url(where);
  if (url && where.find('{') == std::string::npos && !lower(where).ends_with(".tar")) {
    if (where.ends_with('/'))
      throw DataError(where, "is a folder at a URL, which cannot be listed: give a list file or tar shards there");
    return from_list(path, remote);
  }
  if (url || (!fs::exists(status) && where.find('{') != std::string::npos)) {
    std::vector<fs::path> shards;
    for (auto& name : expand_braces(where)) {
      if (!lower(name).ends_with(".tar"))
        throw DataError(where, "names in braces must be tar shards (ending in .tar), and '" + name + "' is not");
      shards.emplace_back(std::move(name));
    }
    return from_tars(shards, remote);
  }
  if (!fs::exists(status)) throw DataError(where, "does not exist");
  if (fs::is_directory(status)) return from_folder(path);
  if (lower(path.extension().string()) == ".tar") return from_tars({path}, remote);
  return from_list(path);
}

RemoteCounts ImageDataset::remote_counts() const noexcept { return remote_ ? remote_->counts() : RemoteCounts{}; }

std::uint32_t ImageDataset::prefetch_depth() const noexcept {
  return remote_ && remote_->prefetches() ? remote_->options().prefetch : 0;
}

void ImageDataset::prefetch(std::uint32_t s) const {
  if (kind_ == Kind::tar && s < shards_.size() && is_url(shards_[s].string()) && remote_)
    remote_->prefetch(shards_[s].string(), shard_bytes_[s]);
}

std::shared_ptr<const ImageDataset> ImageDataset::subset(std::span<const std::uint64_t> ids) const {
  if (ids.empty()) throw std::invalid_argument("ImageDataset::subset: no image asked for");
  std::shared_ptr<ImageDataset> data(new ImageDataset());
  data->kind_ = kind_;
  data->root_ = root_;
  data->classes_ = classes_;
  data->shard_begin_ = {0};
  data->remote_ = remote_;
  std::uint32_t last_shard = 0;  // of this data set, for the image before
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::uint64_t id = ids[k];
    if (id >= size() || (k > 0 && id <= ids[k - 1]))
      throw std::invalid_argument("ImageDataset::subset: id " + std::to_string(id) + " at " + std::to_string(k) +
                                  (id >= size() ? " is not below the data set's " + std::to_string(size()) + " images"
                                                : " does not follow " + std::to_string(ids[k - 1])));
    Item item = items_[id];
    if (kind_ == Kind::tar) {  // ids increase, so shards come in order: number those that keep an image
      if (data->shards_.empty() || item.shard != last_shard) {
        if (!data->shards_.empty()) data->shard_begin_.push_back(data->items_.size());
        data->shards_.push_back(shards_[item.shard]);
        data->shard_bytes_.push_back(shard_bytes_[item.shard]);
        last_shard = item.shard;
      }
      item.shard = static_cast<std::uint32_t>(data->shards_.size() - 1);
    }
    data->add(stored_name(items_[id]), item);
  }
  if (kind_ == Kind::tar) data->shard_begin_.push_back(data->items_.size());
  // "list data/train.txt (subset): 500 images, hash ...": the hash is of the subset's names and labels.
  std::string what = fingerprint_.substr(0, fingerprint_.rfind(": "));
  if (!what.ends_with(" (subset)")) what += " (subset)";
  data->seal(what);
  return data;
}

std::string ImageDataset::name(std::uint64_t id) const {
  if (id >= size())
    throw std::out_of_range("image id " + std::to_string(id) + " is out of range: the data set has " +
                            std::to_string(size()) + " images");
  const Item& item = items_[id];
  if (kind_ == Kind::tar) return shards_[item.shard].string() + ":" + std::string(stored_name(item));
  return path_of(item);
}

std::string ImageDataset::path_of(const Item& item) const {
  const std::string_view stored = stored_name(item);
  if (is_url(stored)) return std::string(stored);
  if (is_url(root_.native())) return root_.native() + "/" + std::string(stored);
  return (root_ / fs::path(stored)).string();
}

EncodedImage ImageDataset::read(std::uint64_t id, BufferPool& pool, const StageContext& ctx,
                                std::uint64_t max_bytes) const {
  EncodedImage out;
  out.name = name(id);  // throws for a bad id
  out.id = id;
  const Item& item = items_[id];
  const auto check_size = [&](std::uint64_t size) {
    if (size > max_bytes)
      throw DataError(out.name, "holds " + std::to_string(size) + " bytes, over the limit of " +
                                    std::to_string(max_bytes) + " (ImageSourceOptions::max_file_bytes): not read");
  };
  if (kind_ != Kind::tar && is_url(out.name)) {  // one request for the whole object
    std::vector<std::byte> body;
    {
      const detail::TurnReleased waiting(ctx);  // the network: no turn of a ThreadBudget held meanwhile
      body = std::move(*remote_->read_all(out.name, max_bytes, /*missing_ok=*/false, ctx.stop));
    }
    out.data = pool.acquire(body.size(), ctx);
    std::memcpy(out.data.data(), body.data(), body.size());
    out.label = item.label;
    return out;
  }
  if (kind_ != Kind::tar) {
    const detail::InputFile file(out.name);
    check_size(file.size());
    out.data = pool.acquire(file.size(), ctx);
    file.read_at(0, {out.data.data(), out.data.size()});
    out.label = item.label;
    return out;
  }
  const std::string shard = shards_[item.shard].string();
  std::unique_ptr<const detail::RandomAccessFile> opened;
  bool remote = false;  // read by requests, not from a local file or a cached copy
  if (!is_url(shard)) {
    opened = std::make_unique<const detail::InputFile>(shards_[item.shard]);
  } else {
    // A wait for the network (or for another's fetch), not this call's computing: no turn of a
    // ThreadBudget is held meanwhile. Its scope ends after the cache's locks are let go.
    const detail::TurnReleased waiting(ctx);
    if (!(opened = remote_->cached(shard, shard_bytes_[item.shard], ctx.stop))) {
      opened = std::make_unique<const detail::RemoteFile>(remote_, shard, shard_bytes_[item.shard]);
      remote = true;
    }
  }
  const detail::RandomAccessFile& file = *opened;
  const auto read_at = [&](std::uint64_t offset, std::span<std::byte> bytes) {
    if (!remote) return file.read_at(offset, bytes, ctx.stop);
    const detail::TurnReleased waiting(ctx);  // as above
    file.read_at(offset, bytes, ctx.stop);    // gives up on a stop
  };
  const auto past_end = [&](std::uint64_t offset, std::uint64_t size) {  // offset + size, without wrapping
    return offset > file.size() || size > file.size() - offset;
  };
  if (past_end(item.offset, item.size) || past_end(item.label_offset, item.label_size))
    throw DataError(out.name, "lies past the end of the shard (" + std::to_string(file.size()) +
                                  " bytes): was the shard changed after it was indexed?");
  if (item.label_size > 64)
    throw DataError(out.name, "its .cls label is " + std::to_string(item.label_size) + " bytes long");
  check_size(item.size);
  const auto set_label = [&](const char* label) {
    const auto parsed = parse_label({label, item.label_size});
    if (!parsed)
      throw DataError(out.name, "its .cls label '" + std::string(label, item.label_size) +
                                    "' is not a whole number from 0 to 2147483647");
    out.label = *parsed;
  };
  out.data = pool.acquire(item.size, ctx);
  // A request costs far more than a few bytes more in it: a remote image and its label, which
  // tar shards keep side by side, come in one, the bytes between them (a header) dropped.
  constexpr std::uint64_t kJoinGap = 4096;
  const std::uint64_t first = std::min(item.offset, item.label_offset);
  const std::uint64_t end = std::max(item.offset + item.size, item.label_offset + item.label_size);
  if (remote && end - first <= item.size + kJoinGap) {
    Buffer both = pool.acquire(end - first, ctx);
    read_at(first, {both.data(), both.size()});
    set_label(reinterpret_cast<const char*>(both.data() + (item.label_offset - first)));
    std::memcpy(out.data.data(), both.data() + (item.offset - first), item.size);
    return out;
  }
  char label[64];
  read_at(item.label_offset, std::as_writable_bytes(std::span(label, item.label_size)));
  set_label(label);
  read_at(item.offset, {out.data.data(), out.data.size()});
  return out;
}

ImageSource::ImageSource(std::shared_ptr<const ImageDataset> data, ImageSourceOptions options)
    : data_(std::move(data)), options_(std::move(options)) {
  if (!data_) throw std::invalid_argument("ImageSource: no data set");
  options_.shard.check("ImageSource");
  if (!options_.pool) options_.pool = BufferPool::create();
  per_rank_ = options_.shard.per_rank(data_->size());
  if (options_.resume_at && options_.resume_at->taken >= data_->size())
    throw std::invalid_argument("ImageSource: resume_at.taken (" + std::to_string(options_.resume_at->taken) +
                                ") leaves nothing of the data set's " + std::to_string(data_->size()) +
                                " images: it must be below their number");
}

std::uint64_t ImageSource::size_of(std::uint32_t epoch) const noexcept {
  const auto& cut = options_.resume_at;
  return cut && cut->epoch == epoch ? options_.shard.per_rank(data_->size() - cut->taken) : per_rank_;
}

ImageSource::ShardPlan ImageSource::plan(std::uint64_t seed, std::uint32_t epoch) const {
  ShardPlan p{seed, epoch, {}, {}};
  const std::uint32_t n = data_->shards();
  const Permutation order(n, derive_seed(seed, epoch, hash_name("ImageSource shards")));
  std::uint64_t start = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::uint32_t>(order(i));
    p.order.push_back(s);
    p.starts.push_back(start);
    start += data_->shard_begin(s + 1) - data_->shard_begin(s);
  }
  return p;
}

std::uint64_t ImageSource::id_in(const ShardPlan* p, std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const {
  const std::uint64_t n = data_->size();
  const auto& cut = options_.resume_at;
  const std::uint64_t j =
      cut && cut->epoch == epoch ? cut->taken + options_.shard.place(n - cut->taken, k) : options_.shard.place(n, k);
  switch (options_.order) {
    case ImageOrder::fixed:
      return j;
    case ImageOrder::shuffle:
      return Permutation(n, derive_seed(seed, epoch, hash_name("ImageSource")))(j);
    case ImageOrder::shards:
      break;
  }
  const auto i =
      static_cast<std::size_t>(std::upper_bound(p->starts.begin(), p->starts.end(), j) - p->starts.begin() - 1);
  return data_->shard_begin(p->order[i]) + (j - p->starts[i]);
}

std::uint64_t ImageSource::id_at(std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const {
  if (options_.order != ImageOrder::shards) return id_in(nullptr, seed, epoch, k);
  const ShardPlan p = plan(seed, epoch);
  return id_in(&p, seed, epoch, k);
}

std::optional<EncodedImage> ImageSource::operator()(const StageContext& ctx) {
  if (ctx.index >= size_of(ctx.epoch)) return std::nullopt;
  if (options_.order == ImageOrder::shards && (!plan_ || plan_->seed != ctx.seed || plan_->epoch != ctx.epoch))
    plan_ = plan(ctx.seed, ctx.epoch);
  const std::uint64_t id = id_in(plan_ ? &*plan_ : nullptr, ctx.seed, ctx.epoch, ctx.index);
  // Come to a shard in shard order: the epoch's next ones are fetched meanwhile.
  if (const std::uint32_t depth = plan_ ? data_->prefetch_depth() : 0; depth > 0 && at_shard_ != data_->shard_of(id)) {
    at_shard_ = data_->shard_of(id);
    const auto here = std::find(plan_->order.begin(), plan_->order.end(), *at_shard_);
    for (auto next = here + 1; next != plan_->order.end() && next - here <= depth; ++next) data_->prefetch(*next);
  }
  return data_->read(id, *options_.pool, ctx, options_.max_file_bytes);
}

std::string ImageSource::fingerprint() const {
  static constexpr const char* kOrder[] = {"shuffled", "shards shuffled", "in order"};
  return data_->fingerprint() + ", rank " + std::to_string(options_.shard.rank) + " of " +
         std::to_string(options_.shard.world) +
         (options_.shard.remainder == Remainder::drop ? ", remainder dropped, " : ", padded, ") +
         kOrder[static_cast<int>(options_.order)] +
         (options_.resume_at ? ", epoch " + std::to_string(options_.resume_at->epoch) + " from position " +
                                   std::to_string(options_.resume_at->taken)
                             : std::string());
}

}  // namespace stoker
