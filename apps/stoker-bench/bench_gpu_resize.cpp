// SPDX-License-Identifier: Apache-2.0
// The `gpu_resize` suite: GpuResizedCrop (torchvision's RandomResizedCrop, the mirror and the
// normalization of decoded images, on the device) on batches of the image job's images
// (160-512 pixels a side, channels-last uint8, as decoded), against
//   - a device-to-device copy that moves as many bytes as the kernel must (each image's bytes
//     read once, each crop written once), timed the same way, with events around it;
//   - the CPU's RandomResizedCrop of the same batch, on every core of the host (oneTBB).
// The kernel's time comes from the device's timeline (the events around each "resized crop"
// launch); "copy + crop" is the host's wall time from issuing a packed batch to the consumer
// stream having it, one batch at a time. Packing (drawing windows, computing weights, filling
// the pinned buffer) is the host's and is timed apart.
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/image_augment.h"
#include "stoker/stages/image_transforms.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;
using gpu::Device;
using gpu::Stream;

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};

struct GpuResizeOptions {
  std::string device = "auto";
  std::size_t batch = 256;
  std::size_t batches = 8;  // per repeat
  std::uint32_t size = 224;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Json run(const GpuResizeOptions& o, const CommonOptions& common) {
  const std::shared_ptr<Device> device = Device::open(o.device);
  const bool on_gpu = device->backend() == gpu::Backend::cuda;
  std::cout << "gpu_resize: device " << device->name() << (on_gpu ? "" : " (CPU backend: no GPU figures)") << "\n";

  // One batch of images, viewed (not copied) by every batch made of it.
  auto pool = BufferPool::create();
  const auto images = std::make_shared<std::vector<Sample>>();
  Rng rng(2027);
  std::size_t image_bytes = 0;
  for (std::size_t i = 0; i < o.batch; ++i) {
    const auto h = static_cast<std::uint32_t>(160 + rng.below(353)), w = static_cast<std::uint32_t>(160 + rng.below(353));
    Sample s(*pool, Shape{.channels = 3, .height = h, .width = w, .channels_last = true}, DType::u8, 0, i);
    for (auto& v : s.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
    image_bytes += s.data.size();
    images->push_back(std::move(s));
  }
  const auto batch_of = [&] {
    std::vector<Sample> b;
    for (const Sample& s : *images) b.push_back(Sample::view(s, images));
    return b;
  };

  const RandomResizedCropOptions crop_options{
      .size = {o.size, o.size}, .mirror = MirrorOptions{}, .normalize = kImageNet, .layout = Layout::planar};
  gpu::GpuResizedCrop crop(device, {.crop = crop_options, .max_images = o.batch});
  const RandomResizedCrop cpu_crop(crop_options);
  const std::size_t out_bytes = o.batch * 3 * std::size_t{o.size} * o.size * sizeof(float);
  const double traffic = static_cast<double>(image_bytes + out_bytes);  // read once, written once

  const std::unique_ptr<Stream> consumer = device->make_stream(), copier = device->make_stream();
  gpu::Memory a = device->allocate(std::max(image_bytes, out_bytes)), b = device->allocate(std::max(image_bytes, out_bytes));
  std::vector<std::vector<float>> cpu_out(o.batch, std::vector<float>(out_bytes / o.batch / sizeof(float)));

  std::vector<double> kernel_s, wall_s, pack_s, copy_s, cpu_s;
  std::uint32_t epoch = 0;
  for (int repeat = -1; repeat < common.repeats; ++repeat) {  // repeat -1: warm-up, not kept
    const auto timeline = gpu::device_timeline(device);
    timeline->start();
    double wall = 0, pack = 0;
    for (std::size_t i = 0; i < o.batches; ++i, ++epoch) {
      const StageContext ctx{.seed = 1, .epoch = epoch};
      const auto t0 = Clock::now();
      gpu::PackedImages packed = crop.pack(batch_of(), ctx);
      const auto t1 = Clock::now();
      gpu::DeviceBatch out = crop(std::move(packed), ctx);
      consumer->wait(out.ready());
      out.release_after(*consumer);
      consumer->synchronize();
      pack += seconds(t1 - t0);
      wall += seconds(Clock::now() - t1);
    }
    std::vector<TimedSpan> spans;
    timeline->take(spans);
    timeline->stop();
    double kernel = 0;
    std::size_t launches = 0;
    for (const auto& s : spans)
      if (std::string_view(s.name) == "resized crop") kernel += seconds(s.end - s.begin), ++launches;
    if (launches != o.batches)
      throw std::runtime_error("gpu_resize: broken run: the timeline gave " + std::to_string(launches) +
                               " resized crop launches for " + std::to_string(o.batches) + " batches");
    // The copy: the same traffic, half read and half written, events around it as around the kernel.
    double copy = 0;
    for (std::size_t i = 0; i < o.batches; ++i) {
      const auto copy_timeline = gpu::device_timeline(device);
      copy_timeline->start();
      gpu::timed_work(*copier, "copy", [&] { copier->copy_on_device(b.data(), a.data(), static_cast<std::size_t>(traffic / 2)); });
      copier->synchronize();
      std::vector<TimedSpan> copies;
      copy_timeline->take(copies);
      copy_timeline->stop();
      for (const auto& s : copies) copy += seconds(s.end - s.begin);
    }
    // The CPU: the same crops (window and mirror drawn alike) on every core.
    const auto t_cpu = Clock::now();
    for (std::size_t i = 0; i < o.batches; ++i)
      tbb::parallel_for(std::size_t{0}, o.batch, [&](std::size_t k) {
        const Sample& s = (*images)[k];
        const StageContext ctx{.seed = 1, .epoch = static_cast<std::uint32_t>(i)};
        const PlannedCrop p = cpu_crop.plan(s.shape.height, s.shape.width, s.id, ctx);
        cpu_crop.apply_into(s, {}, p, std::as_writable_bytes(std::span(cpu_out[k])));
      });
    const double cpu = seconds(Clock::now() - t_cpu);
    if (repeat < 0) continue;
    kernel_s.push_back(kernel);
    wall_s.push_back(wall);
    pack_s.push_back(pack);
    copy_s.push_back(copy);
    cpu_s.push_back(cpu);
  }

  const double crops = static_cast<double>(o.batch * o.batches), gb = traffic * o.batches / 1e9;
  const double kernel = spread(kernel_s).median, copy = spread(copy_s).median, wall = spread(wall_s).median,
               pack = spread(pack_s).median, cpu = spread(cpu_s).median;
  std::cout << std::fixed << std::setprecision(0) << o.batches << " batches of " << o.batch << " images (mean "
            << image_bytes / o.batch / 1024 << " KiB) to " << o.size << "x" << o.size
            << " float32, medians of " << common.repeats << " repeats\n"
            << "  kernel            " << std::setw(10) << crops / kernel << " crops/s  " << std::setprecision(1)
            << gb / kernel << " GB/s of traffic\n"
            << "  device copy       " << std::setw(10) << std::setprecision(0) << crops / copy << "          "
            << std::setprecision(1) << gb / copy << " GB/s  (kernel / copy " << std::setprecision(3) << copy / kernel
            << ")\n"
            << "  copy + crop, wall " << std::setw(10) << std::setprecision(0) << crops / wall << " crops/s\n"
            << "  packing (1 thread)" << std::setw(10) << crops / pack << " crops/s\n"
            << "  CPU, all cores    " << std::setw(10) << crops / cpu << " crops/s  (kernel / CPU "
            << std::setprecision(1) << cpu / kernel << "x)\n";
  return {{"config",
           {{"device", device->name()},
            {"batch", o.batch},
            {"batches", o.batches},
            {"size", o.size},
            {"image_bytes_per_batch", image_bytes},
            {"repeats", common.repeats}}},
          {"kernel_crops_per_s", crops / kernel},
          {"kernel_gb_per_s", gb / kernel},
          {"copy_gb_per_s", gb / copy},
          {"kernel_over_copy", copy / kernel},
          {"copy_and_crop_crops_per_s", crops / wall},
          {"pack_crops_per_s_one_thread", crops / pack},
          {"cpu_crops_per_s_all_cores", crops / cpu},
          {"kernel_over_cpu", cpu / kernel},
          {"runs", {{"kernel_s", kernel_s}, {"copy_s", copy_s}, {"wall_s", wall_s}, {"pack_s", pack_s}, {"cpu_s", cpu_s}}}};
}

}  // namespace

SuiteRun setup_gpu_resize(CLI::App& command) {
  auto o = std::make_shared<GpuResizeOptions>();
  command.add_option("--device", o->device, "auto, cpu, cuda or cuda:N");
  command.add_option("--batch", o->batch, "images a batch")->check(CLI::Range(1, 65535));
  command.add_option("--batches", o->batches, "batches a repeat")->check(CLI::PositiveNumber);
  command.add_option("--size", o->size, "the crops' side")->check(CLI::Range(1u, 4096u));
  return [o](const CommonOptions& common) { return run(*o, common); };
}

}  // namespace stoker::bench
