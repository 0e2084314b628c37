// SPDX-License-Identifier: Apache-2.0
// The `transfer` suite: what stoker's device layer moves and how fast, each figure next to its
// baseline in the same run: host-to-device bandwidth from pinned and from pageable memory;
// a pipeline that streams images to GpuAugment (collate into pinned memory, one copy + crops
// per image batch) against the same pipeline with its copies alone and with its crops alone;
// the crop kernel against a device-to-device copy of as many bytes.
//
// Every figure but one is the wall time from an idle stream until the stream has finished its
// work (an Event tells whether, not when); the crop kernel at the reference shapes, whose
// launches are too short for the wall to time, is timed by the device's timeline.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/timeline.h"
#include "stoker/gpu/augment.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;
using gpu::Device;
using gpu::DeviceBatch;
using gpu::GpuAugment;
using gpu::GpuAugmentOptions;
using gpu::Memory;
using gpu::Stream;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCopySizesMiB[] = {1, 4, 16, 64};
constexpr std::size_t kLargestCopy = 64 * kMiB;
constexpr std::size_t kBytesPerCopyTrial = 256 * kMiB;  // per size: many small copies, a few large ones

// At the reference shapes the host's planning of each crop (of the order of 100 ns) outweighs
// the device's work on it (about 3 KB, ~1 ns on an H100), so the kernel figure is also taken
// on crops big enough for the device to set the pace: 64 crops of 1024x1024 per call move
// 336 MB on the device, about 150 us of an H100's time, several times what a call costs the
// host (with 16 a call, the host set the pace). The 64 source images (71 MB) do not fit an
// H100's 50 MB L2.
constexpr std::uint32_t kBigImageSide = 1056;
constexpr CropSize kBigCrop{1024, 1024};
constexpr std::size_t kBigBatch = 64, kBigImages = 64;

struct TransferOptions {
  std::string device = "auto";
  std::size_t batches = 16;         // image batches per epoch in the overlap figure
  std::size_t batch_images = 1024;  // images per batch
  int collate_threads = 2;          // bodies of the collate stage in the overlap figure
};

// Wall seconds of `work`, which issues to `stream`, from an idle stream until it has finished.
template <class Work>
double timed(Stream& stream, Work&& work) {
  stream.synchronize();
  const auto t0 = Clock::now();
  work();
  stream.synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(const std::vector<double>& samples) { return spread(samples).median; }
double gb(double bytes) { return bytes / 1e9; }

Json figure(const std::vector<double>& samples) {
  const Spread s = spread(samples);
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

// Random pixels and labels: the figures depend on the shapes, not on the pictures.
std::shared_ptr<const IdxDataset> synthetic_images(std::size_t count, std::uint32_t height, std::uint32_t width) {
  IdxDataset d;
  d.images = {static_cast<std::uint32_t>(count), height, width, {}};
  d.images.pixels.resize(count * height * width);
  std::mt19937_64 rng(0x5EED);
  for (std::size_t i = 0; i < d.images.pixels.size(); i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(d.images.pixels.data() + i, &word, std::min<std::size_t>(8, d.images.pixels.size() - i));
  }
  d.labels.resize(count);
  for (auto& label : d.labels) label = static_cast<std::int32_t>(rng() % 10);
  return std::make_shared<const IdxDataset>(std::move(d));
}

GpuAugmentOptions reference_job(std::size_t batch_images) {
  GpuAugmentOptions o;
  o.crops = {.size = {24, 24},
             .count = 5,
             .mirror = MirrorOptions{.axis = Axis::width, .p = 0.5},
             .normalize = Normalization{255.0f, {0.2860f}, {0.3530f}}};
  o.batch_size = 255;
  o.shuffle = {.capacity = 10'000, .min_after_dequeue = 2'000, .seed = 0};
  o.image = Shape{1, 1, 28, 28, false};
  o.max_images = batch_images;
  return o;
}

// Consumes an epoch of `pipe` as a training step would: the consumer stream waits for each
// batch and then gives it back. A figure of an epoch that lost crops is no figure.
template <class T>
std::size_t consume_epoch(Pipeline<T>& pipe, Stream& consumer) {
  std::size_t items = 0;
  for (auto& b : pipe.epoch()) {
    items += b.count;
    consumer.wait(b.ready());
    b.release_after(consumer);
  }
  return items;
}

// Wall seconds of one epoch of the pipeline `build()` makes, from the end of a first epoch
// (which fills it) until the consumer stream has finished the second. `summary` gets the
// pipeline's counters, which say where the time went.
template <class Build>
double timed_epoch(Stream& consumer, Build&& build, std::size_t expected, const char* what,
                   PipelineSummary* summary = nullptr) {
  auto pipe = build();
  std::size_t first = consume_epoch(pipe, consumer), second = 0;
  const double seconds = timed(consumer, [&] { second = consume_epoch(pipe, consumer); });
  if (summary) *summary = pipe.summary();
  if (first != expected || second != expected)
    throw std::runtime_error(std::string("transfer: broken run: an epoch of the ") + what + " pipeline gave " +
                             std::to_string(first) + " and " + std::to_string(second) + " instead of " +
                             std::to_string(expected));
  return seconds;
}

// What one crop moves on the device: its uint8 pixels read, its float32 values and label written.
double crop_traffic(const CropSize& c) { return 5.0 * c.height * c.width + sizeof(std::int32_t); }

// The crop kernel at the reference shapes: GpuAugment over the images held on the device (no
// copies), 5 crops an image, minibatches of 255, one epoch of kReferenceImages images, in calls
// of kCallImages images (as the overlap figure's pipelines) or in one call. A call cuts its crops
// in one launch per 64 minibatches, so a call of 1,024 images is one launch of 15 MB, about 5 us
// of an H100's bandwidth, and its time is mostly the launch's; one call of the epoch is 19
// launches queued back to back, whose times are the kernel's. The kernel's time is taken from
// the device's timeline (the events it records around each launch while a timeline listens),
// summed over the epoch's crop launches; the wall time adds the host's booking of the crops.
constexpr std::size_t kReferenceImages = 60'000, kCallImages = 1'024;

struct ReferenceShape {
  CropSize crop;
  std::size_t images_per_call;  // 0: the whole epoch in one call
  std::vector<double> kernel_s{}, wall_s{}, d2d_s{};
  std::size_t launches = 0;  // crop launches an epoch
};

// One epoch through `augment`, each minibatch taken as a training step takes it: the consumer
// stream waits for it and then gives it back. A figure of an epoch that lost crops is no figure.
template <class Input>
void run_epoch(GpuAugment& augment, std::vector<Input> inputs, Stream& consumer, std::uint32_t epoch,
               std::size_t expected_crops) {
  const StageContext ctx{.seed = 0, .epoch = epoch};
  std::vector<DeviceBatch> out;
  Emitter<DeviceBatch> emit(out);
  std::size_t crops = 0;
  const auto consume = [&] {
    for (DeviceBatch& b : out) {
      crops += b.count;
      consumer.wait(b.ready());
      b.release_after(consumer);
    }
    out.clear();
  };
  for (Input& in : inputs) {
    augment(std::move(in), emit, ctx);
    consume();
  }
  augment.end_epoch(emit, ctx);
  consume();
  if (crops != expected_crops)
    throw std::runtime_error("transfer: broken run: an epoch gave " + std::to_string(crops) + " crops instead of " +
                             std::to_string(expected_crops));
}

// One epoch of `augment` (resident) at shape `shape`: its wall time until the consumer is done,
// and the device time of its crop launches, from a timeline of the device.
void time_reference_epoch(const std::shared_ptr<Device>& device, GpuAugment& augment, std::size_t images,
                          Stream& consumer, std::uint32_t epoch, ReferenceShape& shape) {
  const std::size_t per_call = shape.images_per_call ? shape.images_per_call : images;
  std::vector<std::vector<std::uint64_t>> inputs((images + per_call - 1) / per_call);
  for (std::size_t i = 0; i < images; ++i) inputs[i / per_call].push_back(i);
  const auto timeline = gpu::device_timeline(device);
  timeline->start();
  const double wall = timed(consumer, [&] { run_epoch(augment, std::move(inputs), consumer, epoch, images * 5); });
  std::vector<TimedSpan> spans;
  timeline->take(spans);
  timeline->stop();
  double kernel = 0;
  std::size_t launches = 0;
  for (const TimedSpan& s : spans)
    if (std::string_view(s.name) == "crop") {
      kernel += std::chrono::duration<double>(s.end - s.begin).count();
      ++launches;
    }
  if (launches == 0 || (shape.launches && launches != shape.launches))
    throw std::runtime_error("transfer: broken run: the device's timeline gave " + std::to_string(launches) +
                             " crop launches for an epoch of " + std::to_string(shape.crop.height) + "x" +
                             std::to_string(shape.crop.width) + " crops (" + std::to_string(shape.launches) +
                             " before)");
  shape.launches = launches;
  shape.kernel_s.push_back(kernel);
  shape.wall_s.push_back(wall);
}

// `copies` host-to-device copies of `bytes` (at most kLargestCopy) each. They walk through
// buffers of kLargestCopy bytes so that no copy is served from a cache that the one before
// warmed (the CPU backend's case).
double h2d_seconds(Stream& s, std::byte* dst, const std::byte* src, std::size_t bytes, std::size_t copies) {
  const std::size_t places = kLargestCopy / bytes;
  return timed(s, [&] {
    for (std::size_t i = 0; i < copies; ++i)
      s.copy_to_device(dst + i % places * bytes, src + i % places * bytes, bytes);
  });
}

// A device-to-device copy that moves `traffic` bytes (read + written), in copies of kLargestCopy.
double d2d_seconds(Stream& s, Memory& a, Memory& b, double traffic) {
  return timed(s, [&] {
    for (double left = traffic / 2; left > 0; left -= kLargestCopy)
      s.copy_on_device(b.data(), a.data(), static_cast<std::size_t>(std::min<double>(left, kLargestCopy)));
  });
}

// true / false on a GPU; null on the CPU backend, where the goals do not apply.
Json goal(const std::string& what, double value, const std::string& bar, bool met, bool on_gpu) {
  return {{"figure", what}, {"value", value}, {"bar", bar}, {"met", on_gpu ? Json(met) : Json(nullptr)}};
}

Json run_transfer(const TransferOptions& opt, const CommonOptions& common) {
  if (opt.batches == 0 || opt.batch_images == 0)
    throw std::invalid_argument("transfer: --batches and --batch-images must be at least 1");
  const std::shared_ptr<Device> device = Device::open(opt.device);
  const bool on_gpu = device->backend() == gpu::Backend::cuda;
  const bool gpu_found = gpu::cuda_device_count() > 0;
  const std::unique_ptr<Stream> stream = device->make_stream();
  const std::unique_ptr<Stream> consumer = device->make_stream();
  std::cout << "transfer: device " << device->name() << "\n";
  if (!on_gpu)
    std::cout << (gpu_found ? "CPU backend (--device cpu): the goals apply to a GPU only\n"
                            : "no GPU found: CPU backend figures\n");

  // ---- set-up, untimed

  Memory pinned = device->allocate_pinned(kLargestCopy);
  std::vector<std::byte> pageable(kLargestCopy, std::byte{1});  // written, so every page is mapped
  std::memset(pinned.data(), 1, kLargestCopy);
  Memory on_device = device->allocate(kLargestCopy), on_device_too = device->allocate(kLargestCopy);

  const std::size_t n_images = opt.batches * opt.batch_images;
  const auto images = synthetic_images(n_images, 28, 28);
  const auto index_batches = [](std::size_t batches, std::size_t size, std::size_t data_set) {
    std::vector<std::vector<std::uint64_t>> out(batches);
    for (std::size_t i = 0; i < batches * size; ++i) out[i / size].push_back(i % data_set);
    return out;
  };
  // The overlap figure's three pipelines: the same source of images and batches of them; then
  // collate + copy + crops (streaming), collate + copy (ToDevice), or crops alone (resident).
  GpuAugment streaming(device, reference_job(opt.batch_images));
  GpuAugment resident = GpuAugment::resident(device, images, reference_job(opt.batch_images));
  const gpu::ToDevice to_device(device,
                                {.bytes = Batch::storage_bytes({1, 1, 28, 28, false}, DType::u8, opt.batch_images),
                                 .staging_buffers = 3,
                                 .device_buffers = 4});
  const std::size_t n_crops = n_images * 5;
  const StageOptions collate{.threads = opt.collate_threads, .queue = 2};
  const auto streaming_pipeline = [&] {
    return PipelineBuilder{}
        .epochs(2)
        .source("read", IdxReader(images))
        .batch("batch", opt.batch_images, {.queue = 2})
        .map("collate", Collate{.pool = streaming.staging()}, collate)
        .flat_map<DeviceBatch>("gpu_augment", streaming, {.queue = 8})
        .build();
  };
  const auto copy_pipeline = [&] {
    return PipelineBuilder{}
        .epochs(2)
        .source("read", IdxReader(images))
        .batch("batch", opt.batch_images, {.queue = 2})
        .map("collate", Collate{.pool = to_device.staging()}, collate)
        .map("h2d", to_device, {.queue = 2})
        .build();
  };
  const auto crop_pipeline = [&] {
    return PipelineBuilder{}
        .epochs(2)
        .source("ids", IdSource(IdxReader(images)))
        .batch("batch", opt.batch_images, {.queue = 2})
        .flat_map<DeviceBatch>("gpu_augment", resident, {.queue = 8})
        .build();
  };

  const auto big_images = synthetic_images(kBigImages, kBigImageSide, kBigImageSide);
  GpuAugmentOptions big_job = reference_job(kBigBatch);
  big_job.crops.size = kBigCrop;
  big_job.crops.count = 1;
  big_job.batch_size = kBigBatch;
  big_job.shuffle = {.capacity = kBigBatch, .min_after_dequeue = 0, .seed = 0};  // a minibatch per call
  GpuAugment big = GpuAugment::resident(device, big_images, big_job);
  const std::size_t big_calls = on_gpu ? 64 : 4;  // ~10 ms on an H100, ~0.3 s on the CPU backend

  const std::size_t reference_images = on_gpu ? kReferenceImages : kReferenceImages / 10;
  const auto reference_data = synthetic_images(reference_images, 28, 28);
  std::vector<ReferenceShape> shapes{
      {CropSize{24, 24}, kCallImages}, {CropSize{26, 26}, kCallImages}, {CropSize{24, 24}, 0}, {CropSize{26, 26}, 0}};
  std::vector<GpuAugment> reference_augments;
  for (const ReferenceShape& shape : shapes) {
    GpuAugmentOptions o = reference_job(shape.images_per_call ? shape.images_per_call : reference_images);
    o.crops.size = shape.crop;
    reference_augments.push_back(GpuAugment::resident(device, reference_data, o));
  }

  // A first run of each, which also says what the streaming pipeline copies per batch.
  const std::size_t big_crops = big_calls * kBigBatch;
  const gpu::TransferCounts before = device->transfers();
  (void)timed_epoch(*consumer, streaming_pipeline, n_crops, "streaming");
  const gpu::TransferCounts after = device->transfers();
  const std::uint64_t copies = (after.h2d_copies - before.h2d_copies) / 2, d2h = after.d2h_copies - before.d2h_copies;
  // One copy per batch (images, crop jobs, gather slots), and at the end of the epoch one of
  // the slots that the drain gathers (a few KB).
  const std::size_t copy_bytes = (after.h2d_bytes - before.h2d_bytes) / (2 * opt.batches);
  if (copies != opt.batches + 1)
    throw std::logic_error("transfer: the streaming pipeline copied " + std::to_string(copies) +
                           " times an epoch, for " + std::to_string(opt.batches) + " batches and the drain");
  run_epoch(big, index_batches(big_calls, kBigBatch, kBigImages), *consumer, 0, big_crops);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    time_reference_epoch(device, reference_augments[i], reference_images, *consumer, 0, shapes[i]);
    shapes[i].kernel_s.clear(), shapes[i].wall_s.clear();
  }

  // ---- the figures, each repeat taking all of them

  struct CopySize {
    std::size_t bytes, copies;
    std::vector<double> pinned, pageable;  // GB/s
  };
  std::vector<CopySize> sizes;
  for (std::size_t mib : kCopySizesMiB)
    sizes.push_back({mib * kMiB, std::max<std::size_t>(4, kBytesPerCopyTrial / (mib * kMiB)), {}, {}});
  std::vector<double> pipelined_s, copy_s, crop_s, big_s, big_d2d_s;
  PipelineSummary summaries[3];  // of the last repeat: streaming, copy alone, crop alone
  const double big_bytes = static_cast<double>(big_crops) * crop_traffic(kBigCrop);

  for (int rep = 0; rep < common.repeats; ++rep) {
    std::cerr << "transfer: repeat " << rep + 1 << "/" << common.repeats << "\n";
    const auto epoch = static_cast<std::uint32_t>(rep + 1);
    for (CopySize& s : sizes) {
      const double bytes = static_cast<double>(s.bytes * s.copies);
      s.pinned.push_back(gb(bytes) / h2d_seconds(*stream, on_device.data(), pinned.data(), s.bytes, s.copies));
      s.pageable.push_back(gb(bytes) / h2d_seconds(*stream, on_device.data(), pageable.data(), s.bytes, s.copies));
    }
    pipelined_s.push_back(timed_epoch(*consumer, streaming_pipeline, n_crops, "streaming", &summaries[0]));
    copy_s.push_back(timed_epoch(*consumer, copy_pipeline, n_images, "copy", &summaries[1]));
    crop_s.push_back(timed_epoch(*consumer, crop_pipeline, n_crops, "resident", &summaries[2]));
    auto indices = index_batches(big_calls, kBigBatch, kBigImages);
    big_s.push_back(timed(*consumer, [&] { run_epoch(big, std::move(indices), *consumer, epoch, big_crops); }));
    big_d2d_s.push_back(d2d_seconds(*stream, on_device, on_device_too, big_bytes));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      time_reference_epoch(device, reference_augments[i], reference_images, *consumer, epoch, shapes[i]);
      shapes[i].d2d_s.push_back(
          d2d_seconds(*stream, on_device, on_device_too, reference_images * 5 * crop_traffic(shapes[i].crop)));
    }
  }

  // ---- report

  double best = 0;
  for (const CopySize& s : sizes) best = std::max({best, median(s.pinned), median(s.pageable)});
  double worst_pinned_share = 1;
  Json h2d = Json::array();
  std::cout << std::fixed << std::setprecision(2) << "\nhost-to-device GB/s, medians of " << common.repeats
            << " repeats\n  size      pinned  pageable  pinned/best\n";
  for (const CopySize& s : sizes) {
    const double share = median(s.pinned) / best;
    if (s.bytes >= 4 * kMiB) worst_pinned_share = std::min(worst_pinned_share, share);
    std::cout << "  " << std::setw(3) << s.bytes / kMiB << " MiB  " << std::setw(8) << median(s.pinned) << std::setw(10)
              << median(s.pageable) << std::setw(13) << share << "\n";
    h2d.push_back({{"size_mib", s.bytes / kMiB},
                   {"copies", s.copies},
                   {"pinned_gb_s", figure(s.pinned)},
                   {"pageable_gb_s", figure(s.pageable)},
                   {"pinned_vs_best", share}});
  }

  const double pipelined = median(pipelined_s), copy = median(copy_s), crop = median(crop_s);
  const double overlap_ratio = pipelined / std::max(copy, crop);
  std::cout << "\noverlap: pipelines of " << opt.batches << " batches of " << opt.batch_images << " images 28x28, "
            << n_crops << " crops; one copy of " << copy_bytes / 1024 << " KiB per batch and one for the drain\n"
            << std::setprecision(2) << "  copy alone (collate + h2d) " << copy * 1e3 << " ms, crop alone (resident) "
            << crop * 1e3 << " ms, sum " << (copy + crop) * 1e3 << " ms\n  pipelined (collate + h2d + crops) "
            << pipelined * 1e3 << " ms = " << std::setprecision(3) << overlap_ratio << " x max(copy, crop)\n";
  const char* names[] = {"streaming", "copy alone", "crop alone"};
  for (int i = 0; i < 3; ++i) {
    std::cerr << "\nthe " << names[i] << " pipeline, two epochs of the last repeat:\n";
    print_summary(std::cerr, summaries[i]);
  }

  const double big_gb_s = gb(big_bytes) / median(big_s), big_d2d_gb_s = gb(big_bytes) / median(big_d2d_s);
  const double kernel_ratio = big_gb_s / big_d2d_gb_s;
  std::cout << "\ncrop kernel, GB/s read + written (device-to-device copy of as many bytes)\n";
  Json reference = Json::array();
  double reference_ratio = 0, per_call_ratio = 0;  // at the reference job's 24x24: one call, calls of 1,024
  for (const ReferenceShape& shape : shapes) {
    const double crops = static_cast<double>(reference_images * 5), bytes = crops * crop_traffic(shape.crop);
    const double kernel_gb_s = gb(bytes) / median(shape.kernel_s), copy_gb_s = gb(bytes) / median(shape.d2d_s);
    const double crops_per_s = crops / median(shape.wall_s);
    if (shape.crop.height == 24) (shape.images_per_call ? per_call_ratio : reference_ratio) = kernel_gb_s / copy_gb_s;
    const std::string calls = shape.images_per_call ? "calls of " + std::to_string(shape.images_per_call) : "one call";
    std::cout << std::setprecision(2) << "  crops " << shape.crop.height << "x" << shape.crop.width << " of 28x28, "
              << std::setw(14) << std::left << calls << std::right << std::setw(8) << kernel_gb_s << " (" << copy_gb_s
              << ") = " << std::setprecision(3) << kernel_gb_s / copy_gb_s << " of the copy, device time of "
              << shape.launches << " launches; an epoch " << std::setprecision(1) << crops_per_s / 1e6
              << " M crops/s wall\n";
    reference.push_back({{"crop", {shape.crop.height, shape.crop.width}},
                         {"images_per_call", shape.images_per_call ? shape.images_per_call : reference_images},
                         {"crop_launches", shape.launches},
                         {"kernel_s", figure(shape.kernel_s)},
                         {"wall_s", figure(shape.wall_s)},
                         {"d2d_copy_s", figure(shape.d2d_s)},
                         {"crop_gb_s", kernel_gb_s},
                         {"d2d_copy_gb_s", copy_gb_s},
                         {"ratio", kernel_gb_s / copy_gb_s},
                         {"crops_per_s", crops_per_s}});
  }
  std::cout << std::setprecision(2) << "  crops 1024x1024 of 1056^2, 64 a call " << std::setw(8) << big_gb_s << " ("
            << big_d2d_gb_s << ") = " << std::setprecision(3) << kernel_ratio << " of the copy, wall time\n";

  Json goals;
  goals["pinned_h2d"] = goal("lowest pinned_vs_best over sizes >= 4 MiB", worst_pinned_share, ">= 0.90",
                             worst_pinned_share >= 0.9, on_gpu);
  goals["overlap"] = goal("pipelined / max(copy, crop)", overlap_ratio, "<= 1.1", overlap_ratio <= 1.1, on_gpu);
  goals["crop_kernel"] = goal("crop kernel GB/s / device-to-device copy GB/s, 1024x1024 crops", kernel_ratio, ">= 0.70",
                              kernel_ratio >= 0.7, on_gpu);
  goals["crop_kernel_reference"] =
      goal("crop kernel GB/s (device time, the epoch in one call) / device-to-device copy GB/s, 24x24 of 28x28",
           reference_ratio, ">= 0.50", reference_ratio >= 0.5, on_gpu);
  goals["crop_kernel_reference_per_call"] = goal("the same in calls of 1,024 images (one launch of 15 MB each)",
                                                 per_call_ratio, ">= 0.50", per_call_ratio >= 0.5, on_gpu);
  std::cout << "\ngoals " << (on_gpu ? "(GPU):" : "(not applicable on the CPU backend):");
  for (const auto& [name, g] : goals.items()) {
    const char* verdict = g["met"].is_null() ? "" : g["met"].get<bool>() ? " met" : " MISSED";
    std::cout << "  " << name << " " << std::setprecision(3) << g["value"].get<double>() << " "
              << g["bar"].get<std::string>() << verdict;
  }
  std::cout << "\n";

  Json config;
  config["device_option"] = opt.device;
  config["repeats"] = common.repeats;
  config["clock"] = "host wall time from an idle stream until it is synchronized; GB/s and ratios from medians";
  config["h2d"] = {{"sizes_mib", kCopySizesMiB},
                   {"bytes_per_trial", kBytesPerCopyTrial},
                   {"pageable", "std::vector"},
                   {"pinned", "Device::allocate_pinned"}};
  config["overlap"] = {
      {"batches", opt.batches},
      {"batch_images", opt.batch_images},
      {"collate_threads", opt.collate_threads},
      {"image", {28, 28}},
      {"crops", "5 x 24x24 per image, mirror p=0.5, normalize (x/255-0.2860)/0.3530"},
      {"minibatch", 255},
      {"shuffle", {{"capacity", 10'000}, {"min_after_dequeue", 2'000}}},
      {"timing", "one epoch of a pipeline, after a first epoch that fills it, until the consumer stream is done"},
      {"pipelined",
       "read -> batch -> collate into GpuAugment::staging() -> gpu_augment (streaming: one copy, crops into the "
       "window, gathers) -> consumer stream waits for each minibatch and gives it back"},
      {"copy_alone", "read -> batch -> collate into ToDevice::staging() -> h2d (one copy per batch) -> consumer"},
      {"crop_alone",
       "indices -> batch -> gpu_augment (GpuAugment::resident over the same images: the same crops and minibatches, "
       "no copies and no gather) -> consumer"}};
  config["crop_kernel"] = {{"bytes_per_crop", "uint8 pixels read + float32 values and int32 label written"},
                           {"baseline", "copy_on_device of half as many bytes (read + written: the same count)"},
                           {"reference_shapes",
                            {{"images", reference_images},
                             {"image", {28, 28}},
                             {"crops", "5 per image, mirror p=0.5, normalize; minibatch 255, shuffle 10,000 / 2,000"},
                             {"images_per_call", {kCallImages, reference_images}},
                             {"data", "held on the device (GpuAugment::resident): no copies"},
                             {"kernel_time",
                              "sum over an epoch's crop launches of the time between the events the device's "
                              "timeline records around each"},
                             {"wall_time", "the epoch, from an idle stream until the consumer stream is done"}}},
                           {"large_shapes",
                            {{"images", kBigImages},
                             {"image", {kBigImageSide, kBigImageSide}},
                             {"crop", {kBigCrop.height, kBigCrop.width}},
                             {"crops_per_call", kBigBatch},
                             {"calls", big_calls}}}};

  Json results;
  results["h2d"] = {{"sizes", std::move(h2d)}, {"best_gb_s", best}};
  results["overlap"] = {{"pipelined_s", figure(pipelined_s)},
                        {"copy_s", figure(copy_s)},
                        {"crop_s", figure(crop_s)},
                        {"sum_s", copy + crop},
                        {"max_s", std::max(copy, crop)},
                        {"pipelined_over_max", overlap_ratio},
                        {"crops", n_crops},
                        {"h2d_copies", copies},
                        {"h2d_bytes_per_batch", copy_bytes},
                        {"d2h_copies", d2h}};
  results["crop_kernel"] = {
      {"reference_shapes", std::move(reference)},
      {"large_shapes", {{"crop_gb_s", big_gb_s}, {"d2d_copy_gb_s", big_d2d_gb_s}, {"ratio", kernel_ratio}}}};

  Json out;
  out["device"] = gpu::backend_name(device->backend());
  out["gpu_found"] = gpu_found;
  out["device_name"] = device->name();
  out["config"] = std::move(config);
  out["results"] = std::move(results);
  out["goals"] = std::move(goals);
  return out;
}

}  // namespace

SuiteRun setup_transfer(CLI::App& command) {
  auto opt = std::make_shared<TransferOptions>();
  command.add_option("--device", opt->device, "Device backend")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  command.add_option("--batches", opt->batches, "Image batches per epoch in the overlap figure")
      ->check(apps::in_range<std::size_t>(1, 4096))
      ->capture_default_str();
  command.add_option("--batch-images", opt->batch_images, "Images per batch in the overlap figure")
      ->check(apps::in_range<std::size_t>(1, 16384))
      ->capture_default_str();
  command.add_option("--collate-threads", opt->collate_threads, "Threads of the collate stage in the overlap figure")
      ->check(apps::in_range(1, 64))
      ->capture_default_str();
  return [opt](const CommonOptions& common) { return run_transfer(*opt, common); };
}

}  // namespace stoker::bench
