// SPDX-License-Identifier: Apache-2.0
// Image files from Python: data sets of image files, the source that reads their bytes, the
// decoders and the colour image transforms, with the C++ names and the option structs' fields as
// keyword arguments. Option structs that another option holds (RandomResizedCropOptions in
// DecodeCropWindow's `crop`, DecodeOptions in its `decode`, ShardOptions in ImageSource's `shard`)
// are classes of their own, so that a call reads as the C++ one.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "stoker/stages/decode_crop.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/image_transforms.h"
#include "stoker/stages/mix.h"
#include "stoker/stages/remote.h"
#include "stoker/stages/shard.h"

namespace stoker::python {

namespace {

ImageColor parse_color(std::string_view name) {
  return parse_choice<ImageColor>(name, "color", {{"rgb", ImageColor::rgb}, {"gray", ImageColor::gray}});
}
const char* color_name(ImageColor c) noexcept { return c == ImageColor::gray ? "gray" : "rgb"; }

std::optional<Layout> parse_optional_layout(const std::optional<std::string>& name) {
  return name ? std::optional(parse_layout(*name, "layout")) : std::nullopt;
}

CropSize parse_optional_size(const std::optional<SizeArg>& size, const char* option) {
  return size ? parse_crop_size(size->value, option) : CropSize{};
}

std::string optional_normalizer_repr(const std::optional<Normalization>& n) {
  return n ? py::repr(py::cast(Normalizer(*n))).cast<std::string>() : std::string("None");
}

// The data sets' factories give shared_ptr<const ImageDataset>, which Python holds as a
// shared_ptr<ImageDataset> with no method that changes it.
std::shared_ptr<ImageDataset> held(std::shared_ptr<const ImageDataset> d) {
  return std::const_pointer_cast<ImageDataset>(std::move(d));
}

// RandomResizedCrop and RandomResizedCropOptions take the same keyword arguments.
RandomResizedCropOptions crop_options(const SizeArg& size, std::array<double, 2> scale, std::array<double, 2> ratio,
                                      int attempts, bool antialias, const py::object& mirror,
                                      const std::optional<Normalizer>& normalize,
                                      const std::optional<std::string>& layout, std::shared_ptr<BufferPool> pool,
                                      std::uint64_t salt) {
  return {.size = parse_crop_size(size.value, "size"),
          .scale = scale,
          .ratio = ratio,
          .attempts = attempts,
          .antialias = antialias,
          .mirror = parse_mirror(mirror),
          .normalize = parse_normalize(normalize),
          .layout = parse_optional_layout(layout),
          .pool = std::move(pool),
          .salt = salt};
}

std::string crop_repr(const char* name, const RandomResizedCropOptions& o) {
  return repr_of(name, {{"size", size_tuple(o.size)},
                        {"scale", py::make_tuple(o.scale[0], o.scale[1])},
                        {"ratio", py::make_tuple(o.ratio[0], o.ratio[1])},
                        {"mirror", o.mirror ? py::cast(*o.mirror) : py::none()}}) +
         (o.normalize ? " normalized by " + optional_normalizer_repr(o.normalize) : std::string());
}

#define STOKER_RESIZED_CROP_ARGS                                                                                   \
  py::arg("size"), py::arg("scale") = std::array<double, 2>{0.08, 1.0},                                            \
                   py::arg("ratio") = std::array<double, 2>{3.0 / 4.0, 4.0 / 3.0}, py::arg("attempts") = 10,       \
                   py::arg("antialias") = true, py::arg("mirror") = py::none(), py::arg("normalize") = py::none(), \
                   py::arg("layout") = py::none(), py::arg("pool") = nullptr, py::arg("salt") = kResizedCropSalt

// DecodeCropWindow and DecodeResizedCrop take the same keyword arguments.
DecodeResizedCropOptions decode_crop_options(const RandomResizedCropOptions& crop, const DecodeOptions& decode,
                                             bool dct_scaling, std::shared_ptr<BufferPool> scratch) {
  return {.crop = crop, .decode = decode, .dct_scaling = dct_scaling, .scratch = std::move(scratch)};
}

#define STOKER_DECODE_CROP_ARGS \
  py::arg("crop"), py::arg("decode") = DecodeOptions{}, py::arg("dct_scaling") = true, py::arg("scratch") = nullptr

}  // namespace

void bind_images(py::module_& m) {
  py::class_<RemoteOptions>(m, "RemoteOptions", R"(How a data set's remote shards (http://, https://, s3://) are
read (docs/remote.md): a request's timeout (seconds), retries with backoff (seconds, full jitter) on
timeouts, dropped connections, 429 and 5xx, a retry budget for the data set, the https
certificates (ca_file), a cache of whole shards on the local disk (cache_dir, cache_bytes: both
or neither), how many shards ahead are fetched into it in shard order (prefetch), and the most
bytes of answers in flight at once (max_bytes_in_flight).)")
      .def(py::init([](double timeout, int retries, double backoff, double max_backoff, std::uint64_t retry_budget,
                       const std::string& ca_file, std::optional<std::filesystem::path> cache_dir,
                       std::uint64_t cache_bytes, std::uint32_t prefetch, std::uint64_t max_bytes_in_flight) {
             const auto ms = [](double seconds, const char* name) {
               if (!(seconds >= 0 && seconds < 1e9))
                 throw py::value_error(std::string("RemoteOptions: ") + name +
                                       " must be a number of seconds, 0 or more");
               return std::chrono::milliseconds(static_cast<long long>(seconds * 1000 + 0.5));
             };
             if (cache_dir.has_value() != (cache_bytes != 0))
               throw py::value_error("RemoteOptions: cache_dir and cache_bytes go together (a folder and its budget)");
             RemoteOptions o;
             o.timeout = ms(timeout, "timeout");
             o.retries = retries;
             o.backoff = ms(backoff, "backoff");
             o.max_backoff = ms(max_backoff, "max_backoff");
             o.retry_budget = retry_budget;
             o.ca_file = ca_file;
             o.cache_dir = cache_dir.value_or(std::filesystem::path());
             o.cache_bytes = cache_bytes;
             o.prefetch = prefetch;
             o.max_bytes_in_flight = max_bytes_in_flight;
             return o;
           }),
           py::kw_only(), py::arg("timeout") = 30.0, py::arg("retries") = 5, py::arg("backoff") = 0.1,
           py::arg("max_backoff") = 10.0, py::arg("retry_budget") = 1000, py::arg("ca_file") = "",
           py::arg("cache_dir") = py::none(), py::arg("cache_bytes") = 0,
           py::arg("prefetch") = RemoteOptions{}.prefetch,
           py::arg("max_bytes_in_flight") = RemoteOptions{}.max_bytes_in_flight)
      .def_property_readonly("timeout", [](const RemoteOptions& o) { return o.timeout.count() / 1e3; })
      .def_readonly("retries", &RemoteOptions::retries)
      .def_property_readonly("backoff", [](const RemoteOptions& o) { return o.backoff.count() / 1e3; })
      .def_property_readonly("max_backoff", [](const RemoteOptions& o) { return o.max_backoff.count() / 1e3; })
      .def_readonly("retry_budget", &RemoteOptions::retry_budget)
      .def_readonly("ca_file", &RemoteOptions::ca_file)
      .def_property_readonly("cache_dir",
                             [](const RemoteOptions& o) -> std::optional<std::filesystem::path> {
                               if (o.cache_dir.empty()) return std::nullopt;
                               return o.cache_dir;
                             })
      .def_readonly("cache_bytes", &RemoteOptions::cache_bytes)
      .def_readonly("prefetch", &RemoteOptions::prefetch)
      .def_readonly("max_bytes_in_flight", &RemoteOptions::max_bytes_in_flight)
      .def("__repr__", [](const RemoteOptions& o) {
        return repr_of("RemoteOptions",
                       {{"timeout", py::float_(o.timeout.count() / 1e3)},
                        {"retries", py::int_(o.retries)},
                        {"backoff", py::float_(o.backoff.count() / 1e3)},
                        {"max_backoff", py::float_(o.max_backoff.count() / 1e3)},
                        {"retry_budget", py::int_(o.retry_budget)},
                        {"ca_file", py::str(o.ca_file)},
                        {"cache_dir", o.cache_dir.empty() ? py::object(py::none()) : py::cast(o.cache_dir)},
                        {"cache_bytes", py::int_(o.cache_bytes)},
                        {"prefetch", py::int_(o.prefetch)},
                        {"max_bytes_in_flight", py::int_(o.max_bytes_in_flight)}});
      });

  py::class_<ImageDataset, std::shared_ptr<ImageDataset>>(m, "ImageDataset", R"(Where the images of a data set
are and what their labels are: a list file of `path label` lines, a folder per class, or
WebDataset tar shards. Images have ids 0 .. len - 1. Immutable: share one between sources.
Opening one reads folders or tar headers without the GIL.)")
      .def_static(
          "open",
          [](const std::filesystem::path& path, const RemoteOptions& remote) {
            return held(ImageDataset::open(path, remote));
          },
          py::arg("path"), py::arg("remote") = RemoteOptions{}, py::call_guard<py::gil_scoped_release>(),
          "A folder (from_folder), a .tar file (from_tars) or a list file (from_list); a URL or a name with "
          "braces stands for tar shards, read as `remote` says.")
      .def_static(
          "from_list",
          [](const std::filesystem::path& list, const RemoteOptions& remote) {
            return held(ImageDataset::from_list(list, remote));
          },
          py::arg("list"), py::arg("remote") = RemoteOptions{}, py::call_guard<py::gil_scoped_release>(),
          "`path label` lines, paths relative to the list's folder unless absolute; the list and its paths "
          "may be URLs, read as `remote` says.")
      .def_static(
          "from_folder", [](const std::filesystem::path& root) { return held(ImageDataset::from_folder(root)); },
          py::arg("root"), py::call_guard<py::gil_scoped_release>(),
          "A subfolder per class, as torchvision's ImageFolder: labels in the classes' name order.")
      .def_static(
          "from_tars",
          [](const std::vector<std::filesystem::path>& shards, const RemoteOptions& remote) {
            return held(ImageDataset::from_tars(shards, remote));
          },
          py::arg("shards"), py::arg("remote") = RemoteOptions{}, py::call_guard<py::gil_scoped_release>(),
          "WebDataset tar shards: each sample an image and its .cls label; shards at a URL read as `remote` says.")
      .def(
          "subset", [](const ImageDataset& d, const std::vector<std::uint64_t>& ids) { return held(d.subset(ids)); },
          py::arg("ids"), "The images `ids` (strictly increasing) as a data set of their own.")
      .def("__len__", &ImageDataset::size)
      .def("name", &ImageDataset::name, py::arg("id"), "The file (or shard.tar:member) of image `id`.")
      .def_property_readonly("classes", &ImageDataset::classes,
                             "Class names, label i being classes[i] (a folder per class; empty otherwise).")
      .def_property_readonly("shards", &ImageDataset::shards)
      .def(
          "remote_counts",
          [](const ImageDataset& d) {
            const RemoteCounts c = d.remote_counts();
            py::dict out;
            out["requests"] = c.requests;
            out["retries"] = c.retries;
            out["bytes"] = c.bytes;
            out["cache_hits"] = c.cache_hits;
            out["cache_fetches"] = c.cache_fetches;
            out["cache_evictions"] = c.cache_evictions;
            out["cache_skipped"] = c.cache_skipped;
            out["peak_bytes_in_flight"] = c.peak_bytes_in_flight;
            return out;
          },
          "What the reads of its remote shards did so far (all 0 for local data): requests, retries, bytes, "
          "cache_hits, cache_fetches, cache_evictions, cache_skipped, peak_bytes_in_flight.")
      .def("fingerprint", &ImageDataset::fingerprint)
      .def("__repr__", [](const ImageDataset& d) {
        std::string out = "stoker.ImageDataset(" + std::to_string(d.size()) + " images";
        if (!d.classes().empty()) out += ", " + std::to_string(d.classes().size()) + " classes";
        if (d.shards() > 1) out += ", " + std::to_string(d.shards()) + " tar shards";
        return out + ")";
      });

  py::class_<ShardOptions>(m, "ShardOptions", R"(This rank's share of each epoch: the epoch's k-th sample
goes to rank k % world; remainder 'drop' or 'pad'.)")
      .def(py::init([](std::uint32_t rank, std::uint32_t world, std::string_view remainder) {
             return ShardOptions{.rank = rank,
                                 .world = world,
                                 .remainder = parse_choice<Remainder>(
                                     remainder, "remainder", {{"drop", Remainder::drop}, {"pad", Remainder::pad}})};
           }),
           py::arg("rank") = 0u, py::arg("world") = 1u, py::arg("remainder") = "drop")
      .def_readonly("rank", &ShardOptions::rank)
      .def_readonly("world", &ShardOptions::world)
      .def("__repr__", [](const ShardOptions& o) {
        return repr_of("ShardOptions", {{"rank", py::int_(o.rank)},
                                        {"world", py::int_(o.world)},
                                        {"remainder", py::str(o.remainder == Remainder::drop ? "drop" : "pad")}});
      });

  py::class_<EpochCut>(m, "EpochCut", R"(Where a run that goes on from the middle of an epoch starts it:
the first `taken` positions of epoch `epoch`'s order were taken before, by any number of ranks
(ImageSource's resume_at, with PipelineBuilder.first_epoch).)")
      .def(py::init([](std::uint32_t epoch, std::uint64_t taken) {
             return EpochCut{epoch, taken};
           }),
           py::arg("epoch"), py::arg("taken"))
      .def_readonly("epoch", &EpochCut::epoch)
      .def_readonly("taken", &EpochCut::taken)
      .def("__repr__", [](const EpochCut& c) {
        return repr_of("EpochCut", {{"epoch", py::int_(c.epoch)}, {"taken", py::int_(c.taken)}});
      });

  py::class_<ImageSource>(m, "ImageSource", R"(A pipeline source of one rank's images of an ImageDataset, as
stoker.EncodedImage (the file's bytes, label, id, name), for a map stage to decode on many
threads. order: 'shuffle' (a new order of all images each epoch), 'shards' (a new order of
the tar shards, each read front to back) or 'fixed'. pool: where the bytes go. max_file_bytes:
a larger file is a DataError naming it, refused before it is read.)")
      .def(py::init([](std::shared_ptr<ImageDataset> data, const ShardOptions& shard, std::string_view order,
                       std::shared_ptr<BufferPool> pool, std::optional<EpochCut> resume_at,
                       std::uint64_t max_file_bytes) {
             return ImageSource(
                 std::move(data),
                 {.shard = shard,
                  .max_file_bytes = max_file_bytes,
                  .order = parse_choice<ImageOrder>(
                      order, "order",
                      {{"shuffle", ImageOrder::shuffle}, {"shards", ImageOrder::shards}, {"fixed", ImageOrder::fixed}}),
                  .pool = std::move(pool),
                  .resume_at = resume_at});
           }),
           py::arg("data").none(false), py::arg("shard") = ShardOptions{}, py::arg("order") = "shuffle",
           py::arg("pool") = nullptr, py::arg("resume_at") = py::none(), py::arg("max_file_bytes") = kMaxImageFileBytes)
      .def("__len__", &ImageSource::size, "Images this rank reads per epoch (a whole one's).")
      .def("size_of", &ImageSource::size_of, py::arg("epoch"),
           "Images this rank reads in epoch `epoch`: len(), but in the epoch of resume_at.")
      .def("__repr__", [](const ImageSource& s) { return "stoker.ImageSource(" + s.fingerprint() + ")"; })
      .def("id_at", &ImageSource::id_at, py::arg("seed"), py::arg("epoch"), py::arg("k"),
           "The id of this rank's k-th image in an epoch of a pipeline seeded with `seed`.")
      .def_property_readonly("pool", &ImageSource::pool);

  py::class_<MixedImageSource>(m, "MixedImageSource", R"(A pipeline source of one rank's images from several
ImageDatasets, each draw choosing one by `weights` (one per data set, above 0; their scale does not
matter). stop: 'first_exhausted' (the epoch ends at the draw that takes a data set's last image),
'all_exhausted' (every image once; used-up data sets drop out of the draw) or 'resample' (the epoch
is `epoch_images` draws, default the sizes summed; a used-up data set starts another pass in a new
order). The draws follow from the pipeline's seed and the epoch; the k-th goes to rank k % world;
resume_at goes on after the first `taken` draws at any number of ranks. An image's id is
offset(part) + its id in its data set.)")
      .def(py::init([](std::vector<std::shared_ptr<ImageDataset>> parts, std::vector<double> weights,
                       std::string_view stop, std::uint64_t epoch_images, const ShardOptions& shard,
                       std::shared_ptr<BufferPool> pool, std::optional<EpochCut> resume_at,
                       std::uint64_t max_file_bytes) {
             return MixedImageSource({parts.begin(), parts.end()},
                                     {.weights = std::move(weights),
                                      .stop = parse_choice<MixStop>(stop, "stop",
                                                                    {{"first_exhausted", MixStop::first_exhausted},
                                                                     {"all_exhausted", MixStop::all_exhausted},
                                                                     {"resample", MixStop::resample}}),
                                      .epoch_images = epoch_images,
                                      .shard = shard,
                                      .max_file_bytes = max_file_bytes,
                                      .pool = std::move(pool),
                                      .resume_at = resume_at});
           }),
           py::arg("parts"), py::arg("weights"), py::arg("stop") = "first_exhausted", py::arg("epoch_images") = 0,
           py::arg("shard") = ShardOptions{}, py::arg("pool") = nullptr, py::arg("resume_at") = py::none(),
           py::arg("max_file_bytes") = kMaxImageFileBytes)
      .def("epoch_draws", &MixedImageSource::epoch_draws, py::arg("seed"), py::arg("epoch"),
           "Draws in that epoch of a pipeline seeded with `seed`, all ranks together.")
      .def("size_of", &MixedImageSource::size_of, py::arg("seed"), py::arg("epoch"),
           "Images this rank reads in that epoch.")
      .def("counts", &MixedImageSource::counts, py::arg("seed"), py::arg("epoch"),
           "How many draws of that epoch, all ranks together, take each data set.")
      .def("draw_at", &MixedImageSource::draw_at, py::arg("seed"), py::arg("epoch"), py::arg("k"),
           "(data set, id in it) of this rank's k-th image of that epoch.")
      .def("offset", &MixedImageSource::offset, py::arg("part"), "Where data set `part`'s ids begin.")
      .def("__repr__", [](const MixedImageSource& s) { return "stoker.MixedImageSource(" + s.fingerprint() + ")"; });

  py::class_<DecodeOptions>(m, "DecodeOptions", R"(color: 'rgb' (3 channels) or 'gray' (1); images whose
header claims more than max_pixels pixels are refused before anything is allocated.)")
      .def(py::init([](std::string_view color, std::uint64_t max_pixels) {
             return DecodeOptions{.color = parse_color(color), .max_pixels = max_pixels};
           }),
           py::arg("color") = "rgb", py::arg("max_pixels") = kDefaultMaxPixels)
      .def_property_readonly("color", [](const DecodeOptions& o) { return color_name(o.color); })
      .def_readonly("max_pixels", &DecodeOptions::max_pixels)
      .def("__repr__", [](const DecodeOptions& o) {
        return repr_of("DecodeOptions",
                       {{"color", py::str(color_name(o.color))}, {"max_pixels", py::int_(o.max_pixels)}});
      });

  py::class_<ImageDecoder>(m, "ImageDecoder", R"(Decodes an EncodedImage (JPEG or PNG) into a uint8 Sample,
channels last ([H, W, C] through DLPack), with its label and id (a map stage). A bad image
is a stoker.DataError naming the file.)")
      .def(py::init([](std::string_view color, std::uint64_t max_pixels, std::shared_ptr<BufferPool> pool) {
             return ImageDecoder({.color = parse_color(color), .max_pixels = max_pixels}, std::move(pool));
           }),
           py::arg("color") = "rgb", py::arg("max_pixels") = kDefaultMaxPixels, py::arg("pool") = nullptr)
      .def_property_readonly("pool", &ImageDecoder::pool)
      .def("__repr__", [](const ImageDecoder& d) {
        return repr_of("ImageDecoder", {{"color", py::str(color_name(d.options().color))},
                                        {"max_pixels", py::int_(d.options().max_pixels)}});
      });

  py::class_<RandomResizedCropOptions>(m, "RandomResizedCropOptions", R"(torchvision's RandomResizedCrop: the
output's size (height, width), scale (of the area) and ratio (width / height) ranges,
attempts before the centred fallback, antialias, and, fused into the same write, mirror
(None, a bool or a MirrorOptions) and normalize (a Normalizer: float32 out); layout
('planar' or 'channels_last'; the input's unless set); pool: where outputs go.)")
      .def(py::init(&crop_options), STOKER_RESIZED_CROP_ARGS)
      .def_property_readonly("size", [](const RandomResizedCropOptions& o) { return size_tuple(o.size); })
      .def_readonly("scale", &RandomResizedCropOptions::scale)
      .def_readonly("ratio", &RandomResizedCropOptions::ratio)
      .def_readonly("antialias", &RandomResizedCropOptions::antialias)
      .def("__repr__", [](const RandomResizedCropOptions& o) { return crop_repr("RandomResizedCropOptions", o); });

  py::class_<RandomResizedCrop>(m, "RandomResizedCrop", R"(torchvision's RandomResizedCrop of a decoded image
(a map stage), with the keyword arguments of RandomResizedCropOptions. Keeps the label and
id; each sample's draw follows from the pipeline's seed, the epoch and its id.)")
      .def(py::init([](const SizeArg& size, std::array<double, 2> scale, std::array<double, 2> ratio, int attempts,
                       bool antialias, const py::object& mirror, const std::optional<Normalizer>& normalize,
                       const std::optional<std::string>& layout, std::shared_ptr<BufferPool> pool, std::uint64_t salt) {
             return RandomResizedCrop(crop_options(size, scale, ratio, attempts, antialias, mirror, normalize, layout,
                                                   std::move(pool), salt));
           }),
           STOKER_RESIZED_CROP_ARGS)
      .def_property_readonly("output_size", [](const RandomResizedCrop& c) { return size_tuple(c.options().size); })
      .def("__repr__", [](const RandomResizedCrop& c) { return crop_repr("RandomResizedCrop", c.options()); });

  py::class_<Resize>(m, "Resize", R"(A resize of the whole image, then optionally its centre crop, for
evaluation (a map stage): torchvision's Resize(256) + CenterCrop(224) is
Resize(shorter=256, crop=(224, 224)); Resize(size=(h, w)) resizes to exactly that.)")
      .def(py::init([](std::uint32_t shorter, const std::optional<SizeArg>& size, const std::optional<SizeArg>& crop,
                       bool antialias, const std::optional<Normalizer>& normalize,
                       const std::optional<std::string>& layout, std::shared_ptr<BufferPool> pool) {
             return Resize({.shorter = shorter,
                            .size = parse_optional_size(size, "size"),
                            .crop = parse_optional_size(crop, "crop"),
                            .antialias = antialias,
                            .normalize = parse_normalize(normalize),
                            .layout = parse_optional_layout(layout),
                            .pool = std::move(pool)});
           }),
           py::arg("shorter") = 0u, py::arg("size") = py::none(), py::arg("crop") = py::none(),
           py::arg("antialias") = true, py::arg("normalize") = py::none(), py::arg("layout") = py::none(),
           py::arg("pool") = nullptr)
      .def_property_readonly("crop",
                             [](const Resize& r) {
                               return r.options().crop.height == 0 ? py::object(py::none())
                                                                   : py::object(size_tuple(r.options().crop));
                             })
      .def("__repr__", [](const Resize& r) {
        const ResizeOptions& o = r.options();
        return repr_of("Resize", {{"shorter", py::int_(o.shorter)},
                                  {"size", o.size.height ? py::object(size_tuple(o.size)) : py::none()},
                                  {"crop", o.crop.height ? py::object(size_tuple(o.crop)) : py::none()},
                                  {"antialias", py::bool_(o.antialias)}}) +
               (o.normalize ? " normalized by " + optional_normalizer_repr(o.normalize) : std::string());
      });

  py::class_<DecodeResizedCrop>(m, "DecodeResizedCrop", R"(Decode and RandomResizedCrop in one map stage:
the crop is drawn from the header, only its window is decoded (JPEG: at the smallest DCT
scale that serves it, unless dct_scaling=False), then resized into the output Sample.
crop: a RandomResizedCropOptions; decode: a DecodeOptions; scratch: where windows go.)")
      .def(py::init([](const RandomResizedCropOptions& crop, const DecodeOptions& decode, bool dct_scaling,
                       std::shared_ptr<BufferPool> scratch) {
             return DecodeResizedCrop(decode_crop_options(crop, decode, dct_scaling, std::move(scratch)));
           }),
           STOKER_DECODE_CROP_ARGS)
      .def_property_readonly("output_shape", &DecodeResizedCrop::output_shape)
      .def_property_readonly("output_dtype", [](const DecodeResizedCrop& d) { return dtype_name(d.output_dtype()); })
      .def("__repr__", [](const DecodeResizedCrop& d) {
        return "stoker.DecodeResizedCrop(output " + d.output_shape().str() + " " + dtype_name(d.output_dtype()) + ")";
      });

  py::class_<DecodeCropWindow>(m, "DecodeCropWindow", R"(DecodeResizedCrop with the resize left to Collate
(a map stage): it gives stoker.DeferredResize, and Collate, after .batch(), resizes,
mirrors and normalizes each crop straight into the batch. The same arguments.)")
      .def(py::init([](const RandomResizedCropOptions& crop, const DecodeOptions& decode, bool dct_scaling,
                       std::shared_ptr<BufferPool> scratch) {
             return DecodeCropWindow(decode_crop_options(crop, decode, dct_scaling, std::move(scratch)));
           }),
           STOKER_DECODE_CROP_ARGS)
      .def_property_readonly("output_shape", [](const DecodeCropWindow& d) { return d.resize().output_shape(); })
      .def_property_readonly("output_dtype",
                             [](const DecodeCropWindow& d) { return dtype_name(d.resize().output_dtype()); })
      .def("__repr__", [](const DecodeCropWindow& d) {
        return "stoker.DecodeCropWindow(output " + d.resize().output_shape().str() + " " +
               dtype_name(d.resize().output_dtype()) + ")";
      });
}

}  // namespace stoker::python
