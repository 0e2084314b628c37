// SPDX-License-Identifier: Apache-2.0
// The `augment` suite: the reference job (Fashion-MNIST, 5 random 24x24 crops per
// image, mirrored with p = 0.5, normalized to float32, shuffled, batched by 255) through a
// real stoker pipeline, and, in the same run, three loops doing the same job with no pipeline
// at all: a plain loop that permutes all crops at once (a baseline), a tight loop with the job's
// windowed shuffle built from stoker's pieces (what the pipeline adds to them), and a plain
// hand-written loop with no piece of stoker (the practical limit). With --threads LIST, the
// pipeline and both windowed loops also run on each N threads of the list, for the scaling.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <pthread.h>
#include <random>
#include <sched.h>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/transforms.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;

// How long a cache line takes to go from one core to another, one way: two threads on the first
// two CPUs this process may use bounce one atomic; the best of many short bursts, so that a
// burst in which either thread lost its core to another process does not count. A pipeline
// hands every crop from core to core (crop stage, shuffle, collate) and the loops share nothing
// between threads, so this sets how far apart they can be; on a virtual machine it changes with
// where the host puts the virtual CPUs. 0 when the process may use only one CPU.
double core_to_core_ns() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return 0;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  constexpr int kBursts = 100, kTrips = 200;
  alignas(64) std::atomic<int> ball{0};
  auto pin = [](std::thread& t, int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(t.native_handle(), sizeof one, &one);  // unpinned if refused
  };
  std::thread back([&] {
    for (int i = 0; i < kBursts * kTrips; ++i) {
      while (ball.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      ball.store(2 * i + 2, std::memory_order_release);
    }
  });
  double best = 1e300;
  std::thread there([&] {
    for (int b = 0, i = 0; b < kBursts; ++b) {
      const auto t0 = Clock::now();
      for (int k = 0; k < kTrips; ++k, ++i) {
        ball.store(2 * i + 1, std::memory_order_release);
        while (ball.load(std::memory_order_acquire) != 2 * i + 2) {
        }
      }
      best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / (2.0 * kTrips));
    }
  });
  pin(back, cpus[1]);
  pin(there, cpus[0]);
  there.join();
  back.join();
  return best;
}

// The reference job.
constexpr int kCropsPerImage = 5;
constexpr CropSize kCrop{24, 24};
constexpr double kMirrorP = 0.5;
constexpr std::size_t kBatch = 255;
constexpr ShuffleOptions kShuffle{.capacity = 10'000, .min_after_dequeue = 2'000};  // seeded by --seed
const Normalization kNormalization{255.0f, {0.2860f}, {0.3530f}};

struct AugmentOptions {
  std::string data = kFashionMnistDir;
  std::size_t images = 0;  // 0: all of them
  int crop_threads = 2;
  int collate_threads = 2;  // one collate alone can fall behind two crop threads
  int plain_threads = 0;    // 0: every core, for the plain loop and the windowed loop
  std::uint64_t seed = 0;
  std::vector<int> thread_counts;  // --threads: also run the pipeline and the windowed loop on each
  std::string trace_dir;           // --trace-dir: where a traced run of each --threads pipeline goes
};

// How the pipeline is laid out on a number of threads.
struct PipelineLayout {
  int threads = 0;  // the pipeline's own threads; 0: one per core
  int crop_threads = 2;
  int collate_threads = 2;
  std::size_t batch_queue = 8;  // batches waiting for collate
  std::size_t read_queue = 64;  // images waiting for the crop stage
};

// The layout on N threads for --threads: collate does about 70% of the work (it cuts, mirrors
// and normalizes every crop), so it may run on all N; drawing the windows is light, so the crop
// stage gets a quarter of them; enough batches wait for collate to keep N bodies busy; and
// enough images wait for the crop stage, 64 a thread, that each of its bodies takes a whole
// chunk (about 100 us of work, some 250 images) while the reader refills: a FIFO hands on
// chunks of at most half its capacity. With the default 64 at every N, the crop bodies took a
// few images at a time, and on 16 cores the pipeline made about half the crops
// (docs/benchmarks.md); on one thread a larger queue only costs cache.
PipelineLayout scaled_layout(int n) {
  const auto threads = static_cast<std::size_t>(std::clamp(n, 1, 64));
  return {.threads = n,
          .crop_threads = std::clamp((n + 3) / 4, 1, 64),
          .collate_threads = std::clamp(n, 1, 64),
          .batch_queue = std::max<std::size_t>(8, 2 * threads),
          .read_queue = 64 * threads};
}

// What a consumer saw: enough to prove that nothing was lost or repeated, and, when `deep`,
// a checksum of every crop's contents that does not depend on the order crops arrive in.
struct Tally {
  std::uint64_t crops = 0, batches = 0;
  std::int64_t label_sum = 0;
  std::uint64_t id_sum = 0;
  std::uint64_t content = 0;  // sum of a hash of (id, label, bytes) per crop, when deep
  float touched = 0;          // keeps the "touch" of each batch from being optimised away

  void add(const Batch& b, bool deep) {
    add(b.count, b.label_values().data(), b.id_values().data(), b.as<float>().data(), b.sample<float>(0).size(), deep);
  }
  // A batch of `count` crops of `per_crop` floats each, one after the other.
  void add(std::size_t count, const std::int32_t* labels, const std::uint64_t* ids, const float* data,
           std::size_t per_crop, bool deep) {
    ++batches;
    crops += count;
    for (std::size_t i = 0; i < count; ++i) {
      label_sum += labels[i];
      id_sum += ids[i];
    }
    touched += data[0];
    if (!deep) return;
    for (std::size_t i = 0; i < count; ++i) {
      std::uint64_t h = mix64(ids[i] ^ (static_cast<std::uint64_t>(labels[i]) << 48));
      for (std::size_t j = 0; j < per_crop; ++j) {
        std::uint32_t bits;
        std::memcpy(&bits, &data[i * per_crop + j], sizeof bits);
        h = mix64(h ^ bits);
      }
      content += h;
    }
  }
  void merge(const Tally& o) {
    crops += o.crops;
    batches += o.batches;
    label_sum += o.label_sum;
    id_sum += o.id_sum;
    content += o.content;
    touched += o.touched;
  }
  bool same_items(const Tally& o) const {
    return crops == o.crops && batches == o.batches && label_sum == o.label_sum && id_sum == o.id_sum;
  }
};

struct Job {
  const AugmentOptions& options;
  // Each pipeline reads with a copy, which shares the data set and its entries: made once, as
  // the loops' images are.
  IdxReader reader;
  std::vector<Sample> images;  // the loops read these: the same pixels, decoded once (reader.read)
  Tally expected;              // what every run must deliver
  std::shared_ptr<BufferPool> crop_pool = BufferPool::create();
  std::shared_ptr<BufferPool> batch_pool = BufferPool::create();
  Normalizer normalizer{kNormalization};
};

struct RunResult {
  double seconds = 0;
  double cpu_seconds = 0;
  Tally tally;
  PipelineSummary summary;  // pipeline only
};

// (a) A real stoker pipeline: reader from memory -> RandomCrops on `crop_threads` -> shuffle
// -> batch -> collate on `collate_threads`; this thread is the consumer and just touches each
// batch. Where the fused crop + mirror + normalize pass runs:
enum class Cut {
  // The crop stage draws the windows; the shuffle moves DeferredCrops; collate cuts each crop
  // straight into its batch. Every output element is written once, as in the plain loop.
  at_collate,
  // The crop stage cuts float32 crops, which the shuffle moves and collate copies into batches.
  in_crop_stage,
  // The crop stage cuts uint8 crops (576 bytes rather than 2,304 in the shuffle buffer) and
  // collate normalizes them into the batch.
  in_crop_stage_normalize_at_collate,
};

// `trace`: a file to write the run's trace to; empty = not traced.
RunResult run_pipeline(Job& job, const PipelineLayout& layout, bool deep, Cut cut, const std::string& trace = {}) {
  const AugmentOptions& o = job.options;
  RunResult r;
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  RandomCropOptions crops{.size = kCrop,
                          .count = kCropsPerImage,
                          .mirror = MirrorOptions{.axis = Axis::width, .p = kMirrorP},
                          .normalize = kNormalization,
                          .pool = job.crop_pool};
  Collate collate{.pool = job.batch_pool};
  if (cut != Cut::in_crop_stage) {
    crops.normalize.reset();
    collate.normalize = job.normalizer;
  }
  auto consume = [&]<class Item>(Item) {
    auto pipe =
        PipelineBuilder{}
            .threads(layout.threads)
            .seed(o.seed)
            .epochs(1)
            .trace(trace)
            .source("read", job.reader, {.queue = layout.read_queue})
            .template flat_map<Item>("crops", RandomCrops(std::move(crops)), {.threads = layout.crop_threads})
            .shuffle("shuffle",
                     {.capacity = kShuffle.capacity, .min_after_dequeue = kShuffle.min_after_dequeue, .seed = o.seed})
            .batch("batch", kBatch, {.queue = layout.batch_queue})
            .map("collate", std::move(collate), {.threads = layout.collate_threads})
            .build();
    for (auto& batch : pipe.epoch()) r.tally.add(batch, deep);
    r.summary = pipe.summary();
  };
  if (cut == Cut::at_collate)
    consume(DeferredCrop{});
  else
    consume(Sample{});
  r.seconds = seconds_since(t0);
  r.cpu_seconds = cpu_seconds() - cpu0;
  return r;
}

// Where crop c (= image * kCropsPerImage + k) comes from, drawn exactly as RandomCrops draws.
struct CropPlan {
  std::uint16_t y, x;
  bool flip;
};

// (b) The same arithmetic with no pipeline, on every core: draw every crop's window and
// mirror, shuffle the crops with one permutation, then fill each batch in place straight from
// the images (each output element written once) and touch it. Batch buffers are recycled.
RunResult run_plain(Job& job, tbb::task_arena& arena, bool deep) {
  const AugmentOptions& o = job.options;
  const std::size_t n_images = job.images.size();
  const std::size_t n_crops = n_images * kCropsPerImage;
  const std::size_t n_batches = (n_crops + kBatch - 1) / kBatch;
  StageContext ctx;  // epoch 0, as the pipeline's one epoch
  ctx.seed = o.seed;
  const Shape crop_shape{1, 1, kCrop.height, kCrop.width, false};
  RunResult r;
  std::vector<Tally> tallies(n_batches);
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();

  std::vector<CropPlan> plans(n_crops);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_images, 256), [&](const auto& range) {
      for (std::size_t i = range.begin(); i != range.end(); ++i) {
        Rng rng = sample_rng(ctx, job.images[i].id, kCropSalt);
        for (int k = 0; k < kCropsPerImage; ++k) {
          const Window w = random_window(job.images[i].shape, kCrop, rng);
          const std::uint64_t id = job.images[i].id * kCropsPerImage + static_cast<std::uint64_t>(k);
          Rng mirror_rng = sample_rng(ctx, id, kMirrorSalt);
          plans[i * kCropsPerImage + static_cast<std::size_t>(k)] = {
              static_cast<std::uint16_t>(w.y), static_cast<std::uint16_t>(w.x), mirror_rng.bernoulli(kMirrorP)};
        }
      }
    });
  });

  // The shuffle: Fisher-Yates, serial as a shuffle buffer's pops are.
  std::vector<std::uint32_t> order(n_crops);
  std::iota(order.begin(), order.end(), 0u);
  Rng shuffle_rng(derive_seed(o.seed, 0, 0x5348));
  for (std::size_t i = n_crops; i > 1; --i) std::swap(order[i - 1], order[shuffle_rng.below(i)]);

  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_batches, 1), [&](const auto& range) {
      for (std::size_t b = range.begin(); b != range.end(); ++b) {
        const std::size_t first = b * kBatch, count = std::min(kBatch, n_crops - first);
        Batch batch = Batch::allocate(*job.batch_pool, crop_shape, DType::f32, count);
        auto labels = batch.label_values();
        auto ids = batch.id_values();
        for (std::size_t s = 0; s < count; ++s) {
          const std::uint32_t c = order[first + s];
          const Sample& image = job.images[c / kCropsPerImage];
          const CropPlan& p = plans[c];
          crop_mirror_normalize_into(image, {0, p.y, p.x, 1, kCrop.height, kCrop.width}, {.width = p.flip},
                                     job.normalizer, batch.sample<float>(s));
          labels[s] = image.label;
          ids[s] = image.id * kCropsPerImage + c % kCropsPerImage;
        }
        tallies[b].add(batch, deep);
      }
    });
  });
  r.seconds = seconds_since(t0);
  r.cpu_seconds = cpu_seconds() - cpu0;
  for (const Tally& t : tallies) r.tally.merge(t);
  return r;
}

// Runs `work(t, tally)` on threads 0..n-1 (0 on this thread), timed; the first exception of
// any thread is rethrown once all have ended.
RunResult on_threads(std::size_t n, const std::function<void(std::size_t, Tally&)>& work) {
  RunResult r;
  std::vector<Tally> tallies(n);
  std::vector<std::exception_ptr> errors(n);
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  auto run = [&](std::size_t t) {
    try {
      work(t, tallies[t]);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> others;
    others.reserve(n - 1);
    for (std::size_t t = 1; t < n; ++t) others.emplace_back(run, t);
    run(0);
  }
  r.seconds = seconds_since(t0);
  r.cpu_seconds = cpu_seconds() - cpu0;
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  for (const Tally& t : tallies) r.tally.merge(t);
  return r;
}

// (c) stoker's pieces without a pipeline (the practical limit until (d) came): a tight loop
// doing exactly the job, windowed shuffle included, on `threads` threads with no pipeline: the
// reference job run on each thread's contiguous share of the images, with the job's own
// shuffle (capacity and min_after_dequeue). As a shuffle buffer in a loop is used (tf.data's
// shuffle, a RandomShuffleQueue whose consumer is the slower side, which is the pipeline's case
// here), the window is filled to its capacity and a batch is taken whenever it is full, so
// every batch is drawn uniformly from `capacity` crops, as the pipeline's shuffle draws it. For
// each image it draws the crops with RandomCrops::plan (windows and mirrors, exactly as the
// pipeline's crop stage draws them) and pushes DeferredCrops into its window (a
// stoker::ShuffleBuffer: an array with swap-remove, each take uniform over all held, as the
// pipeline's shuffle); it cuts, mirrors and normalizes each crop of a batch straight into it
// with make_batch, exactly what the pipeline's collate does, and touches the batch. At the end
// it drains its window batch by batch.
//
// Every share but the last is a whole number of batches (51 images = 255 crops), so the loop
// delivers the pipeline's batches: all full but the very last one. The DeferredCrops point at
// the images decoded once, through shared_ptrs that own nothing: no reference counting, no
// copy of an image, no queue, no lock; the threads share nothing but the batch pool.
static_assert(kBatch % kCropsPerImage == 0, "the windowed loop gives each thread whole batches of images");

// Thread t's share of `n_images` among `n_threads`, [first, last): whole batches of images,
// the rest to the last thread.
std::pair<std::size_t, std::size_t> share_of(std::size_t t, std::size_t n_threads, std::size_t n_images) {
  constexpr std::size_t kImagesPerBatch = kBatch / kCropsPerImage;
  const std::size_t whole_batches = n_images / kImagesPerBatch;
  return {whole_batches * t / n_threads * kImagesPerBatch,
          t + 1 == n_threads ? n_images : whole_batches * (t + 1) / n_threads * kImagesPerBatch};
}

RunResult run_windowed(Job& job, int threads, bool deep) {
  const AugmentOptions& o = job.options;
  const std::size_t n_threads = static_cast<std::size_t>(std::max(1, threads));
  const std::size_t full = kShuffle.capacity;  // take a batch at this size
  StageContext ctx;                            // epoch 0, as the pipeline's one epoch
  ctx.seed = o.seed;
  const RandomCrops draw(RandomCropOptions{.size = kCrop,
                                           .count = kCropsPerImage,
                                           .mirror = MirrorOptions{.axis = Axis::width, .p = kMirrorP},
                                           .pool = job.crop_pool});
  return on_threads(n_threads, [&](std::size_t t, Tally& tally) {
    const auto [first, last] = share_of(t, n_threads, job.images.size());
    ShuffleBuffer<DeferredCrop> window(full, derive_seed(o.seed, t, 0x77696e646f77));  // "window"
    std::vector<PlannedCrop> planned;
    planned.reserve(kCropsPerImage);
    auto take_batch = [&](std::size_t count) {
      std::vector<DeferredCrop> crops;
      crops.reserve(count);
      for (std::size_t k = 0; k < count; ++k) crops.push_back(window.take());
      const Batch batch = make_batch(std::move(crops), job.normalizer, *job.batch_pool, ctx);
      tally.add(batch, deep);
    };
    for (std::size_t i = first; i < last; ++i) {
      const Sample& image = job.images[i];
      const std::shared_ptr<const Sample> source(std::shared_ptr<const Sample>{}, &image);  // owns nothing
      planned.clear();
      draw.plan(image, ctx, planned);
      for (const PlannedCrop& c : planned) {
        window.push(DeferredCrop{source, c});
        if (window.size() == full) take_batch(kBatch);
      }
    }
    while (window.size() != 0) take_batch(std::min(kBatch, window.size()));
  });
}

// (d) The job's real limit: a plain hand-written loop, no piece of stoker in it. Each of N
// threads takes 1/N of the images (whole batches of them, as the windowed loop), draws each
// image's 5 windows and mirror bits from a std::mt19937_64 of its own into a window of
// capacity / N crops (a plain vector, swap-remove picks uniform over all held, a batch taken
// whenever it is full, the rest drained at the end), and cuts each picked crop, mirrored and
// normalized, into one float batch of 255 it reuses, with its labels and ids, then touches it.
// Its crops are other draws than RandomCrops' (another generator): the same job, not the same
// crops, so it is checked for every crop once (labels and ids), not for the same bytes.
RunResult run_hand_loop(Job& job, int threads, bool deep) {
  const AugmentOptions& o = job.options;
  const std::size_t n_threads = static_cast<std::size_t>(std::max(1, threads));
  const std::size_t capacity = std::max(kBatch, kShuffle.capacity / n_threads);
  const std::uint32_t height = job.images.front().shape.height, width = job.images.front().shape.width;
  const std::size_t per_crop = std::size_t{kCrop.height} * kCrop.width;
  const float scale = 1.0f / (kNormalization.scale * kNormalization.std[0]);
  const float bias = -kNormalization.mean[0] / kNormalization.std[0];
  struct Pick {
    const std::uint8_t* pixels;  // the image's first
    std::int32_t label;
    std::uint64_t id;
    std::uint32_t x, y;
    bool mirror;
  };
  return on_threads(n_threads, [&](std::size_t t, Tally& tally) {
    const auto [first, last] = share_of(t, n_threads, job.images.size());
    std::mt19937_64 rng(o.seed * 1'000'003 + t);
    std::vector<Pick> window;
    window.reserve(capacity);
    std::vector<float> batch(kBatch * per_crop);
    std::vector<std::int32_t> labels(kBatch);
    std::vector<std::uint64_t> ids(kBatch);
    auto take_batch = [&](std::size_t count) {
      for (std::size_t k = 0; k < count; ++k) {
        const std::size_t i = rng() % window.size();
        const Pick p = window[i];
        window[i] = window.back();
        window.pop_back();
        float* out = batch.data() + k * per_crop;
        for (std::uint32_t y = 0; y < kCrop.height; ++y, out += kCrop.width) {
          const std::uint8_t* row = p.pixels + std::size_t{p.y + y} * width + p.x;
          if (p.mirror)
            for (std::uint32_t x = 0; x < kCrop.width; ++x) out[x] = row[kCrop.width - 1 - x] * scale + bias;
          else
            for (std::uint32_t x = 0; x < kCrop.width; ++x) out[x] = row[x] * scale + bias;
        }
        labels[k] = p.label;
        ids[k] = p.id;
      }
      tally.add(count, labels.data(), ids.data(), batch.data(), per_crop, deep);
    };
    for (std::size_t i = first; i < last; ++i) {
      const Sample& image = job.images[i];
      const auto* pixels = reinterpret_cast<const std::uint8_t*>(image.data.data());
      for (std::uint32_t k = 0; k < kCropsPerImage; ++k) {
        const std::uint64_t bits = rng();
        window.push_back({pixels, image.label, image.id * kCropsPerImage + k,
                          static_cast<std::uint32_t>(bits % (width - kCrop.width + 1)),
                          static_cast<std::uint32_t>((bits >> 16) % (height - kCrop.height + 1)), (bits >> 63) != 0});
        if (window.size() == capacity) take_batch(kBatch);
      }
    }
    while (!window.empty()) take_batch(std::min(kBatch, window.size()));
  });
}
static_assert(kMirrorP == 0.5, "the hand-written loop draws a mirror as one bit");

void check(const char* what, const Tally& got, const Tally& want) {
  if (!got.same_items(want)) {
    std::ostringstream s;
    s << "augment: broken run, " << what << ": " << got.crops << " of " << want.crops << " crops in " << got.batches
      << " of " << want.batches << " batches, label sum " << (got.label_sum == want.label_sum ? "ok" : "wrong")
      << ", id sum " << (got.id_sum == want.id_sum ? "ok" : "wrong");
    throw std::runtime_error(s.str());
  }
}

std::string rate(double crops_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", crops_per_s / 1e6);
  return buf;
}

Json run_augment(const AugmentOptions& opt, const CommonOptions& common) {
  if (opt.crop_threads < 1) throw std::invalid_argument("augment: --crop-threads must be at least 1");

  // The decode of the data set is not part of the figure.
  const auto t_load = Clock::now();
  IdxDataset full = fashion_mnist(opt.data, "train");
  if (opt.images != 0 && opt.images < full.size()) {
    full.labels.resize(opt.images);
    full.images.count = static_cast<std::uint32_t>(opt.images);
    full.images.pixels.resize(opt.images * full.images.height * full.images.width);
  }
  Job job{.options = opt, .reader = IdxReader(std::move(full)), .images = {}, .expected = {}};
  for (std::uint64_t i = 0; i < job.reader.dataset_size(); ++i) job.images.push_back(job.reader.read(i));
  const std::size_t n_images = job.images.size();
  if (n_images == 0) throw std::invalid_argument("augment: the data set in " + opt.data + " is empty");
  const std::size_t n_crops = n_images * kCropsPerImage;
  for (const Sample& s : job.images) {
    job.expected.label_sum += static_cast<std::int64_t>(s.label) * kCropsPerImage;
    for (int k = 0; k < kCropsPerImage; ++k)
      job.expected.id_sum += s.id * kCropsPerImage + static_cast<std::uint64_t>(k);
  }
  job.expected.crops = n_crops;
  job.expected.batches = (n_crops + kBatch - 1) / kBatch;
  const double load_s = seconds_since(t_load);

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int plain_threads = opt.plain_threads > 0 ? opt.plain_threads : cores;
  tbb::task_arena arena(plain_threads);

  const PipelineLayout default_layout{
      .threads = 0, .crop_threads = opt.crop_threads, .collate_threads = opt.collate_threads, .batch_queue = 8};

  std::cout << "augment: " << n_images << " images x " << kCropsPerImage << " crops " << kCrop.str()
            << ", mirror p=" << kMirrorP << ", normalize (x/255-0.2860)/0.3530, shuffle " << kShuffle.capacity << "/"
            << kShuffle.min_after_dequeue << ", batch " << kBatch << "; data loaded in " << std::fixed
            << std::setprecision(2) << load_s << " s (excluded)\n"
            << "pipeline: crop stage on " << opt.crop_threads << " threads, collate on " << opt.collate_threads
            << ", pipeline threads " << cores << " (one per core); plain loop and windowed loop on " << plain_threads
            << " threads\n";
  if (!opt.thread_counts.empty()) {
    std::cout << "scaling: on each N of";
    for (int n : opt.thread_counts) std::cout << " " << n;
    std::cout << " threads, the pipeline (.threads(N), crops on max(1, ceil(N/4)), collate on N, " << kBatch
              << "-crop batch queue max(8, 2N), read queue 64N) and the windowed loop on N threads\n";
  }

  struct Contender {
    std::string name;   // in the JSON
    std::string label;  // in the table
    std::function<RunResult(bool deep)> run;
    int scaling_threads = 0;  // > 0: one of the --threads runs, on this many threads
    PipelineLayout layout{};  // of a pipeline
    bool same_crops = true;   // the very crops of the others (false: the same job, its own draws)
    std::vector<double> rates{}, seconds{}, cpu_ns{};
    RunResult last{};
  };
  std::vector<Contender> contenders;
  auto pipeline = [&job](PipelineLayout layout, Cut cut) {
    return [&job, layout, cut](bool deep) { return run_pipeline(job, layout, deep, cut); };
  };
  auto windowed = [&job](int threads) {
    return [&job, threads](bool deep) { return run_windowed(job, threads, deep); };
  };
  auto hand = [&job](int threads) { return [&job, threads](bool deep) { return run_hand_loop(job, threads, deep); }; };
  contenders.push_back({.name = "stoker_pipeline",
                        .label = "stoker pipeline (crops cut at collate)",
                        .run = pipeline(default_layout, Cut::at_collate),
                        .layout = default_layout});
  // The same pipeline writing its trace (PipelineBuilder::trace): what tracing costs.
  const std::string trace_file =
      (std::filesystem::temp_directory_path() / ("stoker-bench-" + std::to_string(::getpid()) + ".trace.json"))
          .string();
  contenders.push_back({.name = "stoker_pipeline_traced",
                        .label = "  ... writing its trace",
                        .run =
                            [&job, &trace_file, default_layout](bool deep) {
                              RunResult r = run_pipeline(job, default_layout, deep, Cut::at_collate, trace_file);
                              std::filesystem::remove(trace_file);
                              return r;
                            },
                        .layout = default_layout});
  const std::size_t traced_index = contenders.size() - 1;
  contenders.push_back({.name = "stoker_pipeline_cut_in_crop_stage",
                        .label = "stoker pipeline (crops cut in crop stage)",
                        .run = pipeline(default_layout, Cut::in_crop_stage),
                        .layout = default_layout});
  contenders.push_back({.name = "stoker_pipeline_normalize_at_collate",
                        .label = "  ... normalized at collate",
                        .run = pipeline(default_layout, Cut::in_crop_stage_normalize_at_collate),
                        .layout = default_layout});
  contenders.push_back({.name = "plain_loop", .label = "plain loop (global permutation)", .run = [&](bool deep) {
                          return run_plain(job, arena, deep);
                        }});
  const std::size_t plain_index = contenders.size() - 1;
  contenders.push_back({.name = "windowed_loop",
                        .label = "windowed loop (stoker's pieces, no pipeline)",
                        .run = windowed(plain_threads)});
  const std::size_t windowed_index = contenders.size() - 1;
  contenders.push_back({.name = "hand_loop",
                        .label = "hand-written loop (the practical limit)",
                        .run = hand(plain_threads),
                        .same_crops = false});
  const std::size_t hand_index = contenders.size() - 1;
  const std::size_t main_contenders = contenders.size();
  // --threads: the pipeline, the windowed loop and the hand-written loop on each N, next to each
  // other in the list.
  for (int n : opt.thread_counts) {
    const PipelineLayout layout = scaled_layout(n);
    const std::string threads = std::to_string(n);
    contenders.push_back({.name = "stoker_pipeline_threads_" + threads,
                          .label = "stoker pipeline on " + threads + " threads",
                          .run = pipeline(layout, Cut::at_collate),
                          .scaling_threads = n,
                          .layout = layout});
    contenders.push_back({.name = "windowed_loop_threads_" + threads,
                          .label = "windowed loop on " + threads + " threads",
                          .run = windowed(n),
                          .scaling_threads = n});
    contenders.push_back({.name = "hand_loop_threads_" + threads,
                          .label = "hand-written loop on " + threads + " threads",
                          .run = hand(n),
                          .scaling_threads = n,
                          .same_crops = false});
  }

  const double core_to_core_before = core_to_core_ns();
  // One untimed round of each, which also checks that all of them make the very same crops:
  // a loop is only a baseline if it does the same arithmetic.
  std::uint64_t content = 0;
  for (std::size_t c = 0; c < contenders.size(); ++c) {
    const RunResult r = contenders[c].run(true);
    check(contenders[c].name.c_str(), r.tally, job.expected);
    if (c == 0) content = r.tally.content;
    if (contenders[c].same_crops && r.tally.content != content)
      throw std::runtime_error("augment: " + contenders[c].name + " made other crops than " + contenders[0].name +
                               " (checksums of the batches differ)");
  }
  std::cerr << "augment: warm-up done, every contender (" << contenders.size() << ") made every one of the " << n_crops
            << " crops once, and all but the hand-written loops (draws of their own) the very same crops\n";

  const double crops = static_cast<double>(n_crops);
  for (int rep = 0; rep < common.repeats; ++rep) {
    std::cerr << "augment: repeat " << rep + 1 << "/" << common.repeats << "\n";
    // Rotate which goes first, so that slow phases of a busy machine hit all of them alike.
    for (std::size_t k = 0; k < contenders.size(); ++k) {
      Contender& c = contenders[(k + static_cast<std::size_t>(rep)) % contenders.size()];
      RunResult r = c.run(false);
      check(c.name.c_str(), r.tally, job.expected);
      c.rates.push_back(crops / r.seconds);
      c.seconds.push_back(r.seconds);
      c.cpu_ns.push_back(r.cpu_seconds * 1e9 / crops);
      c.last = std::move(r);
    }
  }

  const double core_to_core_after = core_to_core_ns();

  auto samples_text = [](const std::vector<double>& rates) {
    std::string s;
    for (double v : rates) s += (s.empty() ? "" : " ") + rate(v);
    return s;
  };
  const double plain_median = spread(contenders[plain_index].rates).median;
  const double windowed_median = spread(contenders[windowed_index].rates).median;
  const double hand_median = spread(contenders[hand_index].rates).median;
  std::cout << "\nMcrops/s, median (min-max) of " << common.repeats << " repeats, one epoch of " << n_crops
            << " crops each; CPU ns per crop (process-wide); ratio to the plain loop; ratio to the windowed loop;"
               " ratio to the hand-written loop; every repeat\n\n";
  Json results = Json::array(), ratios = Json::object(), vs_windowed = Json::object(), vs_hand = Json::object();
  for (std::size_t i = 0; i < contenders.size(); ++i) {
    const Contender& c = contenders[i];
    const Spread sp = spread(c.rates);
    const double cpu = spread(c.cpu_ns).median;
    if (i < main_contenders)
      std::cout << "  " << std::left << std::setw(44) << c.label << std::right << std::setprecision(3)
                << rate(sp.median) << " (" << rate(sp.min) << "-" << rate(sp.max) << ")  " << std::setw(6)
                << std::setprecision(0) << cpu << " ns  " << std::setprecision(3) << sp.median / plain_median << "  "
                << sp.median / windowed_median << "  " << sp.median / hand_median << "  [" << samples_text(c.rates)
                << "]\n";
    Json entry = {{"name", c.name},
                  {"crops_per_s_median", sp.median},
                  {"min", sp.min},
                  {"max", sp.max},
                  {"samples", c.rates},
                  {"seconds_median", spread(c.seconds).median},
                  {"cpu_ns_per_crop_median", cpu}};
    if (c.scaling_threads > 0) entry["threads"] = c.scaling_threads;
    results.push_back(std::move(entry));
    if (i < main_contenders) {
      if (i != plain_index) ratios[c.name] = sp.median / plain_median;
      if (i != windowed_index) vs_windowed[c.name] = sp.median / windowed_median;
      if (i != hand_index) vs_hand[c.name] = sp.median / hand_median;
    }
  }
  const double ratio = ratios[contenders[0].name].get<double>();
  const double ratio_windowed = vs_windowed[contenders[0].name].get<double>();
  const double ratio_hand = vs_hand[contenders[0].name].get<double>();
  const double traced = spread(contenders[traced_index].rates).median / spread(contenders[0].rates).median;
  std::cout << "\nstoker pipeline / plain loop:    " << std::setprecision(3) << ratio << "\n"
            << "stoker pipeline / windowed loop: " << ratio_windowed
            << " (vs_windowed_loop: what the pipeline adds to its pieces; goal >= 0.9)\n"
            << "stoker pipeline / hand loop:     " << ratio_hand
            << " (vs_hand_loop: the ratio to the practical limit; goal >= 0.8 at N = 1 and 2 of --threads)\n"
            << "traced / untraced pipeline:      " << traced << " (what writing the trace costs; goal >= 0.97)\n";

  // The scaling: pipeline and windowed loop on the same N threads, each ratio of medians.
  Json scaling = Json::array();
  if (main_contenders < contenders.size()) {
    std::cout << "\nscaling, Mcrops/s median (min-max) of " << common.repeats
              << " repeats: stoker pipeline | windowed loop | hand-written loop | pipeline / windowed | pipeline / "
                 "hand | windowed / hand\n\n"
              << "  threads  crop/collate   stoker pipeline            windowed loop              hand-written loop   "
                 "       p/w    p/h    w/h\n";
    for (std::size_t i = main_contenders; i + 2 < contenders.size(); i += 3) {
      const Contender &p = contenders[i], &w = contenders[i + 1], &h = contenders[i + 2];
      const Spread sp = spread(p.rates), sw = spread(w.rates), sh = spread(h.rates);
      std::ostringstream layout;
      layout << p.layout.crop_threads << "/" << p.layout.collate_threads;
      std::cout << "  " << std::setw(7) << p.scaling_threads << "  " << std::left << std::setw(12) << layout.str()
                << std::right << "  " << rate(sp.median) << " (" << rate(sp.min) << "-" << rate(sp.max) << ")    "
                << rate(sw.median) << " (" << rate(sw.min) << "-" << rate(sw.max) << ")    " << rate(sh.median) << " ("
                << rate(sh.min) << "-" << rate(sh.max) << ")    " << std::setprecision(3) << sp.median / sw.median
                << "  " << sp.median / sh.median << "  " << sw.median / sh.median << "\n"
                << "           every repeat:  [" << samples_text(p.rates) << "]  [" << samples_text(w.rates) << "]  ["
                << samples_text(h.rates) << "]\n";
      scaling.push_back({{"threads", p.scaling_threads},
                         {"crop_threads", p.layout.crop_threads},
                         {"collate_threads", p.layout.collate_threads},
                         {"batch_queue", p.layout.batch_queue},
                         {"read_queue", p.layout.read_queue},
                         {"stoker_crops_per_s", sp.median},
                         {"windowed_loop_crops_per_s", sw.median},
                         {"ratio", sp.median / sw.median},
                         {"hand_loop_crops_per_s", sh.median},
                         {"ratio_to_hand_loop", sp.median / sh.median},
                         {"windowed_over_hand_loop", sw.median / sh.median},
                         {"hand_loop_samples", h.rates},
                         {"hand_loop_cpu_ns_per_crop", spread(h.cpu_ns).median},
                         {"stoker_samples", p.rates},
                         {"windowed_loop_samples", w.rates},
                         {"stoker_cpu_ns_per_crop", spread(p.cpu_ns).median},
                         {"windowed_loop_cpu_ns_per_crop", spread(w.cpu_ns).median},
                         {"stoker_last_run", stage_table(p.last.summary)}});
    }
    // Where each N's pipeline spends its time: which stage is busy, which starves or waits
    // for room, and how long the consumer waited.
    const auto threads = [](int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); };
    for (std::size_t i = main_contenders; i < contenders.size(); i += 3) {
      std::cout << "\nlast run of the stoker pipeline on " << threads(contenders[i].scaling_threads) << ":\n";
      print_summary(std::cout, contenders[i].last.summary);
    }
    // --trace-dir: one more run of each N's pipeline, untimed, writing its trace.
    if (!opt.trace_dir.empty()) {
      std::filesystem::create_directories(opt.trace_dir);
      for (std::size_t i = main_contenders; i < contenders.size(); i += 3) {
        const Contender& c = contenders[i];
        const auto file = std::filesystem::path(opt.trace_dir) /
                          ("augment-threads-" + std::to_string(c.scaling_threads) + ".trace.json");
        check(c.name.c_str(), run_pipeline(job, c.layout, false, Cut::at_collate, file.string()).tally, job.expected);
        std::cout << "trace of the pipeline on " << threads(c.scaling_threads) << ": " << file.string() << "\n";
      }
    }
  }

  std::cout << "\ncore-to-core latency, one way: " << std::setprecision(0) << core_to_core_before
            << " ns before the runs, " << core_to_core_after
            << " ns after (the pipeline hands each crop from core to core, the loops do not)\n";

  std::cout << "\nlast run of the stoker pipeline (crops cut at collate):\n";
  print_summary(std::cout, contenders[0].last.summary);

  Json config;
  config["data"] = opt.data + "/train-images-idx3-ubyte.gz";
  config["images"] = n_images;
  config["crops_per_image"] = kCropsPerImage;
  config["crops_per_epoch"] = n_crops;
  config["crop"] = {kCrop.height, kCrop.width};
  config["mirror_p"] = kMirrorP;
  config["normalize"] = {
      {"scale", kNormalization.scale}, {"mean", kNormalization.mean[0]}, {"std", kNormalization.std[0]}};
  config["shuffle"] = {{"capacity", kShuffle.capacity}, {"min_after_dequeue", kShuffle.min_after_dequeue}};
  config["batch"] = kBatch;
  config["crop_threads"] = opt.crop_threads;
  config["collate_threads"] = opt.collate_threads;
  config["pipeline_tbb_threads"] = cores;
  config["plain_threads"] = plain_threads;
  config["windowed_loop_threads"] = plain_threads;
  config["scaling_threads"] = opt.thread_counts;
  config["repeats"] = common.repeats;
  config["seed"] = opt.seed;
  config["load_s"] = load_s;
  config["core_to_core_ns"] = {{"before", core_to_core_before}, {"after", core_to_core_after}};
  config["figure"] = "crops / seconds for one epoch, data set decode excluded; median over repeats";
  config["pipeline"] =
      "IdxReader (samples are views of the data set in memory) -> RandomCrops flat_map<DeferredCrop> (draws "
      "windows and mirrors; the crops point at the data set's entries) -> shuffle -> batch -> Collate cutting "
      "crop+mirror+normalize into the batch; consumer touches each batch";
  config["pipeline_cut_in_crop_stage"] =
      "the same with RandomCrops flat_map<Sample> cutting fused "
      "crop+mirror+normalize float32 crops, which Collate copies into the batch";
  config["pipeline_normalize_at_collate"] =
      "the same with RandomCrops cutting crop+mirror in uint8 and Collate "
      "normalizing into the float32 batch";
  config["same_output"] =
      "every pipeline and loop but the hand-written one makes the same crops, bit for bit, and every one of them "
      "every crop once (checked in an untimed first round); the hand-written loop draws its own";
  config["plain_loop"] =
      "tbb::parallel_for: draw windows and mirrors as RandomCrops does, one Fisher-Yates "
      "permutation of all crops, then fill each batch in place with crop_mirror_normalize_into";
  config["hand_loop"] =
      "the practical limit: N std::threads, each over a contiguous share of the images (whole batches), each with "
      "a std::mt19937_64 of its own drawing 5 windows and mirror bits per image into a plain vector of capacity / N "
      "crops, a batch of 255 taken by uniform swap-remove picks whenever it is full, each crop cut, mirrored and "
      "normalized into one reused float batch with its labels and ids; no piece of stoker";
  config["windowed_loop"] =
      "stoker's pieces without a pipeline: N std::threads, each over a contiguous share of the images (whole batches), "
      "with a "
      "shuffle window of its own (the job's capacity and min_after_dequeue, filled to capacity); "
      "RandomCrops::plan draws each image's crops, DeferredCrops go into the thread's ShuffleBuffer, and each time "
      "it is full 255 are taken and cut+mirrored+normalized into the batch by make_batch, as Collate does";
  config["scaling"] =
      "for each N of --threads: the pipeline with .threads(N), crops on max(1, ceil(N/4)), collate "
      "on N, batch queue max(8, 2N), read queue 64N, crops cut at collate; and the windowed loop on N threads";
  Json out;
  out["config"] = std::move(config);
  out["results"] = std::move(results);
  out["ratio"] = {{"pipeline_over_plain", ratio},
                  {"all", ratios},
                  {"pipeline_over_windowed_loop", ratio_windowed},
                  {"goal_vs_windowed_loop", 0.9},
                  {"meets_goal_vs_windowed_loop", ratio_windowed >= 0.9},
                  {"vs_windowed_loop", vs_windowed},
                  {"pipeline_over_hand_loop", ratio_hand},
                  {"goal_vs_hand_loop", 0.8},
                  {"vs_hand_loop", vs_hand}};
  out["vs_windowed_loop"] = ratio_windowed;
  out["vs_hand_loop"] = ratio_hand;
  out["traced_over_untraced"] = traced;
  if (!scaling.empty()) out["scaling"] = std::move(scaling);
  out["verified"] = {
      {"crops_per_run", n_crops}, {"same_crops_in_all_but_hand_loops", true}, {"contenders", contenders.size()}};
  out["pipeline_stages"] = stage_table(contenders[0].last.summary);
  out["pipeline_cut_in_crop_stage_stages"] = stage_table(contenders[traced_index + 1].last.summary);
  return out;
}

}  // namespace

SuiteRun setup_augment(CLI::App& command) {
  auto opt = std::make_shared<AugmentOptions>();
  command.add_option("--data", opt->data, "Directory with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz")
      ->capture_default_str();
  command.add_option("--images", opt->images, "Use only the first N images (0: all)")
      ->check(apps::in_range<std::size_t>(0, std::size_t{1} << 32))
      ->capture_default_str();
  command.add_option("--crop-threads", opt->crop_threads, "Threads of the pipeline's crop stage")
      ->check(apps::in_range(1, 256))
      ->capture_default_str();
  command.add_option("--collate-threads", opt->collate_threads, "Threads of the pipeline's collate stage")
      ->check(apps::in_range(1, 256))
      ->capture_default_str();
  command
      .add_option("--plain-threads", opt->plain_threads,
                  "Threads of the plain loop and of the windowed loop (0: every core)")
      ->check(apps::in_range(0, 256))
      ->capture_default_str();
  command.add_option("--seed", opt->seed, "Seed of the crops, mirrors and shuffle")
      ->check(apps::at_least<std::uint64_t>(0))
      ->capture_default_str();
  CLI::Option* threads =
      command
          .add_option("--threads", opt->thread_counts,
                      "Also run, for each N of this list (e.g. 1,2,4,8), the pipeline on N threads (crops on "
                      "max(1, ceil(N/4)), collate on N, 64N images queued for the crops), the windowed loop and the "
                      "hand-written loop on N threads, with their ratios")
          ->delimiter(',')
          ->check(apps::in_range(1, 256));
  command
      .add_option("--trace-dir", opt->trace_dir,
                  "With --threads: after the timed runs, run each N's pipeline once more, untimed, writing its "
                  "trace (PipelineBuilder::trace) to DIR/augment-threads-N.trace.json")
      ->needs(threads);
  return [opt](const CommonOptions& common) { return run_augment(*opt, common); };
}

}  // namespace stoker::bench
