// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gpu/stream_tools.h"
#include "resize_kernels.h"  // the job layout, to corrupt one (private to gpu/)
#include "stoker/core/pipeline.h"
#include "stoker/gpu/augment.h"
#include "stoker/gpu/image_augment.h"

using namespace stoker;
using gpu::DeviceBatch;
using gpu::GpuResizedCrop;
using gpu::GpuResizedCropOptions;
using test::devices;

namespace {

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};

// How far a CUDA value may be from the CPU's, in normalized units: the kernel does the CPU's
// arithmetic in its order, without contraction, so it should agree to the bit; this allows for
// a last-bit difference in every sum.
constexpr float kCudaTolerance = 1e-5f;

// Decoded image `id`: its size, layout and pixels follow from the id alone.
Sample decoded(std::uint64_t id, std::uint32_t channels = 3) {
  static const auto pool = BufferPool::create();
  Rng rng(derive_seed(77, id));
  const auto h = static_cast<std::uint32_t>(20 + rng.below(90)), w = static_cast<std::uint32_t>(20 + rng.below(90));
  const Shape s{.channels = channels,
                .depth = 1,
                .height = h,
                .width = w,
                .volume = false,
                .channels_last = id % 4 != 3};  // mostly as decoders write them
  Sample out(*pool, s, DType::u8, static_cast<std::int32_t>(id % 11), id);
  for (auto& v : out.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
  return out;
}

std::vector<Sample> decoded_batch(std::uint64_t first, std::size_t n, std::uint32_t channels = 3) {
  std::vector<Sample> out;
  for (std::uint64_t id = first; id < first + n; ++id) out.push_back(decoded(id, channels));
  return out;
}

// A device batch's values and labels on the host, once the device has built it.
struct HostBatch {
  std::vector<float> values;
  std::vector<std::int32_t> labels;
};
HostBatch read_back(gpu::Device& device, gpu::Stream& stream, const DeviceBatch& b) {
  HostBatch out{std::vector<float>(b.count * b.sample_elements()), std::vector<std::int32_t>(b.count)};
  if (device.backend() == gpu::Backend::cpu) {
    b.ready().synchronize();
    std::memcpy(out.values.data(), b.data(), out.values.size() * sizeof(float));
    std::memcpy(out.labels.data(), b.labels(), out.labels.size() * sizeof(std::int32_t));
  } else {
    stream.wait(b.ready());
    stream.copy_to_host(out.values.data(), b.data(), out.values.size() * sizeof(float));
    stream.copy_to_host(out.labels.data(), b.labels(), out.labels.size() * sizeof(std::int32_t));
    stream.synchronize();
  }
  return out;
}

// Checks crop i of `got` against the CPU transform of image `image` in the call `ctx`: bit for
// bit on the CPU backend, within kCudaTolerance on CUDA. Returns the largest difference.
float check_crop(const GpuResizedCrop& crop, gpu::Backend backend, const HostBatch& got, std::size_t i,
                 const Sample& image, const StageContext& ctx) {
  const RandomResizedCrop& cpu = crop.transform();
  const Sample want = cpu.apply(image, {}, cpu.plan(image.shape.height, image.shape.width, image.id, ctx));
  REQUIRE(want.shape == crop.output_shape());
  const std::size_t n = want.shape.elements();
  const float* values = got.values.data() + i * n;
  CHECK(got.labels[i] == image.label);
  if (backend == gpu::Backend::cpu) {
    CHECK(std::memcmp(values, want.data.data(), n * sizeof(float)) == 0);
    return 0;
  }
  float worst = 0;
  for (std::size_t k = 0; k < n; ++k) worst = std::max(worst, std::abs(values[k] - want.as<float>()[k]));
  CHECK(worst <= kCudaTolerance);
  return worst;
}

// Two epochs (seed 12) of decoded images 0 to images - 1, in batches of `per_batch`, packed
// on two threads and cropped by `crop`.
auto image_pipeline(GpuResizedCrop& crop, std::uint64_t images, std::size_t per_batch) {
  return PipelineBuilder{}
      .seed(12)
      .epochs(2)
      .source("read",
              [images, next = std::uint64_t{0}]() mutable -> std::optional<Sample> {
                if (next == images) {
                  next = 0;
                  return std::nullopt;
                }
                return decoded(next++);
              })
      .batch("images", per_batch)
      .map("pack", crop.packer(), {.threads = 2, .queue = 1})
      .map("gpu_crop", crop, {.queue = 1})
      .build();
}

GpuResizedCropOptions options(Layout layout = Layout::planar) {
  return {.crop = {.size = {24, 20}, .mirror = MirrorOptions{}, .normalize = kImageNet, .layout = layout},
          .max_images = 8,
          .staging_bytes = 1 << 20,
          .staging_buffers = 2};
}

}  // namespace

TEST_SUITE("gpu image augment") {
  TEST_CASE("random resized crops on the device equal the CPU transform: bit for bit on the CPU backend" *
            doctest::timeout(120)) {
    for (const auto& device : devices()) {
      CAPTURE(device->name());
      auto stream = device->make_stream();
      for (Layout layout : {Layout::planar, Layout::channels_last}) {
        for (bool antialias : {true, false}) {
          CAPTURE(layout_name(layout));
          CAPTURE(antialias);
          GpuResizedCropOptions o = options(layout);
          o.crop.antialias = antialias;
          GpuResizedCrop crop(device, o);
          const StageContext ctx{.seed = 31, .epoch = 2};
          float worst = 0;
          for (std::uint64_t first = 0; first < 40; first += 8) {
            const auto images = decoded_batch(first, first == 32 ? 5 : 8);  // and a short last batch
            std::vector<Sample> copies = decoded_batch(first, images.size());
            DeviceBatch b = crop(std::move(copies), ctx);
            REQUIRE(b.count == images.size());
            CHECK(b.shape ==
                  (layout == Layout::planar
                       ? Shape{3, 1, 24, 20, false, false}
                       : Shape{.channels = 3, .depth = 1, .height = 24, .width = 20, .channels_last = true}));
            const HostBatch got = read_back(*device, *stream, b);
            for (std::size_t i = 0; i < images.size(); ++i) {
              CHECK(b.host_labels[i] == images[i].label);
              CHECK(b.host_ids.at(i) == images[i].id);
              worst = std::max(worst, check_crop(crop, device->backend(), got, i, images[i], ctx));
            }
            b.release_after(*stream);
          }
          if (device->backend() == gpu::Backend::cuda) MESSAGE("largest CUDA difference from the CPU: " << worst);
        }
      }
      stream->synchronize();
    }
  }

  TEST_CASE("without normalize the crops are the resized values in float32; grayscale works too" *
            doctest::timeout(60)) {
    for (const auto& device : devices()) {
      auto stream = device->make_stream();
      GpuResizedCropOptions o = options();
      o.crop.normalize.reset();
      o.channels = 1;
      GpuResizedCrop crop(device, o);
      CHECK(crop.output_shape() == Shape{1, 1, 24, 20, false, false});
      CHECK(crop.transform().output_dtype(DType::u8) == DType::f32);
      const auto images = decoded_batch(100, 6, 1);
      DeviceBatch b = crop(decoded_batch(100, 6, 1), {});
      const HostBatch got = read_back(*device, *stream, b);
      for (std::size_t i = 0; i < images.size(); ++i) {
        check_crop(crop, device->backend(), got, i, images[i], {});
        for (float v : std::span(got.values).subspan(i * 24 * 20, 24 * 20)) CHECK((v >= 0.0f && v <= 255.0f));
      }
      b.release_after(*stream);
      stream->synchronize();
    }
  }

  TEST_CASE("a batch of images crosses in one copy, and nothing comes back" * doctest::timeout(60)) {
    for (const auto& device : devices()) {
      GpuResizedCrop crop(device, options());
      const auto before = device->transfers();
      std::uint64_t bytes = 0;
      for (int k = 0; k < 5; ++k) {
        gpu::PackedImages packed = crop.pack(decoded_batch(static_cast<std::uint64_t>(k) * 8, 8), {});
        bytes += packed.bytes;
        CHECK(packed.count == 8);
        DeviceBatch b = crop(std::move(packed), {});
        b.ready().synchronize();
      }
      const auto after = device->transfers();
      CHECK(after.h2d_copies - before.h2d_copies == 5);
      CHECK(after.h2d_bytes - before.h2d_bytes == bytes);
      CHECK(after.d2h_copies == before.d2h_copies);
    }
  }

  TEST_CASE("in a pipeline: decoded images of any size, packed on their own threads, each cropped once" *
            doctest::timeout(120)) {
    for (const auto& device : devices()) {
      CAPTURE(device->name());
      GpuResizedCrop crop(device, options());
      auto stream = device->make_stream();
      constexpr std::uint64_t kImages = 45;
      auto pipe = image_pipeline(crop, kImages, 8);
      for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
        std::multiset<std::int32_t> labels;
        std::size_t crops = 0;
        for (auto& b : pipe.epoch()) {
          const HostBatch got = read_back(*device, *stream, b);
          CHECK(std::ranges::equal(got.labels, b.host_labels));
          crops += b.count;
          for (std::int32_t l : b.host_labels) labels.insert(l);
          b.release_after(*stream);
        }
        CHECK(crops == kImages);
        std::multiset<std::int32_t> want;
        for (std::uint64_t id = 0; id < kImages; ++id) want.insert(static_cast<std::int32_t>(id % 11));
        CHECK(labels == want);
      }
      stream->synchronize();
    }
  }

  TEST_CASE("in a pipeline the crops are the CPU transform's for the pipeline's seed and epoch" *
            doctest::timeout(120)) {
    // One image per batch, so that a batch says which image it holds.
    auto device = gpu::Device::open("cpu");
    GpuResizedCrop crop(device, options());
    auto stream = device->make_stream();
    auto pipe = image_pipeline(crop, 10, 1);
    for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
      std::set<std::uint64_t> seen;
      for (auto& b : pipe.epoch()) {
        const HostBatch got = read_back(*device, *stream, b);
        // Find the image: the one whose CPU crop this is.
        bool found = false;
        for (std::uint64_t id = 0; id < 10 && !found; ++id) {
          const Sample image = decoded(id);
          const RandomResizedCrop& cpu = crop.transform();
          const Sample want =
              cpu.apply(image, {}, cpu.plan(image.shape.height, image.shape.width, id, {.seed = 12, .epoch = epoch}));
          if (std::memcmp(got.values.data(), want.data.data(), want.data.size()) == 0) {
            found = seen.insert(id).second;
          }
        }
        CHECK(found);
        b.release_after(*stream);
      }
      CHECK(seen.size() == 10);
    }
    stream->synchronize();
  }

  TEST_CASE("bad images, batches and options are refused, naming what is wrong" * doctest::timeout(60)) {
    auto device = gpu::Device::open("cpu");
    GpuResizedCrop crop(device, options());
    std::vector<Sample> grey = decoded_batch(0, 2, 1);
    CHECK_THROWS_WITH_AS(crop.pack(std::move(grey), {}), doctest::Contains("has not the 3 channels of option channels"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(crop.pack({}, {}), "GpuResizedCrop: no images to pack", std::invalid_argument);
    CHECK_THROWS_WITH_AS(crop.pack(decoded_batch(0, 9), {}), "GpuResizedCrop: a batch of 9 images, but max_images is 8",
                         std::invalid_argument);
    GpuResizedCropOptions small = options();
    small.staging_bytes = 20'000;
    GpuResizedCrop tight(device, small);
    CHECK_THROWS_WITH_AS(tight.pack(decoded_batch(0, 8), {}),
                         doctest::Contains("more than option staging_bytes = 20000"), std::invalid_argument);
    // Packed by another: its staging buffer is not this one's.
    GpuResizedCrop other(device, options());
    CHECK_THROWS_WITH_AS(crop(other.pack(decoded_batch(0, 2), {}), {}),
                         "GpuResizedCrop: the images were not packed by its pack() (or packer())",
                         std::invalid_argument);
    const auto refused = [&](GpuResizedCropOptions o, const char* what) {
      CHECK_THROWS_WITH_AS(GpuResizedCrop(device, std::move(o)), what, std::invalid_argument);
    };
    GpuResizedCropOptions o = options();
    o.max_images = 0;
    refused(o, "GpuResizedCrop: option max_images = 0 must be in [1, 65535]");
    o = options();
    o.channels = 5;
    refused(o, "GpuResizedCrop: option channels = 5 must be in [1, 4]");
    o = options();
    o.channels = 1;  // ImageNet's normalization has 3 channels
    refused(o, "GpuResizedCrop: normalize has values for 3 channels, but the sample 1x24x20 has 1");
    o = options();
    o.crop.size = {};
    refused(o, "RandomResizedCrop: option size 0x0 is empty");
    CHECK_THROWS_WITH_AS(GpuResizedCrop(nullptr, options()), "GpuResizedCrop: no device", std::invalid_argument);
    // GpuAugment, which cuts planar images of one shape, refuses channels-last ones.
    CHECK_THROWS_WITH_AS(
        gpu::GpuAugment(device, {.crops = {.size = {8, 8}},
                                 .batch_size = 4,
                                 .shuffle = {.capacity = 100, .min_after_dequeue = 10},
                                 .image = Shape{.channels = 3, .height = 20, .width = 20, .channels_last = true},
                                 .max_images = 4}),
        "GpuAugment: option image 20x20x3 is channels-last; it cuts planar images (Collate makes planar batches of "
        "channels-last images; GpuResizedCrop takes them as they are)",
        std::invalid_argument);
  }

  TEST_CASE("a corrupt job fails the stream's work instead of reading outside the buffer: CPU backend" *
            doctest::timeout(60)) {
    // On CUDA the kernel traps, a sticky error for the whole process: not run here.
    auto device = gpu::Device::open("cpu");
    GpuResizedCrop crop(device, options());
    gpu::PackedImages packed = crop.pack(decoded_batch(0, 3), {});
    auto* jobs = reinterpret_cast<gpu::detail::ResizeJob*>(packed.storage.data());
    jobs[1].pixels = packed.bytes - 4;  // its image would run past the end
    DeviceBatch b = crop(std::move(packed), {});
    CHECK_THROWS_AS(b.ready().synchronize(), gpu::DeviceError);
    // The stage reports it at its next call.
    CHECK_THROWS_AS(crop(decoded_batch(0, 2), {}), gpu::DeviceError);
  }
}
