// SPDX-License-Identifier: Apache-2.0
#include "augment_crop.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backends.h"

namespace stoker::gpu::detail {

static_assert(std::is_trivially_copyable_v<CropJob> && sizeof(CropJob) == 28, "a CropJob is 7 words on the wire");

namespace {

PixelType pixel_type(DType t) {
  switch (t) {
    case DType::u8:
      return PixelType::u8;
    case DType::u16:
      return PixelType::u16;
    case DType::f32:
      return PixelType::f32;
  }
  throw std::invalid_argument("crop kernels: unsupported dtype " + std::to_string(static_cast<int>(t)));
}

// The values a Normalizer was built from, one per table channel, by the rule it applies.
float channel_value(const std::vector<float>& values, std::size_t t) { return values[values.size() == 1 ? 0 : t]; }

}  // namespace

CropJob make_job(std::uint32_t image, const PlannedCrop& crop, std::int32_t label, std::uint32_t dst) noexcept {
  const std::uint32_t flips =
      (crop.flips.depth ? kFlipDepth : 0) | (crop.flips.height ? kFlipHeight : 0) | (crop.flips.width ? kFlipWidth : 0);
  return CropJob{image, dst, crop.window.z, crop.window.y, crop.window.x, flips, label};
}

Sample borrowed_sample(const std::byte* data, Shape shape, DType dtype, std::int32_t label, std::uint64_t id) {
  Sample s;
  s.data = Buffer::view({data, shape.elements() * dtype_size(dtype)});
  s.shape = shape;
  s.dtype = dtype;
  s.label = label;
  s.id = id;
  return s;
}

CropKernels::CropKernels(Shape image, DType dtype, CropSize size, Normalizer normalizer)
    : image_(image),
      dtype_(dtype),
      extent_(center_window(image, size)),
      crop_{image.channels, extent_.depth, extent_.height, extent_.width, image.volume},
      table_channels_(
          static_cast<std::uint32_t>(std::max(normalizer.options().mean.size(), normalizer.options().std.size()))),
      normalizer_(std::make_shared<const Normalizer>(std::move(normalizer))) {
  (void)pixel_type(dtype);
  normalizer_->check(image, "crop kernels");
}

std::size_t CropKernels::table_bytes() const noexcept {
  return (256 + 2) * std::size_t{table_channels_} * sizeof(float);
}

// Layout: 256 lookup values per table channel, then the means, then the stds.
void CropKernels::write_table(std::byte* dst) const noexcept {
  const std::size_t n = table_channels_;
  auto* out = reinterpret_cast<float*>(dst);
  for (std::size_t t = 0; t < n; ++t) std::memcpy(out + 256 * t, normalizer_->table(t), 256 * sizeof(float));
  const auto& o = normalizer_->options();
  for (std::size_t t = 0; t < n; ++t) {
    out[256 * n + t] = channel_value(o.mean, t);
    out[257 * n + t] = channel_value(o.std, t);
  }
}

CropDraws CropKernels::draws_for(const RandomCropOptions& o, std::uint64_t seed, std::uint32_t epoch) const {
  CropDraws d;
  d.window_seed = seed ^ mix64(o.salt);
  d.epoch = epoch;
  d.count = static_cast<std::uint32_t>(o.count);
  d.spare_z = image_.depth - extent_.depth + 1;
  d.spare_y = image_.height - extent_.height + 1;
  d.spare_x = image_.width - extent_.width + 1;
  if (o.mirror) {
    d.mirror = true;
    d.mirror_seed = seed ^ mix64(o.mirror->salt);
    d.mirror_p = o.mirror->p;
    d.mirror_flips = make_job(0, PlannedCrop{{}, Flips::along(o.mirror->axis), 0}, 0).flips;
  }
  return d;
}

CropJob CropKernels::drawn_job(std::uint32_t image, std::uint64_t id, std::uint32_t k, std::int32_t label) noexcept {
  return CropJob{image, 0, static_cast<std::uint32_t>(id >> 32), static_cast<std::uint32_t>(id), k, kDrawn, label};
}

void CropKernels::crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs,
                       std::size_t count, const std::byte* table, float* out, std::int32_t* labels,
                       std::size_t out_slots, const CropDraws& draws) const {
  const CropOutput output{out, labels, 0, static_cast<std::uint32_t>(std::min<std::size_t>(out_slots, UINT32_MAX))};
  crop(stream, images, image_count, jobs, count, table, std::span(&output, 1), draws);
}

void CropKernels::crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs,
                       std::size_t count, const std::byte* table, std::span<const CropOutput> outputs,
                       const CropDraws& draws) const {
  if (count == 0) return;
  if (outputs.empty() || outputs.front().first != 0 || count > UINT32_MAX)
    throw std::logic_error("CropKernels::crop: the outputs must start at job 0, and a launch take under 2^32 jobs");
  for (std::size_t o = 1; o < outputs.size(); ++o)
    if (outputs[o].first < outputs[o - 1].first || outputs[o].first > count)
      throw std::logic_error("CropKernels::crop: the outputs' first jobs must ascend within the jobs");
  // Launches of at most kMaxCropOutputs outputs each: outputs [o, end) take jobs [at, until).
  for (std::size_t o = 0; o < outputs.size(); o += kMaxCropOutputs) {
    const std::size_t end = std::min(outputs.size(), o + kMaxCropOutputs);
    const std::uint32_t at = outputs[o].first;
    const std::uint32_t until = end < outputs.size() ? outputs[end].first : static_cast<std::uint32_t>(count);
    if (until == at) continue;
    std::vector<CropOutput> part(outputs.begin() + o, outputs.begin() + end);
    for (CropOutput& p : part) p.first -= at;
    launch_crop(stream, images, image_count, jobs + at, until - at, table, std::move(part), draws);
  }
}

void CropKernels::launch_crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs,
                              std::uint32_t count, const std::byte* table, std::vector<CropOutput> outputs,
                              const CropDraws& draws) const {
  launch(
      stream, "crop",
      [=, normalizer = normalizer_, image = image_, dtype = dtype_, extent = extent_, elements = crop_elements(),
       bytes = image_bytes()] {
        for (std::uint32_t i = 0; i < count; ++i) {
          CropJob job = jobs[i];
          draw_if_asked(draws, job);
          const CropOutput& o = output_of(outputs.data(), static_cast<std::uint32_t>(outputs.size()), i);
          if (job.image >= image_count || job.dst >= o.slots)
            throw std::out_of_range("crop job " + std::to_string(i) + ": image " + std::to_string(job.image) + " of " +
                                    std::to_string(image_count) + ", slot " + std::to_string(job.dst) + " of " +
                                    std::to_string(o.slots));
          if (!window_inside(job, extent.depth, extent.height, extent.width, image.depth, image.height, image.width))
            throw std::out_of_range("crop job " + std::to_string(i) + ": its window at (" + std::to_string(job.z) +
                                    ", " + std::to_string(job.y) + ", " + std::to_string(job.x) +
                                    ") lies outside the image " + image.str());
          Window w = extent;
          w.z = job.z, w.y = job.y, w.x = job.x;
          const Flips flips{(job.flips & kFlipDepth) != 0, (job.flips & kFlipHeight) != 0,
                            (job.flips & kFlipWidth) != 0};
          crop_mirror_normalize_into(borrowed_sample(images + job.image * bytes, image, dtype), w, flips, *normalizer,
                                     std::span<float>(o.out + job.dst * elements, elements));
          o.labels[job.dst] = job.label;
        }
      },
      [&](void* native) {
        CropArgs a;
        a.images = images;
        a.image_count = image_count;
        a.pixel = pixel_type(dtype_);
        a.channels = image_.channels, a.depth = image_.depth, a.height = image_.height, a.width = image_.width;
        a.crop_depth = extent_.depth, a.crop_height = extent_.height, a.crop_width = extent_.width;
        a.jobs = jobs;
        a.count = count;
        a.draws = draws;
        const auto* t = reinterpret_cast<const float*>(table);
        a.lut = t;
        a.mean = t + 256 * std::size_t{table_channels_};
        a.std = a.mean + table_channels_;
        a.scale = normalizer_->options().scale;
        a.table_channels = table_channels_;
        a.output_count = static_cast<std::uint32_t>(outputs.size());
        std::copy(outputs.begin(), outputs.end(), a.outputs);
        cuda_crop(native, a);
      });
}

void CropKernels::gather(Stream& stream, const float* from, const std::int32_t* from_labels, std::size_t from_slots,
                         const std::uint32_t* slots, std::size_t count, float* out, std::int32_t* labels) const {
  if (count == 0) return;
  const std::size_t elements = crop_elements();
  launch(
      stream, "gather",
      [=] {
        for (std::size_t i = 0; i < count; ++i) {
          if (slots[i] >= from_slots)
            throw std::out_of_range("gather: slot " + std::to_string(slots[i]) + " of " + std::to_string(from_slots));
          std::memcpy(out + i * elements, from + slots[i] * elements, elements * sizeof(float));
          labels[i] = from_labels[slots[i]];
        }
      },
      [&](void* native) {
        cuda_gather(native, GatherArgs{from, from_labels, from_slots, slots, static_cast<std::uint32_t>(count),
                                       elements, out, labels});
      });
}

}  // namespace stoker::gpu::detail
