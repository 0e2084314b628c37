// SPDX-License-Identifier: Apache-2.0
#include "stoker/gpu/augment.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "augment_crop.h"
#include "backends.h"

namespace stoker::gpu {

using detail::CropJob;

namespace {

// Regions of a staging buffer start on a device allocation's alignment.
constexpr std::size_t kAlign = 256;
constexpr std::size_t align_up(std::size_t n) noexcept { return (n + kAlign - 1) / kAlign * kAlign; }
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) noexcept { return (a + b - 1) / b; }

// Minibatches are laid out as stoker::Batch: the crops, then the labels.
std::size_t labels_offset(const Shape& crop, std::size_t count) {
  return Batch{.storage = {}, .shape = crop, .dtype = DType::f32, .count = count}.labels_offset();
}

std::size_t max_job_count(const GpuAugmentOptions& o) {
  return o.max_images * static_cast<std::size_t>(std::max(o.crops.count, 0));
}

GpuAugmentOptions checked(GpuAugmentOptions o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("GpuAugment: " + what); };
  if (o.batch_size == 0) fail("option batch_size must be at least 1");
  if (o.shuffle.capacity < o.shuffle.min_after_dequeue + o.batch_size)
    fail("option shuffle.capacity = " + std::to_string(o.shuffle.capacity) +
         " must be at least shuffle.min_after_dequeue + batch_size = " +
         std::to_string(o.shuffle.min_after_dequeue + o.batch_size));
  if (o.staging_buffers == 0) fail("option staging_buffers must be at least 1");
  if (o.max_images == 0) fail("option max_images (the most images or indices per input batch) must be at least 1");
  if (o.crops.count < 1) fail("option crops.count must be at least 1");
  if (o.wait_limit.count() < 0) fail("option wait_limit must not be negative");
  return o;
}

// A crop in the window: its job, and its id (Sample::id of the crop, as RandomCrops numbers
// them), which stays on the host.
struct Booked {
  CropJob job;
  std::uint64_t id;
};

// A minibatch taken out of the window: its crops are picked[first, first + count).
struct Minibatch {
  std::size_t first = 0, count = 0;
  std::vector<std::int32_t> labels;
  std::vector<std::uint64_t> ids;
};

}  // namespace

struct GpuAugment::State {
  State(std::shared_ptr<Device> d, GpuAugmentOptions o)
      : device(std::move(d)),
        options(checked(std::move(o))),
        crops(options.crops),
        normalizer(crops.normalizer() ? *crops.normalizer() : Normalizer(Normalization{})) {
    if (!device) throw std::invalid_argument("GpuAugment: no device");
    copy = device->make_stream();
    compute = device->make_stream();
  }

  // The streams go first (they are declared last) and finish their work before that: it uses
  // the memory above. Buffers handed out keep their pools alive by themselves.
  ~State() { detail::synchronize_quietly({copy.get(), compute.get()}, "GpuAugment's destructor"); }

  std::size_t batch_size() const noexcept { return options.batch_size; }
  bool resident() const noexcept { return dataset != nullptr; }

  // Runs one call: one at a time, and a call that fails leaves an empty window behind rather
  // than books that no longer match the device.
  template <class F>
  void serially(F&& f) {
    if (busy.exchange(true))
      throw std::logic_error("GpuAugment: called from two threads at once; its stage must have threads = 1");
    struct Done {
      std::atomic<bool>& busy;
      ~Done() { busy.store(false); }
    } done{busy};
    try {
      // Work this stage issued earlier that failed fails it now, so that the consumer hears of
      // it as this stage's error.
      copy->check();
      compute->check();
      f();
    } catch (...) {
      drop_window();
      throw;
    }
  }

  // ---- set-up

  // Every buffer, for input batches of at most max_images images (or indices) of the geometry
  // of `kernels`.
  void make_pools() {
    const std::size_t B = batch_size(), mad = options.shuffle.min_after_dequeue;
    const std::size_t max_jobs = max_job_count(options);
    const std::size_t need = buffers_per_call(options);
    if (options.output_buffers != 0 && options.output_buffers < need)
      throw std::invalid_argument("GpuAugment: option output_buffers = " + std::to_string(options.output_buffers) +
                                  " is fewer than the " + std::to_string(need) +
                                  " minibatches that one call may give at once");
    const std::size_t output_count = options.output_buffers != 0
                                         ? options.output_buffers
                                         : OutputSizing{.per_call = need, .queued = 1, .held = 1}.buffers();
    outputs = SlotPool::create(
        device, SlotPool::Kind::device, output_count, Batch::storage_bytes(kernels->crop(), DType::f32, B),
        {.name = "GpuAugment outputs",
         .sizing = "output_buffers (" + std::to_string(output_count) + ") must cover buffers_per_call (" +
                   std::to_string(need) +
                   ") + the minibatches queued after the stage + those the consumer holds at once (OutputSizing)",
         .wait_limit = options.wait_limit});
    // The crops to cut (resident) and the drain's gather slots, and their copy on the device.
    const std::size_t list_bytes = (std::max(max_jobs, mad) + B) * sizeof(CropJob);
    lists = SlotPool::create(device, SlotPool::Kind::pinned, options.staging_buffers, list_bytes,
                             {.name = "GpuAugment lists", .sizing = {}, .wait_limit = options.wait_limit});
    device_lists =
        SlotPool::create(device, SlotPool::Kind::device, options.staging_buffers, list_bytes,
                         {.name = "GpuAugment device lists", .sizing = {}, .wait_limit = options.wait_limit});
    if (resident()) return;
    // A staging buffer: the collated batch, then the crops to cut, the slots to gather and,
    // with the first batch, the normalization table; all of it in one copy.
    const std::size_t per_batch =
        align_up(Batch::storage_bytes(kernels->image(), kernels->dtype(), options.max_images)) +
        align_up(max_jobs * sizeof(CropJob)) + align_up((max_jobs + B) * sizeof(std::uint32_t)) +
        kernels->table_bytes();
    host_staging = SlotPool::create(
        device, SlotPool::Kind::pinned, options.staging_buffers, per_batch,
        {.name = "GpuAugment staging",
         .sizing = "staging_buffers (" + std::to_string(options.staging_buffers) +
                   ") must cover 1 batch being collated + the batches queued between the collate stage and "
                   "gpu_augment + 1 being copied",
         .wait_limit = options.wait_limit});
    device_staging =
        SlotPool::create(device, SlotPool::Kind::device, options.staging_buffers, per_batch,
                         {.name = "GpuAugment device staging", .sizing = {}, .wait_limit = options.wait_limit});
    // All the window can hold (a minibatch leaves as soon as it can), and a call's crops more:
    // the slots a call's gathers empty are booked again from the next call on, so that a call
    // cuts all its crops in one launch before its gathers.
    window_slots = mad + B + max_jobs;
    window_labels_at = align_up(window_slots * kernels->crop_elements() * sizeof(float));
    window_memory = device->allocate(window_labels_at + window_slots * sizeof(std::int32_t));
    table = device->allocate(kernels->table_bytes());
    table_data = table.data();
    drop_window();
  }

  // Uploads the data set and the normalization table in one copy; the host waits for it, once.
  void upload(std::shared_ptr<const IdxDataset> data) {
    if (!data || data->size() == 0) throw std::invalid_argument("GpuAugment::resident: the data set is empty");
    if (data->images.count != data->size() ||
        data->images.pixels.size() != std::size_t{data->images.count} * data->images.height * data->images.width)
      throw std::invalid_argument("GpuAugment::resident: the data set's images and labels do not match");
    dataset = std::move(data);
    kernels.emplace(dataset->shape(), DType::u8, options.crops.size, normalizer);
    make_pools();
    const std::size_t images = dataset->images.pixels.size();
    const std::size_t table_at = align_up(images);
    const std::size_t bytes = table_at + kernels->table_bytes();
    resident_images = device->allocate(bytes);
    Memory host = device->allocate_pinned(bytes);
    std::memcpy(host.data(), dataset->images.pixels.data(), images);
    kernels->write_table(host.data() + table_at);
    copy->copy_to_device(resident_images.data(), host.data(), bytes);
    copy->synchronize();  // before `host` goes; later work is issued after this returns
    table_data = resident_images.data() + table_at;
  }

  // ---- the window's books

  // A window without a seed of its own takes one from the pipeline's, as a pipeline's shuffle.
  void begin_epoch(const StageContext& ctx) {
    if (window && window_epoch == ctx.epoch) return;
    drop_window();
    const auto seed = options.shuffle.seed.value_or(derive_seed(ctx.seed, hash_name("gpu_augment window")));
    window.emplace("gpu_augment window", ShuffleOptions{options.shuffle.capacity, options.shuffle.min_after_dequeue,
                                                        derive_seed(seed, ctx.epoch)});
    window_epoch = ctx.epoch;
  }

  // Every slot free, nothing held. Safe whatever the device is still doing with the slots:
  // work issued from now on runs after it, in stream order.
  void drop_window() {
    window.reset();
    emptied_slots.clear();
    free_slots.resize(window_slots);
    for (std::size_t i = 0; i < window_slots; ++i) free_slots[i] = static_cast<std::uint32_t>(window_slots - 1 - i);
  }

  // Puts the jobs in the window in order, and takes a minibatch out each time one can be:
  // as many jobs at a time as the window takes before the next minibatch can leave.
  void book_jobs() {
    picked.clear();
    minibatches.clear();
    // The slots the last call's gathers emptied: work issued from now on runs after those.
    free_slots.insert(free_slots.end(), emptied_slots.begin(), emptied_slots.end());
    emptied_slots.clear();
    const std::size_t full = options.shuffle.min_after_dequeue + batch_size();
    for (std::size_t j = 0; j < jobs.size();) {
      const std::size_t n = std::min(full - window->size(), jobs.size() - j);
      if (!resident() && free_slots.size() < n)  // never: the window has a call's slots to spare
        throw std::logic_error("GpuAugment: the window has no free slot");
      booking.clear();
      for (std::size_t k = j; k < j + n; ++k) {
        if (!resident()) {
          jobs[k].dst = free_slots.back();
          free_slots.pop_back();
        }
        booking.push_back({jobs[k], job_ids[k]});
      }
      // Never full: capacity >= min_after_dequeue + batch_size, and a minibatch leaves as
      // soon as min_after_dequeue + batch_size are held.
      if (window->try_push_many(booking.begin(), booking.end()) != n)
        throw std::logic_error("GpuAugment: the window is full");
      j += n;
      take_minibatch(false);
    }
  }

  bool take_minibatch(bool closing) {
    const std::size_t first = picked.size();
    const std::size_t n = window->try_pop_many(picked, batch_size(), closing);
    if (n == 0) return false;
    Minibatch m{first, n, {}, {}};
    m.labels.reserve(n);
    m.ids.reserve(n);
    for (std::size_t k = first; k < first + n; ++k) {
      CropJob& job = picked[k].job;
      m.labels.push_back(job.label);
      m.ids.push_back(picked[k].id);
      if (resident())
        job.dst = static_cast<std::uint32_t>(k - first);  // cropped straight into the minibatch
      else
        emptied_slots.push_back(job.dst);  // booked again from the next call on
    }
    minibatches.push_back(std::move(m));
    return true;
  }

  // ---- issuing work

  std::vector<Buffer> acquire_outputs(const StageContext& ctx) {
    std::vector<Buffer> buffers;
    for (const auto& m : minibatches)
      buffers.push_back(outputs->acquire(Batch::storage_bytes(kernels->crop(), DType::f32, m.count), ctx));
    return buffers;
  }

  float* window_crops() const { return reinterpret_cast<float*>(window_memory.data()); }
  std::int32_t* window_labels() const {
    return reinterpret_cast<std::int32_t*>(window_memory.data() + window_labels_at);
  }

  // Records the end of the work that fills minibatch m in `buffer`, and emits it.
  void finish(Minibatch& m, Buffer buffer, Emitter<DeviceBatch>& emit) {
    compute->record(outputs->event(buffer));
    emit_minibatch(m, std::move(buffer), emit);
  }
  void emit_minibatch(Minibatch& m, Buffer buffer, Emitter<DeviceBatch>& emit) {
    emit(DeviceBatch(std::move(buffer), kernels->crop(), DType::f32, m.count, labels_offset(kernels->crop(), m.count),
                     std::move(m.labels), std::move(m.ids)));
  }
  float* crops_of(Buffer& b) const { return reinterpret_cast<float*>(b.data()); }
  std::int32_t* labels_of(Buffer& b, const Minibatch& m) const {
    return reinterpret_cast<std::int32_t*>(b.data() + labels_offset(kernels->crop(), m.count));
  }

  // Streaming: one copy of [collated images | jobs | gather slots | table, the first time],
  // then one launch that cuts every crop of the call into the window, then a gather per
  // minibatch. A slot this call empties is booked again only by a later call, whose crops the
  // stream runs after these gathers.
  void crop_images(Batch& images, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
    const std::size_t jobs_at = align_up(images.storage.size());
    const std::size_t picks_at = align_up(jobs_at + jobs.size() * sizeof(CropJob));
    const std::size_t picks_end = picks_at + picked.size() * sizeof(std::uint32_t);
    const std::size_t table_at = align_up(picks_end);
    const bool with_table = !table_shipped;
    const std::size_t bytes = with_table ? table_at + kernels->table_bytes() : picks_end;

    // The staging slot is larger than the batch collated into it: the rest is ours.
    std::byte* host = images.data();
    std::memcpy(host + jobs_at, jobs.data(), jobs.size() * sizeof(CropJob));
    auto* picks = reinterpret_cast<std::uint32_t*>(host + picks_at);
    for (std::size_t k = 0; k < picked.size(); ++k) picks[k] = picked[k].job.dst;
    if (with_table) kernels->write_table(host + table_at);

    Buffer dev = device_staging->acquire(bytes, ctx);
    Event& copied = device_staging->event(dev);
    copy->copy_to_device(dev.data(), host, bytes);
    copy->record(copied);
    host_staging->release_after(std::move(images.storage), *copy);
    // Only now wait for output buffers, which the trainer gives back: the copy of this batch
    // runs meanwhile, overlapping the trainer's steps rather than following them.
    std::vector<Buffer> out = acquire_outputs(ctx);

    compute->wait(copied);
    if (with_table) {
      compute->copy_on_device(table.data(), dev.data() + table_at, kernels->table_bytes());
      table_shipped = true;
    }
    const auto* dev_jobs = reinterpret_cast<const CropJob*>(dev.data() + jobs_at);
    const auto* dev_picks = reinterpret_cast<const std::uint32_t*>(dev.data() + picks_at);
    kernels->crop(*compute, dev.data(), images.count, dev_jobs, jobs.size(), table_data, window_crops(),
                  window_labels(), window_slots, draws);
    for (std::size_t i = 0; i < minibatches.size(); ++i) {
      Minibatch& m = minibatches[i];
      kernels->gather(*compute, window_crops(), window_labels(), window_slots, dev_picks + m.first, m.count,
                      crops_of(out[i]), labels_of(out[i], m));
      compute->record(outputs->event(out[i]));
    }
    // Before the first emit, which throws once the pipeline stops: a slot destroyed on the way
    // out would come back after its copy alone, and the next call's copy into it (on the copy
    // stream) would overwrite what the kernels queued on compute have yet to read.
    device_staging->release_after(std::move(dev), *compute);
    for (std::size_t i = 0; i < minibatches.size(); ++i) emit_minibatch(minibatches[i], std::move(out[i]), emit);
  }

  // What crosses PCIe without images (the resident mode's jobs, the drain's gather slots) is a
  // few bytes per crop, copied to the device in one counted copy, issued before the wait for
  // output buffers: a kernel reading them from pinned memory would cross PCIe from every block.
  void crop_picked(Emitter<DeviceBatch>& emit, const StageContext& ctx) {
    if (minibatches.empty()) return;
    const std::size_t bytes = picked.size() * (resident() ? sizeof(CropJob) : sizeof(std::uint32_t));
    Buffer host = lists->acquire(bytes, ctx);
    if (resident()) {
      auto* picked_jobs = reinterpret_cast<CropJob*>(host.data());
      for (std::size_t k = 0; k < picked.size(); ++k) picked_jobs[k] = picked[k].job;
    } else {
      auto* picks = reinterpret_cast<std::uint32_t*>(host.data());
      for (std::size_t k = 0; k < picked.size(); ++k) picks[k] = picked[k].job.dst;
    }
    Buffer dev = device_lists->acquire(bytes, ctx);
    compute->copy_to_device(dev.data(), host.data(), bytes);
    lists->release_after(std::move(host), *compute);
    std::vector<Buffer> out = acquire_outputs(ctx);
    if (resident()) {
      // One launch cuts every minibatch's crops (picked, in minibatch order), each straight into
      // its own buffer.
      std::vector<detail::CropOutput> outputs;
      for (std::size_t i = 0; i < minibatches.size(); ++i)
        outputs.push_back({crops_of(out[i]), labels_of(out[i], minibatches[i]),
                           static_cast<std::uint32_t>(minibatches[i].first),
                           static_cast<std::uint32_t>(minibatches[i].count)});
      kernels->crop(*compute, resident_images.data(), dataset->size(), reinterpret_cast<const CropJob*>(dev.data()),
                    picked.size(), table_data, outputs, draws);
    }
    for (std::size_t i = 0; i < minibatches.size(); ++i) {
      Minibatch& m = minibatches[i];
      if (!resident()) {
        const auto* picks_on_device = reinterpret_cast<const std::uint32_t*>(dev.data());
        kernels->gather(*compute, window_crops(), window_labels(), window_slots, picks_on_device + m.first, m.count,
                        crops_of(out[i]), labels_of(out[i], m));
      }
      finish(m, std::move(out[i]), emit);
    }
    device_lists->release_after(std::move(dev), *compute);
  }

  // ---- the calls

  // Without a count_of, every draw of a crop depends on (seed, epoch, id, k) alone, and the
  // device draws it where it cuts the crop: the host only books slots. A count_of draws from
  // the windows' generator first, with the image in hand, so then the host plans each crop.
  bool drawn_on_device() const noexcept { return !options.crops.count_of; }
  void add_drawn_jobs(std::uint32_t image, std::uint64_t id, std::int32_t label) {
    for (int k = 0; k < options.crops.count; ++k)
      add_job(detail::CropKernels::drawn_job(image, id, static_cast<std::uint32_t>(k), label),
              id * static_cast<std::uint64_t>(options.crops.count) + static_cast<std::uint64_t>(k));
  }
  void add_job(const CropJob& job, std::uint64_t crop_id) {
    jobs.push_back(job);
    job_ids.push_back(crop_id);
  }

  void streaming_call(Batch& images, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
    if (resident())
      throw std::invalid_argument("GpuAugment: this one is resident over a data set; give it batches of indices");
    if (images.storage.pool() != host_staging.get())
      throw std::invalid_argument(
          "GpuAugment: the images were not collated into its staging buffers (use Collate{.pool = augment.staging()})");
    if (images.count > options.max_images)
      throw std::invalid_argument("GpuAugment: a batch of " + std::to_string(images.count) +
                                  " images, but max_images is " + std::to_string(options.max_images));
    if (images.shape != kernels->image() || images.dtype != kernels->dtype())
      throw std::invalid_argument("GpuAugment: a batch of " + images.shape.str() + " " + dtype_name(images.dtype) +
                                  " images, but option image is " + kernels->image().str() + " " +
                                  dtype_name(kernels->dtype()));
    if (images.count == 0) return;
    begin_epoch(ctx);
    jobs.clear();
    job_ids.clear();
    const auto labels = images.label_values();
    const auto ids = images.id_values();
    draws = kernels->draws_for(options.crops, ctx.seed, ctx.epoch);
    for (std::size_t i = 0; i < images.count; ++i) {
      if (drawn_on_device()) {
        add_drawn_jobs(static_cast<std::uint32_t>(i), ids[i], labels[i]);
        continue;
      }
      const Sample image = detail::borrowed_sample(images.data() + i * kernels->image_bytes(), kernels->image(),
                                                   kernels->dtype(), labels[i], ids[i]);
      plans.clear();
      crops.plan(image, ctx, plans);
      for (const auto& p : plans) add_job(detail::make_job(static_cast<std::uint32_t>(i), p, labels[i]), p.id);
    }
    book_jobs();
    if (!jobs.empty()) crop_images(images, emit, ctx);
  }

  void resident_call(const std::vector<std::uint64_t>& indices, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
    if (!resident())
      throw std::invalid_argument("GpuAugment: batches of indices need a resident data set (GpuAugment::resident)");
    if (indices.size() > options.max_images)
      throw std::invalid_argument("GpuAugment: a batch of " + std::to_string(indices.size()) +
                                  " indices, but max_images is " + std::to_string(options.max_images));
    if (indices.empty()) return;
    begin_epoch(ctx);
    jobs.clear();
    job_ids.clear();
    draws = kernels->draws_for(options.crops, ctx.seed, ctx.epoch);
    const std::size_t image_bytes = kernels->image_bytes();
    for (std::uint64_t i : indices) {
      if (i >= dataset->size())
        throw std::out_of_range("GpuAugment: index " + std::to_string(i) + " is outside the data set of " +
                                std::to_string(dataset->size()));
      const auto label = dataset->labels[i];
      if (drawn_on_device()) {
        add_drawn_jobs(static_cast<std::uint32_t>(i), i, label);
        continue;
      }
      // The real image, for a count_of that looks at it.
      const Sample view =
          detail::borrowed_sample(reinterpret_cast<const std::byte*>(dataset->images.pixels.data()) + i * image_bytes,
                                  kernels->image(), DType::u8, label, i);
      plans.clear();
      crops.plan(view, ctx, plans);
      for (const auto& p : plans) add_job(detail::make_job(static_cast<std::uint32_t>(i), p, label), p.id);
    }
    book_jobs();
    crop_picked(emit, ctx);
  }

  void drain(Emitter<DeviceBatch>& emit, const StageContext& ctx) {
    if (!window || window_epoch != ctx.epoch) return drop_window();
    draws = kernels->draws_for(options.crops, ctx.seed, ctx.epoch);
    picked.clear();
    minibatches.clear();
    window->close();
    while (take_minibatch(true)) {
    }
    if (options.drop_remainder && !minibatches.empty() && minibatches.back().count < batch_size()) {
      picked.resize(minibatches.back().first);
      minibatches.pop_back();
    }
    drop_window();
    crop_picked(emit, ctx);
  }

  std::shared_ptr<Device> device;
  const GpuAugmentOptions options;
  const RandomCrops crops;  // draws the crops: one piece of code for the CPU and the device
  const Normalizer normalizer;
  std::shared_ptr<const IdxDataset> dataset;  // resident mode
  std::optional<detail::CropKernels> kernels;

  // Pinned: collated images (streaming) and the lists of crops and slots; device: their
  // copies, and the minibatches.
  std::shared_ptr<SlotPool> host_staging, lists, device_staging, device_lists, outputs;
  Memory window_memory;  // streaming: window_slots crops of floats, then their labels
  std::size_t window_slots = 0, window_labels_at = 0;
  Memory table;  // streaming: the normalization table, shipped with the first batch
  bool table_shipped = false;
  Memory resident_images;  // resident: the data set, then the normalization table
  const std::byte* table_data = nullptr;

  std::optional<RandomShuffleQueue<Booked>> window;  // the books: which slot holds what
  std::uint32_t window_epoch = 0;
  std::vector<std::uint32_t> free_slots;
  std::vector<std::uint32_t> emptied_slots;  // by this call's gathers: free from the next call on

  detail::CropDraws draws;  // of the epoch, for the jobs drawn on the device

  // Reused from call to call.
  std::vector<PlannedCrop> plans;
  std::vector<CropJob> jobs;           // this call's, in order
  std::vector<std::uint64_t> job_ids;  // their crops' ids
  std::vector<Booked> booking, picked;
  std::vector<Minibatch> minibatches;

  std::atomic<bool> busy{false};
  std::unique_ptr<Stream> copy, compute;
};

GpuAugment::GpuAugment(std::shared_ptr<Device> device, GpuAugmentOptions options)
    : state_(std::make_shared<State>(std::move(device), std::move(options))) {
  const auto& o = state_->options;
  if (!o.image) throw std::invalid_argument("GpuAugment: option image (the shape of every image) is required");
  if (o.image->channels_last)
    throw std::invalid_argument("GpuAugment: option image " + o.image->str() +
                                " is channels-last; it cuts planar images (Collate makes planar batches of "
                                "channels-last images; GpuResizedCrop takes them as they are)");
  state_->kernels.emplace(*o.image, o.dtype, o.crops.size, state_->normalizer);
  state_->make_pools();
}

GpuAugment::GpuAugment(std::shared_ptr<State> state) : state_(std::move(state)) {}

GpuAugment GpuAugment::resident(std::shared_ptr<Device> device, std::shared_ptr<const IdxDataset> data,
                                GpuAugmentOptions options) {
  GpuAugment a(std::make_shared<State>(std::move(device), std::move(options)));
  a.state_->upload(std::move(data));
  return a;
}

void GpuAugment::operator()(Batch images, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
  state_->serially([&] { state_->streaming_call(images, emit, ctx); });
}

void GpuAugment::operator()(std::vector<Sample> images, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
  if (images.empty()) return;
  if (!state_->host_staging)
    throw std::invalid_argument("GpuAugment: this one is resident over a data set; give it batches of indices");
  (*this)(make_batch(std::move(images), *state_->host_staging, ctx), emit, ctx);
}

std::shared_ptr<SlotPool> GpuAugment::staging() const noexcept { return state_->host_staging; }

std::size_t GpuAugment::buffers_per_call(const GpuAugmentOptions& o) {
  const std::size_t B = std::max<std::size_t>(o.batch_size, 1);
  const std::size_t per_input = std::max<std::size_t>(1, ceil_div(max_job_count(o), B));
  const std::size_t per_drain = ceil_div(o.shuffle.min_after_dequeue + B - 1, B);
  return std::max(per_input, per_drain);
}

void GpuAugment::operator()(std::vector<std::uint64_t> indices, Emitter<DeviceBatch>& emit, const StageContext& ctx) {
  state_->serially([&] { state_->resident_call(indices, emit, ctx); });
}

void GpuAugment::end_epoch(Emitter<DeviceBatch>& emit, const StageContext& ctx) {
  state_->serially([&] { state_->drain(emit, ctx); });
}

bool GpuAugment::is_resident() const noexcept { return state_->resident(); }
std::size_t GpuAugment::held() const { return state_->window ? state_->window->size() : 0; }
Device& GpuAugment::device() const noexcept { return *state_->device; }
const GpuAugmentOptions& GpuAugment::options() const noexcept { return state_->options; }

}  // namespace stoker::gpu
