// SPDX-License-Identifier: Apache-2.0
#include "stoker/gpu/image_augment.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "augment_crop.h"
#include "backends.h"
#include "resize_kernels.h"
#include "stoker/stages/batch.h"

namespace stoker::gpu {

using detail::ResizeJob;

static_assert(std::is_trivially_copyable_v<ResizeJob> && sizeof(ResizeJob) == 56,
              "a ResizeJob is 56 bytes on the wire");

namespace {

constexpr std::size_t kAlign = 256;  // regions of a staging buffer start on a device allocation's alignment
constexpr std::size_t align_up(std::size_t n, std::size_t to = kAlign) noexcept { return (n + to - 1) / to * to; }
constexpr std::size_t kMaxImages = 65535;  // a launch's block rows

// The CPU transform the device's crops equal: float32 output always, planar unless asked.
RandomResizedCropOptions device_crop(RandomResizedCropOptions o) {
  if (!o.normalize) o.normalize = Normalization{};
  if (!o.layout) o.layout = Layout::planar;
  o.pool = nullptr;
  return o;
}

GpuResizedCropOptions checked(GpuResizedCropOptions o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("GpuResizedCrop: " + what); };
  if (o.max_images == 0 || o.max_images > kMaxImages)
    fail("option max_images = " + std::to_string(o.max_images) + " must be in [1, 65535]");
  if (o.channels == 0 || o.channels > detail::kMaxResizeChannels)
    fail("option channels = " + std::to_string(o.channels) + " must be in [1, 4]");
  if (o.staging_buffers == 0) fail("option staging_buffers must be at least 1");
  if (o.wait_limit.count() < 0) fail("option wait_limit must not be negative");
  if (o.staging_bytes == 0) {
    // 512 x 512 colour images, each crop's weights at a shrink of up to 8 (16 taps a pixel).
    const std::size_t taps = TapsView::bytes(o.crop.size.height, 16) + TapsView::bytes(o.crop.size.width, 16);
    o.staging_bytes =
        align_up(o.max_images * sizeof(ResizeJob)) + o.max_images * align_up(taps + 512 * 512 * o.channels, 16);
  }
  return o;
}

}  // namespace

struct GpuResizedCrop::State {
  State(std::shared_ptr<Device> d, GpuResizedCropOptions o)
      : device(std::move(d)), options(checked(std::move(o))), crop(device_crop(options.crop)) {
    if (!device) throw std::invalid_argument("GpuResizedCrop: no device");
    if (const Normalizer* n = crop.normalizer()) n->check(shape(), "GpuResizedCrop");
    const std::size_t outputs_needed = OutputSizing{.per_call = 1, .queued = 1, .held = 1}.buffers();
    const std::size_t output_count = options.output_buffers ? options.output_buffers : outputs_needed;
    const auto limit = options.wait_limit;
    host_staging = SlotPool::create(
        device, SlotPool::Kind::pinned, options.staging_buffers, options.staging_bytes,
        {.name = "GpuResizedCrop staging",
         .sizing = "staging_buffers (" + std::to_string(options.staging_buffers) +
                   ") must cover 1 batch being packed + the batches queued between the pack stage and gpu_crop + 1 "
                   "being copied",
         .wait_limit = limit});
    device_staging = SlotPool::create(device, SlotPool::Kind::device, options.staging_buffers, options.staging_bytes,
                                      {.name = "GpuResizedCrop device staging", .sizing = {}, .wait_limit = limit});
    outputs = SlotPool::create(
        device, SlotPool::Kind::device, output_count, Batch::storage_bytes(shape(), DType::f32, options.max_images),
        {.name = "GpuResizedCrop outputs",
         .sizing = "output_buffers (" + std::to_string(output_count) +
                   ") must cover 1 batch being cut + the batches queued after the stage + those the consumer holds "
                   "at once (OutputSizing)",
         .wait_limit = limit});
    copy = device->make_stream();
    compute = device->make_stream();
  }

  // The streams finish their work, which uses the pools' memory, before anything goes.
  ~State() { detail::synchronize_quietly({copy.get(), compute.get()}, "GpuResizedCrop's destructor"); }

  Shape shape() const noexcept {
    return crop.output_shape(Shape{.channels = options.channels, .depth = 1, .height = 1, .width = 1});
  }

  PackedImages pack(std::vector<Sample> images, const StageContext& ctx) const;
  DeviceBatch cut(PackedImages images, const StageContext& ctx);

  std::shared_ptr<Device> device;
  const GpuResizedCropOptions options;
  const RandomResizedCrop crop;
  std::shared_ptr<SlotPool> host_staging, device_staging, outputs;
  std::unique_ptr<Stream> copy, compute;
};

namespace {

void check_image(const Sample& s, std::size_t i, std::uint32_t channels) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument("GpuResizedCrop: image " + std::to_string(i) + " (id " + std::to_string(s.id) + ", " +
                                s.shape.str() + " " + dtype_name(s.dtype) + ") " + what);
  };
  if (s.dtype != DType::u8) fail("is not uint8");
  if (s.shape.volume || s.shape.depth != 1) fail("is not a 2D image");
  if (s.shape.channels != channels) fail("has not the " + std::to_string(channels) + " channels of option channels");
  if (s.data.size() != s.shape.elements()) fail("holds " + std::to_string(s.data.size()) + " bytes");
}

}  // namespace

// Layout: [jobs | each crop's row taps, then column taps | each image, 16-byte aligned].
PackedImages GpuResizedCrop::State::pack(std::vector<Sample> images, const StageContext& ctx) const {
  if (images.empty()) throw std::invalid_argument("GpuResizedCrop: no images to pack");
  if (images.size() > options.max_images)
    throw std::invalid_argument("GpuResizedCrop: a batch of " + std::to_string(images.size()) +
                                " images, but max_images is " + std::to_string(options.max_images));
  const std::size_t n = images.size();
  const std::uint32_t channels = options.channels;
  // Reused, so that the steady state does not allocate per batch.
  thread_local std::vector<ResizeJob> jobs;
  thread_local std::vector<ResampleTaps> taps;
  jobs.assign(n, ResizeJob{});
  if (taps.size() < 2 * n) taps.resize(2 * n);
  std::size_t at = align_up(n * sizeof(ResizeJob));
  for (std::size_t i = 0; i < n; ++i) {
    const Sample& s = images[i];
    check_image(s, i, channels);
    const PlannedCrop p = crop.plan(s.shape.height, s.shape.width, s.id, ctx);
    const auto axes = crop.axes(p, s.shape);
    taps[2 * i].reset(axes[0]);
    taps[2 * i + 1].reset(axes[1]);
    ResizeJob& j = jobs[i];
    j.rows = at;
    at += taps[2 * i].bytes();
    j.cols = at;
    at += taps[2 * i + 1].bytes();
    j.height = s.shape.height, j.width = s.shape.width;
    j.row_stride = taps[2 * i].stride(), j.col_stride = taps[2 * i + 1].stride();
    j.channels_last = s.shape.channels_last ? 1 : 0;
    j.flips = detail::make_job(0, p, 0).flips;
    j.label = s.label;
  }
  at = align_up(at);
  for (std::size_t i = 0; i < n; ++i) {
    jobs[i].pixels = at;
    at = align_up(at + images[i].data.size(), 16);
  }
  if (at > options.staging_bytes)
    throw std::invalid_argument("GpuResizedCrop: a batch of " + std::to_string(n) + " images packs into " +
                                std::to_string(at) +
                                " bytes, more than option staging_bytes = " + std::to_string(options.staging_bytes));
  PackedImages out;
  out.storage = host_staging->acquire(at, ctx);
  out.bytes = at;
  out.count = n;
  out.labels.reserve(n);
  out.ids.reserve(n);
  std::byte* base = out.storage.data();
  std::memcpy(base, jobs.data(), n * sizeof(ResizeJob));
  for (std::size_t i = 0; i < n; ++i) {
    taps[2 * i].write(base + jobs[i].rows);
    taps[2 * i + 1].write(base + jobs[i].cols);
    std::memcpy(base + jobs[i].pixels, images[i].data.data(), images[i].data.size());
    out.labels.push_back(images[i].label);
    out.ids.push_back(images[i].id);
  }
  return out;
}

DeviceBatch GpuResizedCrop::State::cut(PackedImages images, const StageContext& ctx) {
  // Work issued earlier that failed fails this call, so that the consumer hears of it as this
  // stage's error.
  copy->check();
  compute->check();
  if (images.storage.pool() != host_staging.get())
    throw std::invalid_argument("GpuResizedCrop: the images were not packed by its pack() (or packer())");
  if (images.count == 0 || images.count > options.max_images || images.bytes > images.storage.size() ||
      images.labels.size() != images.count || images.ids.size() != images.count)
    throw std::invalid_argument("GpuResizedCrop: packed images of " + std::to_string(images.count) + " images in " +
                                std::to_string(images.bytes) + " bytes do not add up");
  const std::size_t n = images.count, bytes = images.bytes;
  const Shape shape = this->shape();
  Buffer dev = device_staging->acquire(bytes, ctx);
  Event& copied = device_staging->event(dev);
  copy->copy_to_device(dev.data(), images.storage.data(), bytes);
  copy->record(copied);
  host_staging->release_after(std::move(images.storage), *copy);
  // Only now wait for an output buffer, which the trainer gives back: the copy of this batch
  // runs meanwhile.
  Buffer out = outputs->acquire(Batch::storage_bytes(shape, DType::f32, n), ctx);
  const Batch layout{.storage = {}, .shape = shape, .dtype = DType::f32, .count = n};
  auto* crops = reinterpret_cast<float*>(out.data());
  auto* labels = reinterpret_cast<std::int32_t*>(out.data() + layout.labels_offset());
  compute->wait(copied);
  const std::byte* base = dev.data();
  const std::size_t per_crop = shape.elements();
  const Normalizer* normalizer = crop.normalizer();
  detail::launch(
      *compute, "resized crop",
      [=] {
        // The CPU transform itself, over the copied images and weights: they are checked, not
        // trusted, as the kernel checks them.
        const auto* jobs = reinterpret_cast<const ResizeJob*>(base);
        const Shape& out_shape = shape;
        for (std::size_t i = 0; i < n; ++i) {
          const ResizeJob& j = jobs[i];
          const std::size_t image = std::size_t{j.height} * j.width * out_shape.channels;
          const auto inside = [&](std::uint64_t offset, std::size_t size) {
            return offset <= bytes && size <= bytes - offset && offset % 4 == 0;
          };
          if (!inside(j.pixels, image) || !inside(j.rows, TapsView::bytes(out_shape.height, j.row_stride)) ||
              !inside(j.cols, TapsView::bytes(out_shape.width, j.col_stride)))
            throw std::out_of_range("resized crop job " + std::to_string(i) + " lies outside its " +
                                    std::to_string(bytes) + "-byte buffer");
          const Shape image_shape{.channels = out_shape.channels,
                                  .depth = 1,
                                  .height = j.height,
                                  .width = j.width,
                                  .volume = false,
                                  .channels_last = j.channels_last != 0};
          const Flips flips{false, (j.flips & detail::kFlipHeight) != 0, (j.flips & detail::kFlipWidth) != 0};
          resample_into(detail::borrowed_sample(base + j.pixels, image_shape, DType::u8),
                        TapsView::of(base + j.rows, out_shape.height, j.row_stride),
                        TapsView::of(base + j.cols, out_shape.width, j.col_stride), flips, normalizer,
                        layout_of(out_shape), std::as_writable_bytes(std::span(crops + i * per_crop, per_crop)));
          labels[i] = j.label;
        }
      },
      [&](void* native) {
        detail::ResizeArgs a;
        a.base = base;
        a.bytes = bytes;
        a.jobs = reinterpret_cast<const ResizeJob*>(base);
        a.count = static_cast<std::uint32_t>(n);
        a.channels = shape.channels;
        a.out_height = shape.height, a.out_width = shape.width;
        a.channels_last = shape.channels_last;
        a.out = crops;
        a.labels = labels;
        const Normalization& norm = normalizer->options();
        a.scale = norm.scale;
        for (std::uint32_t c = 0; c < shape.channels; ++c) {
          a.mean[c] = norm.mean[norm.mean.size() == 1 ? 0 : c];
          a.std[c] = norm.std[norm.std.size() == 1 ? 0 : c];
        }
        detail::cuda_resized_crop(native, a);
      });
  // Before anything that may throw: the slot comes back only after the launch that reads it.
  device_staging->release_after(std::move(dev), *compute);
  compute->record(outputs->event(out));
  return DeviceBatch(std::move(out), shape, DType::f32, n, layout.labels_offset(), std::move(images.labels),
                     std::move(images.ids));
}

GpuResizedCrop::GpuResizedCrop(std::shared_ptr<Device> device, GpuResizedCropOptions options)
    : state_(std::make_shared<State>(std::move(device), std::move(options))) {}

PackedImages GpuResizedCrop::pack(std::vector<Sample> images, const StageContext& ctx) const {
  return state_->pack(std::move(images), ctx);
}

PackedImages GpuResizedCrop::Packer::operator()(std::vector<Sample> images, const StageContext& ctx) const {
  return state_->pack(std::move(images), ctx);
}

DeviceBatch GpuResizedCrop::operator()(PackedImages images, const StageContext& ctx) {
  return state_->cut(std::move(images), ctx);
}

DeviceBatch GpuResizedCrop::operator()(std::vector<Sample> images, const StageContext& ctx) {
  return state_->cut(state_->pack(std::move(images), ctx), ctx);
}

std::shared_ptr<SlotPool> GpuResizedCrop::staging() const noexcept { return state_->host_staging; }
Shape GpuResizedCrop::output_shape() const noexcept { return state_->shape(); }
const RandomResizedCrop& GpuResizedCrop::transform() const noexcept { return state_->crop; }
Device& GpuResizedCrop::device() const noexcept { return *state_->device; }
const GpuResizedCropOptions& GpuResizedCrop::options() const noexcept { return state_->options; }

}  // namespace stoker::gpu
