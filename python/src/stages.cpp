// SPDX-License-Identifier: Apache-2.0
// stoker's data sets, readers and transforms as Python classes, with the C++ names and the
// option structs' fields as keyword arguments. They run in C++: a pipeline copies them, as the
// C++ builder does, and calls them on its own threads without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/npy.h"
#include "stoker/stages/raw.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

namespace stoker::python {

namespace {

Axis parse_axis(std::string_view name) {
  return parse_choice<Axis>(name, "axis",
                            {{axis_name(Axis::depth), Axis::depth},
                             {axis_name(Axis::height), Axis::height},
                             {axis_name(Axis::width), Axis::width}});
}

ReaderOptions reader_options(std::uint32_t shard_index, std::uint32_t num_shards, std::shared_ptr<BufferPool> pool) {
  return {.shard_index = shard_index, .num_shards = num_shards, .pool = std::move(pool)};
}

// Every reader takes the sharding options and a pool, after its own arguments.
template <class Class>
void reader_members(Class& c) {
  c.def_property_readonly("shard_index", [](const Reader& r) { return r.options().shard_index; })
      .def_property_readonly("num_shards", [](const Reader& r) { return r.options().num_shards; })
      .def_property_readonly("pool", [](const Reader& r) { return r.pool(); });
}

#define STOKER_READER_ARGS py::arg("shard_index") = 0u, py::arg("num_shards") = 1u, py::arg("pool") = nullptr

// Floats as Python shows them: float32 values rounded to the digits they hold (0.485, not
// 0.48500001430511475).
py::float_ shown(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", static_cast<double>(x));
  return py::float_(std::strtod(text, nullptr));
}
py::list shown(const std::vector<float>& xs) {
  py::list out;
  for (float x : xs) out.append(shown(x));
  return out;
}

// `mean=` or `std=`: a number, or a sequence of numbers (one per channel).
std::vector<float> parse_floats(const py::handle& value, const char* option) {
  const auto number = [](const py::handle& x) {
    return (py::isinstance<py::float_>(x) || py::isinstance<py::int_>(x)) && !py::isinstance<py::bool_>(x);
  };
  if (number(value)) return {value.cast<float>()};
  if (py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value)) {
    std::vector<float> out;
    for (const auto& x : py::reinterpret_borrow<py::sequence>(value)) {
      if (!number(x)) break;
      out.push_back(x.cast<float>());
    }
    if (out.size() == py::len(value) && !out.empty()) return out;
  }
  throw py::type_error(std::string("Normalizer: ") + option + " must be a number or a list of numbers (one per " +
                       "channel), not " + py::repr(value).cast<std::string>());
}

// torchvision's units: Normalize's mean and std apply to ToTensor's output, pixels / 255.
constexpr float kTorchvisionScale = 255.0f;

Normalizer make_normalizer(const FloatsArg& mean, const FloatsArg& std, const std::optional<float>& scale) {
  Normalization n{.scale = scale.value_or(kTorchvisionScale),
                  .mean = parse_floats(mean.value, "mean"),
                  .std = parse_floats(std.value, "std")};
  if (!scale) {
    // Values above 1 cannot be 0-1 units (a uint8 image's std is at most 0.5 of them): pixel units
    // read as torchvision's would normalize to values in the hundreds, silently.
    for (const auto& [values, option] : {std::pair{&n.mean, "mean"}, std::pair{&n.std, "std"}})
      for (float x : *values)
        if (std::abs(x) > 1.0f)
          throw py::value_error(std::string("Normalizer: ") + option + " " +
                                py::repr(shown(*values)).cast<std::string>() +
                                " is in pixel units, but without scale= the values are torchvision's 0-1 units "
                                "(ToTensor's pixels / 255): give them in 0-1 units, or pass scale=1 to normalize "
                                "pixel values as they are");
  }
  return Normalizer(std::move(n));  // std::invalid_argument (a ValueError) for a zero scale or std
}

std::string normalizer_repr(const Normalizer& n) {
  const Normalization& o = n.options();
  return repr_of("Normalizer", {{"mean", shown(o.mean)}, {"std", shown(o.std)}, {"scale", shown(o.scale)}});
}

std::string pool_repr(const std::shared_ptr<BufferPool>& pool) {
  return pool ? py::repr(py::cast(pool)).cast<std::string>() : "None";
}

// A read-only NumPy view of memory `owner` keeps alive.
template <class T>
py::array view(const T* data, std::vector<py::ssize_t> dims, const py::object& owner) {
  py::array_t<T> a(dims, data, owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

}  // namespace

void bind_stages(py::module_& m) {
  py::class_<BufferPool, std::shared_ptr<BufferPool>>(m, "BufferPool", R"(Recycled byte buffers, by size: where samples
and batches get their memory. Thread-safe.)")
      .def_static("create", &BufferPool::create, py::arg("max_cached_bytes") = std::size_t{1} << 30)
      .def_property_readonly("allocations", &BufferPool::allocations, "Fresh allocations so far.")
      .def_property_readonly("reuses", &BufferPool::reuses, "Buffers handed out again so far.")
      .def_property_readonly("waits", &BufferPool::waits, "Whether acquiring waits for a buffer to come back.")
      .def_property_readonly("memory", [](const BufferPool& p) { return memory_name(p.memory_kind()); })
      .def("__repr__", [](const BufferPool& p) {
        return "stoker.BufferPool(memory=" + std::string(memory_name(p.memory_kind())) +
               ", allocations=" + std::to_string(p.allocations()) + ", reuses=" + std::to_string(p.reuses()) + ")";
      });

  // Data sets and readers.
  py::class_<IdxDataset, std::shared_ptr<IdxDataset>>(m, "IdxDataset", R"(IDX images and their labels (MNIST,
Fashion-MNIST), decoded into memory once.)")
      .def(py::init([](const py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>& images,
                       const py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>& labels) {
             if (images.ndim() != 3) throw py::value_error("images must be uint8 [N, H, W]");
             if (labels.ndim() != 1 || labels.shape(0) != images.shape(0))
               throw py::value_error("labels must be [N], one per image: " + std::to_string(labels.size()) + " for " +
                                     std::to_string(images.shape(0)) + " images");
             auto d = std::make_shared<IdxDataset>();
             d->images = {static_cast<std::uint32_t>(images.shape(0)), static_cast<std::uint32_t>(images.shape(1)),
                          static_cast<std::uint32_t>(images.shape(2)),
                          std::vector<std::uint8_t>(images.data(), images.data() + images.size())};
             d->labels.assign(labels.data(), labels.data() + labels.size());
             return d;
           }),
           py::arg("images"), py::arg("labels"), "A data set of these images and labels (copied).")
      .def("__len__", &IdxDataset::size)
      .def_property_readonly("shape", &IdxDataset::shape)
      .def_property_readonly(
          "images",
          [](const py::object& self) {
            const auto& d = self.cast<const IdxDataset&>();
            return view(d.images.pixels.data(),
                        {static_cast<py::ssize_t>(d.images.count), static_cast<py::ssize_t>(d.images.height),
                         static_cast<py::ssize_t>(d.images.width)},
                        self);
          },
          "uint8 [N, H, W], a read-only NumPy view (no copy).")
      .def_property_readonly(
          "labels",
          [](const py::object& self) {
            const auto& d = self.cast<const IdxDataset&>();
            return view(d.labels.data(), {static_cast<py::ssize_t>(d.labels.size())}, self);
          },
          "int32 [N], a read-only NumPy view.")
      .def("__repr__", [](const IdxDataset& d) {
        return "stoker.IdxDataset(" + std::to_string(d.size()) + " images of " + std::to_string(d.images.height) + "x" +
               std::to_string(d.images.width) + ")";
      });
  m.def(
      "fashion_mnist",
      [](const std::filesystem::path& dir, const std::string& split) {
        return std::make_shared<IdxDataset>(fashion_mnist(dir, split));
      },
      py::arg("dir") = std::filesystem::path(kFashionMnistDir), py::arg("split") = "train",
      "Fashion-MNIST's 'train' (60,000 images) or 't10k' (10,000) split, from the Debian package "
      "dataset-fashion-mnist by default.");
  m.def(
      "load_idx",
      [](const std::filesystem::path& images, const std::filesystem::path& labels) {
        return std::make_shared<IdxDataset>(load_idx(images, labels));
      },
      py::arg("images"), py::arg("labels"));

  py::class_<Reader, std::shared_ptr<Reader>> reader(m, "Reader", R"(A data set of samples with ids 0 to
dataset_size - 1, of which the reader yields one shard: a pipeline source.)");
  reader.def_property_readonly("dataset_size", &Reader::dataset_size)
      .def("__len__", &Reader::size)
      .def("read", &Reader::read, py::arg("id"), py::call_guard<py::gil_scoped_release>(),
           "Sample `id` of the whole data set.")
      .def("fingerprint", &Reader::fingerprint)
      .def("__repr__", [](const py::object& self) {
        const auto& r = self.cast<const Reader&>();
        return "stoker." + py::type::handle_of(self).attr("__name__").cast<std::string>() + "(" +
               std::to_string(r.size()) + " of " + std::to_string(r.dataset_size()) + " samples, shard " +
               std::to_string(r.options().shard_index) + " of " + std::to_string(r.options().num_shards) + ")";
      });
  reader_members(reader);

  py::class_<IdxReader, Reader, std::shared_ptr<IdxReader>>(m, "IdxReader")
      .def(py::init([](std::shared_ptr<IdxDataset> data, std::uint32_t shard_index, std::uint32_t num_shards,
                       std::shared_ptr<BufferPool> pool) {
             return std::make_shared<IdxReader>(std::shared_ptr<const IdxDataset>(std::move(data)),
                                                reader_options(shard_index, num_shards, std::move(pool)));
           }),
           py::arg("data"), STOKER_READER_ARGS);

  py::class_<NpyReader, Reader, std::shared_ptr<NpyReader>>(m, "NpyReader")
      .def(py::init([](const std::vector<std::pair<std::filesystem::path, std::int32_t>>& files,
                       std::uint32_t shard_index, std::uint32_t num_shards, std::shared_ptr<BufferPool> pool) {
             std::vector<NpyFile> list;
             for (const auto& [path, label] : files) list.push_back({path, label});
             return std::make_shared<NpyReader>(std::move(list),
                                                reader_options(shard_index, num_shards, std::move(pool)));
           }),
           py::arg("files"), STOKER_READER_ARGS, "files: (path, label) pairs.")
      .def_static(
          "from_directory",
          [](const std::filesystem::path& dir, const std::optional<std::filesystem::path>& labels_csv,
             std::uint32_t shard_index, std::uint32_t num_shards, std::shared_ptr<BufferPool> pool) {
            return std::make_shared<NpyReader>(
                NpyReader::from_directory(dir, labels_csv.value_or(std::filesystem::path()),
                                          reader_options(shard_index, num_shards, std::move(pool))));
          },
          py::arg("dir"), py::arg("labels_csv") = py::none(), STOKER_READER_ARGS,
          "The files listed in labels_csv (`file,label` lines), or every *.npy file in dir, in name order, "
          "labelled 0.");

  py::class_<RawVolumeReader, Reader, std::shared_ptr<RawVolumeReader>>(m, "RawVolumeReader")
      .def(py::init([](const std::filesystem::path& file, Shape shape, std::string_view dtype, std::int32_t label,
                       std::uint32_t shard_index, std::uint32_t num_shards, std::shared_ptr<BufferPool> pool) {
             return std::make_shared<RawVolumeReader>(file, shape, parse_dtype(dtype, "dtype"),
                                                      reader_options(shard_index, num_shards, std::move(pool)), label);
           }),
           py::arg("file"), py::arg("shape"), py::arg("dtype"), py::arg("label") = 0, STOKER_READER_ARGS);

  py::class_<SyntheticSource, Reader, std::shared_ptr<SyntheticSource>>(m, "SyntheticSource")
      .def(py::init([](Shape shape, std::string_view dtype, std::uint64_t count, std::uint64_t seed,
                       std::int32_t num_classes, std::uint32_t shard_index, std::uint32_t num_shards,
                       std::shared_ptr<BufferPool> pool) {
             return std::make_shared<SyntheticSource>(SyntheticOptions{.shape = shape,
                                                                       .dtype = parse_dtype(dtype, "dtype"),
                                                                       .count = count,
                                                                       .seed = seed,
                                                                       .num_classes = num_classes},
                                                      reader_options(shard_index, num_shards, std::move(pool)));
           }),
           py::arg("shape") = Shape{1, 1, 28, 28, false}, py::arg("dtype") = "uint8", py::arg("count") = 60'000u,
           py::arg("seed") = 0u, py::arg("num_classes") = 10, STOKER_READER_ARGS);

  py::class_<ShuffledShard>(m, "ShuffledShard", R"(One rank's share of a data set, reshuffled every epoch from
the pipeline's seed: the source of a data-parallel job.)")
      .def(py::init([](std::shared_ptr<Reader> reader, std::uint32_t rank, std::uint32_t world,
                       std::string_view remainder) {
             return ShuffledShard(std::move(reader),
                                  {.rank = rank,
                                   .world = world,
                                   .remainder = parse_choice<Remainder>(
                                       remainder, "remainder", {{"drop", Remainder::drop}, {"pad", Remainder::pad}})});
           }),
           py::arg("reader"), py::arg("rank") = 0u, py::arg("world") = 1u, py::arg("remainder") = "drop")
      .def("__len__", &ShuffledShard::size)
      .def("__repr__", [](const ShuffledShard& s) {
        return "stoker.ShuffledShard(" + std::to_string(s.size()) + " a rank: " + s.fingerprint() + ")";
      });

  // Transforms.
  py::class_<Normalizer>(m, "Normalizer", R"(y = (x / scale - mean[c]) / std[c], in float32: torchvision's
Normalize(mean, std) after ToTensor(). Without scale, mean and std are in torchvision's 0-1
units of 8-bit pixels (scale 255), and values above 1 are refused as ambiguous; scale=1 takes
pixel units, and is what samples of float data need.)")
      .def(py::init(&make_normalizer), py::arg("mean"), py::arg("std"), py::kw_only(), py::arg("scale") = py::none())
      .def_property_readonly("scale", [](const Normalizer& n) { return shown(n.options().scale); })
      .def_property_readonly("mean", [](const Normalizer& n) { return shown(n.options().mean); })
      .def_property_readonly("std", [](const Normalizer& n) { return shown(n.options().std); })
      .def("__repr__", &normalizer_repr);

  py::class_<MirrorOptions>(m, "MirrorOptions", "Mirror along `axis` with probability `p`.")
      .def(py::init([](std::string_view axis, double p, std::uint64_t salt) {
             return MirrorOptions{.axis = parse_axis(axis), .p = p, .salt = salt};
           }),
           py::arg("axis") = "width", py::arg("p") = 0.5, py::arg("salt") = kMirrorSalt)
      .def_property_readonly("axis", [](const MirrorOptions& o) { return axis_name(o.axis); })
      .def_readonly("p", &MirrorOptions::p)
      .def("__repr__", [](const MirrorOptions& o) {
        return repr_of("MirrorOptions", {{"axis", py::str(axis_name(o.axis))}, {"p", py::float_(o.p)}});
      });

  py::class_<RandomCrops>(m, "RandomCrops", R"(1 -> count random crops of each sample (a flat_map stage).
With mirror or normalize it cuts each crop mirrored and normalized in one pass; as a
flat_map whose output is stoker.DeferredCrop (the default without normalize) it only draws
the crops, and Collate cuts them into the batch.)")
      .def(py::init([](const SizeArg& size, int count, const py::object& mirror,
                       const std::optional<Normalizer>& normalize, std::shared_ptr<BufferPool> pool,
                       std::uint64_t salt) {
             return RandomCrops({.size = parse_crop_size(size.value, "size"),
                                 .count = count,
                                 .mirror = parse_mirror(mirror),
                                 .normalize = parse_normalize(normalize),
                                 .pool = std::move(pool),
                                 .salt = salt});
           }),
           py::arg("size"), py::arg("count") = 1, py::arg("mirror") = py::none(), py::arg("normalize") = py::none(),
           py::arg("pool") = nullptr, py::arg("salt") = kCropSalt)
      .def_property_readonly("count", [](const RandomCrops& r) { return r.options().count; })
      .def_property_readonly("size", [](const RandomCrops& r) { return size_tuple(r.options().size); })
      .def("__repr__", [](const RandomCrops& r) {
        const auto& o = r.options();
        return repr_of("RandomCrops", {{"size", size_tuple(o.size)},
                                       {"count", py::int_(o.count)},
                                       {"mirror", o.mirror ? py::cast(*o.mirror) : py::none()},
                                       {"normalize", r.normalizer() ? py::cast(*r.normalizer()) : py::none()}});
      });

  py::class_<CenterCrop>(m, "CenterCrop", "The crop in the middle of each sample (a map stage).")
      .def(py::init(
               [](const SizeArg& size, const std::optional<Normalizer>& normalize, std::shared_ptr<BufferPool> pool) {
                 return CenterCrop({.size = parse_crop_size(size.value, "size"),
                                    .normalize = parse_normalize(normalize),
                                    .pool = std::move(pool)});
               }),
           py::arg("size"), py::arg("normalize") = py::none(), py::arg("pool") = nullptr)
      .def_property_readonly("size", [](const CenterCrop& c) { return size_tuple(c.options().size); })
      .def("__repr__", [](const CenterCrop& c) {
        return repr_of("CenterCrop", {{"size", size_tuple(c.options().size)}});
      });

  py::class_<RandomMirror>(m, "RandomMirror", "Mirrors a sample in place with probability p (a map stage).")
      .def(py::init([](std::string_view axis, double p, std::uint64_t salt) {
             return RandomMirror({.axis = parse_axis(axis), .p = p, .salt = salt});
           }),
           py::arg("axis") = "width", py::arg("p") = 0.5, py::arg("salt") = kMirrorSalt)
      .def("__repr__", [](const RandomMirror& r) {
        return repr_of("RandomMirror",
                       {{"axis", py::str(axis_name(r.options().axis))}, {"p", py::float_(r.options().p)}});
      });

  py::class_<Normalize>(m, "Normalize", "Cast to float32 and normalize (a map stage).")
      .def(py::init([](const Normalizer& n, std::shared_ptr<BufferPool> pool) {
             return Normalize(n.options(), std::move(pool));
           }),
           py::arg("normalize"), py::arg("pool") = nullptr)
      .def("__repr__", [](const Normalize& n) { return "stoker.Normalize(" + normalizer_repr(n.normalizer()) + ")"; });

  py::class_<Collate>(m, "Collate", R"(A list of samples, deferred crops or deferred resizes (after .batch())
into one contiguous stoker.Batch (a map stage); with normalize, cast to float32 and
normalized on the way. layout: 'planar' [N, C, H, W] or 'channels_last' [N, H, W, C];
decoded (channels-last) images are converted on the way. pool: where batches are made,
e.g. a pinned staging pool.)")
      .def(py::init([](std::shared_ptr<BufferPool> pool, const std::optional<Normalizer>& normalize,
                       std::string_view layout) {
             return Collate{.pool = pool ? std::move(pool) : BufferPool::create(),
                            .normalize = normalize,
                            .layout = parse_layout(layout, "layout")};
           }),
           py::arg("pool") = nullptr, py::arg("normalize") = py::none(), py::arg("layout") = "planar")
      .def_readonly("pool", &Collate::pool)
      .def_property_readonly("layout", [](const Collate& c) { return layout_name(c.layout); })
      .def("__repr__", [](const Collate& c) {
        return "stoker.Collate(pool=" + pool_repr(c.pool) +
               ", normalize=" + (c.normalize ? normalizer_repr(*c.normalize) : std::string("None")) + ", layout='" +
               layout_name(c.layout) + "')";
      });

  py::class_<ShuffleOptions>(m, "ShuffleOptions", "A random-shuffle buffer's capacity, min_after_dequeue and seed.")
      .def(py::init([](std::size_t capacity, std::size_t min_after_dequeue, std::optional<std::uint64_t> seed) {
             return ShuffleOptions{.capacity = capacity, .min_after_dequeue = min_after_dequeue, .seed = seed};
           }),
           py::arg("capacity") = 10'000u, py::arg("min_after_dequeue") = 2'000u, py::arg("seed") = py::none())
      .def_readonly("capacity", &ShuffleOptions::capacity)
      .def_readonly("min_after_dequeue", &ShuffleOptions::min_after_dequeue)
      .def_readonly("seed", &ShuffleOptions::seed)
      .def("__repr__", [](const ShuffleOptions& o) {
        return repr_of("ShuffleOptions", {{"capacity", py::int_(o.capacity)},
                                          {"min_after_dequeue", py::int_(o.min_after_dequeue)},
                                          {"seed", o.seed ? py::object(py::int_(*o.seed)) : py::none()}});
      });
}

}  // namespace stoker::python
