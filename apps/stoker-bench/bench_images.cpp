// SPDX-License-Identifier: Apache-2.0
// The `images` suite: the image job (each JPEG read from the page cache, RandomResizedCrop to
// 224x224 with torchvision's parameters, mirrored with p = 0.5, normalized with ImageNet's mean
// and std, batched by 256 as float32 NCHW with int32 labels) on N threads, interleaved:
//   - stoker_pipeline: ImageSource -> DecodeCropWindow on N threads (header, window drawn from
//     the size, only the window decoded at its DCT scale) -> batch -> Collate, which resizes,
//     mirrors and normalizes each window straight into the batch; the consumer touches each batch;
//   - stoker_pipeline_resize_in_map: the same with DecodeResizedCrop, which resizes in the map
//     stage, and Collate copying the crops into the batch;
//   - tight_loop: the same job with no pipeline: N threads take the epoch's images by an atomic
//     counter, read each file with the same pread and decode it with the same window and DCT
//     scaling trick and the same resize straight into its slot of the batch; the thread that
//     fills a batch's last slot touches it. The practical limit.
// And, with --torchvision SCRIPT, the PyTorch user's way (torchvision_images.py: PIL, torchvision's
// transforms, a DataLoader with N workers), run as a child process in the same rotation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sched.h>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/decode_crop.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/mix.h"
#include "stoker/stages/remote.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};
constexpr double kMirrorP = 0.5;
constexpr double kMiB = 1024.0 * 1024.0;

struct ImagesOptions {
  std::string data;
  std::string remote;        // the same shards at a URL; empty: not run
  std::string cache;         // with remote: a cache of them in a folder made here; empty: not run
  bool mix = false;          // also run the pipeline on the data set as a mixture of its halves
  std::vector<int> threads;  // empty: 1, 2, 4, ... up to the cores, and the cores
  std::uint64_t images = 0;  // 0: all
  std::uint32_t size = 224;
  std::size_t batch = 256;
  std::uint64_t seed = 0;
  std::string torchvision;     // torchvision_images.py; empty: not run
  bool python_loader = false;  // also run it with --loader stoker (stoker.ImageLoader)
  bool pin_memory = false;     // pin_memory=True for both
  std::string python = "/usr/bin/python3";
  std::vector<std::string> only;  // contenders to run; empty: all
  bool cold = false;              // every run with empty pools
};

// ---- what a run delivered ----------------------------------------------------------------------

std::uint64_t hash_bytes(std::uint64_t h, const std::byte* p, std::size_t n) {
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, p + i, 8);
    h = mix64(h ^ word);
  }
  return h;
}

// Enough to prove that nothing was lost or repeated, and, when `deep`, a checksum of every
// image's crop that does not depend on the order they come in or which batch holds them.
struct Tally {
  std::uint64_t images = 0, batches = 0, id_sum = 0, content = 0;
  std::int64_t label_sum = 0;
  float touched = 0;

  void add(const Batch& b, bool deep) {
    ++batches;
    images += b.count;
    const auto labels = b.label_values();
    const auto ids = b.id_values();
    for (std::size_t i = 0; i < b.count; ++i) {
      label_sum += labels[i];
      id_sum += ids[i];
      if (deep)
        content += hash_bytes(mix64(ids[i] ^ (std::uint64_t(std::uint32_t(labels[i])) << 40)),
                              b.data() + i * b.sample_bytes(), b.sample_bytes());
    }
    touched += b.as<float>()[0];
  }
  void merge(const Tally& o) {
    images += o.images;
    batches += o.batches;
    id_sum += o.id_sum;
    content += o.content;
    label_sum += o.label_sum;
    touched += o.touched;
  }
  bool same_items(const Tally& o) const {
    return images == o.images && batches == o.batches && id_sum == o.id_sum && label_sum == o.label_sum;
  }
};

// ---- memory ------------------------------------------------------------------------------------

// A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"); 0 when absent.
double status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::strlen(key)));
  return 0;
}

// Resets VmHWM to the current RSS (Linux 4.0 and later), so that a run's peak is its own.
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// ---- cores ---------------------------------------------------------------------------------------

// Confines every thread of the process to `n` of the CPUs it may run on, for its lifetime, so that
// a contender on N threads has N cores and no more whatever threads it starts: oneTBB lends one
// of its own workers to an arena of one slot that is given tasks to run (its "mandatory
// concurrency"), so a pipeline of 1 thread can run on 2. Threads started meanwhile (a child
// process, a pipeline's) inherit the confinement from the thread that starts them.
class Confined {
 public:
  explicit Confined(int n) {
    if (sched_getaffinity(0, sizeof all_, &all_) != 0) return;
    CPU_ZERO(&some_);
    int taken = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && taken < n; ++cpu)
      if (CPU_ISSET(cpu, &all_)) {
        CPU_SET(cpu, &some_);
        ++taken;
      }
    active_ = taken < CPU_COUNT(&all_);
    if (active_) apply(some_);
  }
  ~Confined() {
    if (active_) apply(all_);
  }
  Confined(const Confined&) = delete;
  Confined& operator=(const Confined&) = delete;

 private:
  static void apply(const cpu_set_t& set) {
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
      sched_setaffinity(tid, sizeof set, &set);  // a thread that just ended is no error worth a figure
    }
  }
  cpu_set_t all_{}, some_{};
  bool active_ = false;
};

// ---- the page cache ----------------------------------------------------------------------------

// The share of the files' pages that are in the page cache (mincore of a mapping of each).
double resident_fraction(const std::vector<std::string>& files) {
  const long page = sysconf(_SC_PAGESIZE);
  std::uint64_t pages = 0, resident = 0;
  std::vector<unsigned char> in_core;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      const auto size = static_cast<std::size_t>(st.st_size);
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        const std::size_t n = (size + static_cast<std::size_t>(page) - 1) / static_cast<std::size_t>(page);
        in_core.resize(n);
        if (::mincore(map, size, in_core.data()) == 0) {
          pages += n;
          for (unsigned char c : in_core) resident += c & 1;
        }
        ::munmap(map, size);
      }
    }
    ::close(fd);
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

// ---- the job -----------------------------------------------------------------------------------

// Where the pipeline resizes: in the collate, straight into the batch (DecodeCropWindow: the map
// stage draws the crop and decodes its window), or in the map stage (DecodeResizedCrop: the
// whole crop made there, then copied into the batch by the collate).
enum class ResizeAt { collate, map };

// How the pipeline is laid out on N threads. Resizing at collate, the collate does about 40% of
// the work; its resizes run in parallel on whichever of the pipeline's threads are idle, so one
// body per 4 threads keeps up. Resizing in the map stage, the collate only copies (1/30 of the
// work): one body per 8 threads. Queues hold a few items per thread, and one batch.
struct PipelineLayout {
  int threads = 1, decode_threads = 1, collate_threads = 1;
  std::size_t read_queue = 8, crop_queue = 8, batch_queue = 1, collate_queue = 1;
};
PipelineLayout layout_for(int n, ResizeAt at) {
  const auto q = static_cast<std::size_t>(std::max(8, 2 * n));
  return {.threads = n,
          .decode_threads = n,
          .collate_threads = at == ResizeAt::collate ? (n + 3) / 4 : (n + 7) / 8,
          .read_queue = q,
          .crop_queue = q,
          .batch_queue = 1,
          .collate_queue = 1};
}

// Pools whose buffers vary in size (files, decoded windows) keep at most this much idle memory.
constexpr std::size_t kVaryingPoolCache = std::size_t{32} << 20;

struct Job {
  const ImagesOptions& options;
  std::shared_ptr<const ImageDataset> data;
  std::vector<std::shared_ptr<const ImageDataset>> halves;  // non-empty: read as their mixture
  DecodeResizedCropOptions crop;  // pools are made per run
  Shape crop_shape;
  std::vector<std::uint64_t> order;  // the epoch's ids, as ImageSource reads them
  Tally expected;
  std::uint64_t max_file_bytes = 0, max_image_pixels = 0;

  std::size_t crop_bytes() const { return crop_shape.elements() * sizeof(float); }
  std::size_t batch_bytes() const { return Batch::storage_bytes(crop_shape, DType::f32, options.batch); }

  // What the pipeline's buffers can hold at most on `l`: every queue full, every body holding
  // its input and its output, the batcher a whole batch, the consumer one, and the idle memory
  // the varying-size pools may keep. Buffers of one size are reused, so their pools add nothing.
  // An item after decoding is a float32 crop (resized in the map stage), or a decoded window,
  // at most the largest image (resized at collate).
  double bound_bytes(const PipelineLayout& l, ResizeAt at) const {
    const double n = l.decode_threads, c = l.collate_threads, b = static_cast<double>(options.batch);
    const double window = static_cast<double>(max_image_pixels) * 3;
    const double item = at == ResizeAt::collate ? window : static_cast<double>(crop_bytes());
    const double files = (2.0 * static_cast<double>(l.read_queue) + n) * static_cast<double>(max_file_bytes);
    const double windows = at == ResizeAt::map ? n * window : 0;  // held for the call only
    const double items =
        (static_cast<double>(l.crop_queue) + n + b * (1 + static_cast<double>(l.batch_queue) + c)) * item;
    const double batches = (static_cast<double>(l.collate_queue) + c + 1) * static_cast<double>(batch_bytes());
    return files + windows + items + batches + 2.0 * kVaryingPoolCache;
  }
};

struct RunResult {
  double seconds = 0, cpu_seconds = 0;
  double rss_before_mib = 0, peak_rss_mib = 0;  // the process's, around the run
  Tally tally;
  PipelineSummary summary;  // the pipeline's
};

// The buffers a contender keeps from one run to the next, as a training job keeps them from one
// epoch to the next, so that the figure is the steady state rather than the first touch of
// fresh memory (--cold starts every run with empty pools).
struct Pools {
  std::shared_ptr<BufferPool> files = BufferPool::create(kVaryingPoolCache);
  std::shared_ptr<BufferPool> scratch = BufferPool::create(kVaryingPoolCache);
  std::shared_ptr<BufferPool> crops = BufferPool::create();
  std::shared_ptr<BufferPool> batches = BufferPool::create();
};

DecodeResizedCropOptions crop_options(const Job& job, const Pools& pools) {
  DecodeResizedCropOptions o = job.crop;
  o.crop.pool = pools.crops;
  o.scratch = pools.scratch;
  return o;
}

RunResult run_pipeline(const Job& job, int n, ResizeAt at, bool deep, std::vector<Pools>& pools) {
  const PipelineLayout l = layout_for(n, at);
  pools.resize(1);
  const Pools& p = pools.front();
  RunResult r;
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  const auto run = [&](auto decode_crop, auto source) {
    auto pipe = PipelineBuilder{}
                    .threads(l.threads)
                    .seed(job.options.seed)
                    .epochs(1)
                    .source("read", std::move(source), {.queue = l.read_queue})
                    .map("decode_crop", std::move(decode_crop),
                         {.threads = l.decode_threads, .queue = l.crop_queue, .max_chunk = 1})
                    .batch("batch", job.options.batch, {.queue = l.batch_queue})
                    .map("collate", Collate{.pool = p.batches},
                         {.threads = l.collate_threads, .queue = l.collate_queue, .max_chunk = 1})
                    .build();
    for (Batch& batch : pipe.epoch()) r.tally.add(batch, deep);
    r.summary = pipe.summary();
  };
  // The halves' mixture holds every image once, weighted by the halves' sizes.
  const auto mixture = [&] {
    return MixedImageSource(job.halves, {.weights = {static_cast<double>(job.halves[0]->size()),
                                                     static_cast<double>(job.halves[1]->size())},
                                         .stop = MixStop::all_exhausted,
                                         .pool = p.files});
  };
  if (!job.halves.empty())
    run(DecodeCropWindow(crop_options(job, p)), mixture());
  else if (at == ResizeAt::collate)
    run(DecodeCropWindow(crop_options(job, p)), ImageSource(job.data, {.pool = p.files}));
  else
    run(DecodeResizedCrop(crop_options(job, p)), ImageSource(job.data, {.pool = p.files}));
  r.seconds = seconds_since(t0);
  r.cpu_seconds = cpu_seconds() - cpu0;
  return r;
}

// The strongest loop doing the same job: the k-th image of the epoch (ImageSource's order) goes to
// slot k % B of batch k / B. Threads take k from an atomic counter, so none waits for another
// while there are images left; batches live in a ring of two, and a thread waits for a ring
// entry only if it got a whole batch ahead of the slowest thread. Each thread reads into a pool
// of its own and decodes with a DecodeResizedCrop of its own (the same code, no shared pool).
RunResult run_tight_loop(const Job& job, int n, bool deep, std::vector<Pools>& pools) {
  constexpr std::size_t kRing = 2;
  constexpr std::uint64_t kFailed = ~std::uint64_t{0};  // what the ring holds once a thread failed
  const std::size_t images = job.order.size(), size = job.options.batch;
  const std::size_t batches = (images + size - 1) / size;
  const StageContext ctx{.seed = job.options.seed, .epoch = 0};
  pools.resize(static_cast<std::size_t>(n));  // pools[0]'s batch pool holds the batches
  const auto& batch_pool = pools.front().batches;
  RunResult r;
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  {
    const auto count_of = [&](std::size_t b) { return std::min(size, images - b * size); };
    struct Entry {
      Batch batch;
      std::atomic<std::uint64_t> holds{0};  // the batch it is for
      std::atomic<std::size_t> filled{0};
    };
    std::vector<Entry> ring(kRing);
    for (std::size_t e = 0; e < kRing && e < batches; ++e) {
      ring[e].batch = Batch::allocate(*batch_pool, job.crop_shape, DType::f32, count_of(e));
      ring[e].holds.store(e);
    }
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<Tally> tallies(static_cast<std::size_t>(n));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    const auto work = [&](std::size_t t) {
      try {
        const Pools& mine = pools[t];
        const DecodeResizedCrop crop(crop_options(job, mine));
        for (std::size_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < images;) {
          const std::size_t b = k / size, s = k % size;
          Entry& e = ring[b % kRing];
          for (std::uint64_t holds; (holds = e.holds.load(std::memory_order_acquire)) != b;) {
            if (failed.load()) return;
            e.holds.wait(holds);  // wakes when the entry changes: a delivery, or a failure
          }
          const EncodedImage in = job.data->read(job.order[k], *mine.files);
          crop.decode_into(in.bytes(), in.name, in.id, ctx, std::as_writable_bytes(e.batch.sample<float>(s)));
          e.batch.label_values()[s] = in.label;
          e.batch.id_values()[s] = in.id;
          if (e.filled.fetch_add(1, std::memory_order_acq_rel) + 1 == count_of(b)) {
            tallies[t].add(e.batch, deep);  // the batch is delivered: its slot goes to batch b + kRing
            e.filled.store(0, std::memory_order_relaxed);
            if (b + kRing < batches) {
              if (count_of(b + kRing) != e.batch.count) e.batch = Batch{};  // the short last batch
              if (e.batch.count == 0)
                e.batch = Batch::allocate(*batch_pool, job.crop_shape, DType::f32, count_of(b + kRing));
              e.holds.store(b + kRing, std::memory_order_release);
              e.holds.notify_all();
            }
          }
        }
      } catch (...) {
        errors[t] = std::current_exception();
        failed.store(true);
        next.store(images);      // the others stop after their image
        for (Entry& e : ring) {  // and none waits for a batch that will not come
          e.holds.store(kFailed);
          e.holds.notify_all();
        }
      }
    };
    {
      std::vector<std::jthread> threads;
      for (int t = 0; t < n; ++t) threads.emplace_back(work, static_cast<std::size_t>(t));
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (const Tally& t : tallies) r.tally.merge(t);
  }
  r.seconds = seconds_since(t0);
  r.cpu_seconds = cpu_seconds() - cpu0;
  return r;
}

// ---- torchvision, as a child process -----------------------------------------------------------

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// torchvision_images.py with `loader` (torchvision or stoker) on `workers` workers: the median
// images/s of three timed epochs after an untimed one, the steady state of a process that keeps
// its workers (or pipeline) from epoch to epoch, as the C++ contenders keep their pools.
double run_python(const ImagesOptions& o, const char* loader, int workers) {
  const std::string command = shell_quote(o.python) + " " + shell_quote(o.torchvision) + " --loader " + loader +
                              " --data " + shell_quote(o.data) + " --workers " + std::to_string(workers) +
                              " --warmup 1 --epochs 3" + " --images " + std::to_string(o.images) + " --size " +
                              std::to_string(o.size) + " --batch " + std::to_string(o.batch) + " --seed " +
                              std::to_string(o.seed) + (o.pin_memory ? " --pin-memory" : "") + " --json 2>/dev/null";
  FILE* child = ::popen(command.c_str(), "r");
  if (!child) throw std::runtime_error("images: cannot run " + o.python + ": " + std::strerror(errno));
  std::string out;
  char buffer[4096];
  for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, child)) > 0;) out.append(buffer, got);
  const int status = ::pclose(child);
  const auto last = out.find_last_of('\n', out.size() >= 2 ? out.size() - 2 : 0);
  const std::string line = out.substr(last == std::string::npos ? 0 : last + 1);
  if (status != 0 || line.empty() || line.front() != '{')
    throw std::runtime_error("images: " + o.torchvision + " failed (exit status " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             "); run it by hand to see why: " + command.substr(0, command.size() - 12));
  return Json::parse(line).at("images_per_s_median").get<double>();
}

// ---- the suite ---------------------------------------------------------------------------------

std::vector<int> default_threads() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> n;
  for (int t = 1; t < cores; t *= 2) n.push_back(t);
  n.push_back(cores);
  return n;
}

std::vector<std::uint64_t> ids_below(std::uint64_t n) {
  std::vector<std::uint64_t> ids(n);
  for (std::uint64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// A folder made under `parent` for one run, removed with everything in it at the end.
class RunFolder {
 public:
  RunFolder(const std::string& parent, const std::string& tag) {
    std::string pattern = (std::filesystem::path(parent) / (tag + "-XXXXXX")).string();
    if (!::mkdtemp(pattern.data()))
      throw std::invalid_argument("images: cannot make a folder in '" + parent + "': " + std::strerror(errno));
    path_ = pattern;
  }
  ~RunFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // The bytes of its files.
  std::uint64_t bytes() const {
    std::uint64_t sum = 0;
    for (const auto& f : std::filesystem::directory_iterator(path_))
      if (f.is_regular_file()) sum += f.file_size();
    return sum;
  }

 private:
  std::filesystem::path path_;
};

const std::string kContenders[] = {"stoker_pipeline",        "stoker_pipeline_resize_in_map", "tight_loop",
                                   "stoker_pipeline_remote", "stoker_pipeline_cached",        "stoker_pipeline_mix",
                                   "torchvision_dataloader", "stoker_python_loader"};

Json run_images(const ImagesOptions& opt, const CommonOptions& common) {
  const std::vector<int> thread_counts = opt.threads.empty() ? default_threads() : opt.threads;
  const auto wanted = [&](const std::string& name) {
    return opt.only.empty() || std::find(opt.only.begin(), opt.only.end(), name) != opt.only.end();
  };
  for (const auto& name : opt.only)
    if (std::find(std::begin(kContenders), std::end(kContenders), name) == std::end(kContenders))
      throw std::invalid_argument("images: --only " + name +
                                  ": the contenders are stoker_pipeline, stoker_pipeline_resize_in_map, tight_loop, "
                                  "torchvision_dataloader and stoker_python_loader");
  const bool torchvision = !opt.torchvision.empty() && wanted("torchvision_dataloader");
  const bool python_loader = opt.python_loader && wanted("stoker_python_loader");
  if (wanted("torchvision_dataloader") && !opt.only.empty() && opt.torchvision.empty())
    throw std::invalid_argument("images: --only torchvision_dataloader needs --torchvision SCRIPT");
  if (opt.python_loader && opt.torchvision.empty())
    throw std::invalid_argument("images: --python-loader needs --torchvision SCRIPT, which runs it");

  auto data = ImageDataset::open(opt.data);
  if (opt.images != 0 && opt.images < data->size()) data = data->subset(ids_below(opt.images));
  Job job{.options = opt, .data = data, .halves = {}, .crop = {}, .crop_shape = {}, .order = {}, .expected = {}};
  job.crop.crop = {.size = {opt.size, opt.size},
                   .mirror = MirrorOptions{.axis = Axis::width, .p = kMirrorP},
                   .normalize = kImageNet,
                   .layout = stoker::Layout::planar};
  job.crop_shape = DecodeResizedCrop(job.crop).output_shape();

  // Every file read once, untimed, so that every run reads from the page cache; the headers say
  // how large the largest image is, for the memory bound.
  const auto t_load = Clock::now();
  std::set<std::string> file_set;
  {
    const auto pool = BufferPool::create(kVaryingPoolCache);
    const ImageSource source(data);
    for (std::uint64_t k = 0; k < source.size(); ++k) job.order.push_back(source.id_at(opt.seed, 0, k));
    for (std::uint64_t id = 0; id < data->size(); ++id) {
      const EncodedImage e = data->read(id, *pool);
      const ImageInfo info = read_image_info(e.bytes(), e.name);
      job.max_file_bytes = std::max<std::uint64_t>(job.max_file_bytes, e.data.size());
      job.max_image_pixels = std::max<std::uint64_t>(job.max_image_pixels, std::uint64_t{info.width} * info.height);
      job.expected.label_sum += e.label;
      job.expected.id_sum += id;
      const auto tar = e.name.find(".tar:");
      file_set.insert(tar == std::string::npos ? e.name : e.name.substr(0, tar + 4));
    }
  }
  const std::vector<std::string> files(file_set.begin(), file_set.end());
  job.expected.images = data->size();
  job.expected.batches = (data->size() + opt.batch - 1) / opt.batch;
  const double cached_before = resident_fraction(files);
  std::cout << "images: " << data->size() << " images of " << opt.data << " (" << files.size() << " files, "
            << fixed(100 * cached_before, 1) << "% of their pages in the page cache after one read; "
            << fixed(seconds_since(t_load), 1) << " s, not timed)\n"
            << "job: RandomResizedCrop " << opt.size << "x" << opt.size
            << " (scale 0.08-1, ratio 3/4-4/3), mirror p 0.5, ImageNet mean/std, batches of " << opt.batch
            << " float32 NCHW + int32 labels\n";
  if (cached_before < 0.99)
    std::cout << "warning: the files do not all stay in the page cache (too little free memory?): reads hit the disk\n";

  struct Contender {
    std::string name;
    int threads;
    std::function<RunResult(bool deep, std::vector<Pools>&)> run;  // null for the Python children
    std::vector<Pools> pools{};
    std::vector<double> rates{}, cpu_ms{}, rss_growth_mib{};
    RunResult last{};
  };
  // The same job on the same images, read from where --remote says: the warm-up round checks
  // that its crops are the very same.
  Job remote = job;
  const bool remote_run = !opt.remote.empty() && wanted("stoker_pipeline_remote");
  if (remote_run) {
    remote.data = ImageDataset::open(opt.remote);
    if (opt.images != 0 && opt.images < remote.data->size()) remote.data = remote.data->subset(ids_below(opt.images));
    if (remote.data->size() != data->size())
      throw std::invalid_argument("images: --remote " + opt.remote + " holds " + std::to_string(remote.data->size()) +
                                  " images, --data " + std::to_string(data->size()) + ": not the same shards");
  }
  // The same shards through a cache on the local disk, in a folder of its own under --cache, with
  // room for all of them: the untimed round fetches them (epoch 1), the timed ones read the copies.
  Job cached = job;
  const bool cached_run = !opt.cache.empty() && wanted("stoker_pipeline_cached");
  std::optional<RunFolder> cache_folder;
  std::uint64_t cache_budget = 0;
  if (cached_run) {
    if (opt.remote.empty()) throw std::invalid_argument("images: --cache needs --remote, the shards to cache");
    for (const auto& f : files) cache_budget += std::filesystem::file_size(f);
    cache_folder.emplace(opt.cache, "stoker-bench-cache");
    RemoteOptions options;
    options.cache_dir = cache_folder->path();
    options.cache_bytes = cache_budget;
    cached.data = ImageDataset::open(opt.remote, options);
    if (opt.images != 0 && opt.images < cached.data->size()) cached.data = cached.data->subset(ids_below(opt.images));
  }
  // The same job reading the data set as the mixture of its two halves: the same images, once each.
  Job mixed = job;
  const bool mix_run = opt.mix && wanted("stoker_pipeline_mix");
  if (mix_run) {
    const std::vector<std::uint64_t> ids = ids_below(data->size());
    const auto half = static_cast<std::ptrdiff_t>(ids.size() / 2);
    mixed.halves = {data->subset({ids.begin(), ids.begin() + half}), data->subset({ids.begin() + half, ids.end()})};
  }
  std::vector<Contender> contenders;
  for (int n : thread_counts) {
    if (wanted("stoker_pipeline"))
      contenders.push_back({"stoker_pipeline", n, [&job, n](bool deep, std::vector<Pools>& pools) {
                              return run_pipeline(job, n, ResizeAt::collate, deep, pools);
                            }});
    if (wanted("stoker_pipeline_resize_in_map"))
      contenders.push_back({"stoker_pipeline_resize_in_map", n, [&job, n](bool deep, std::vector<Pools>& pools) {
                              return run_pipeline(job, n, ResizeAt::map, deep, pools);
                            }});
    if (wanted("tight_loop"))
      contenders.push_back({"tight_loop", n, [&job, n](bool deep, std::vector<Pools>& pools) {
                              return run_tight_loop(job, n, deep, pools);
                            }});
    if (remote_run)
      contenders.push_back({"stoker_pipeline_remote", n, [&remote, n](bool deep, std::vector<Pools>& pools) {
                              return run_pipeline(remote, n, ResizeAt::collate, deep, pools);
                            }});
    if (cached_run)
      contenders.push_back({"stoker_pipeline_cached", n, [&cached, n](bool deep, std::vector<Pools>& pools) {
                              return run_pipeline(cached, n, ResizeAt::collate, deep, pools);
                            }});
    if (mix_run)
      contenders.push_back({"stoker_pipeline_mix", n, [&mixed, n](bool deep, std::vector<Pools>& pools) {
                              return run_pipeline(mixed, n, ResizeAt::collate, deep, pools);
                            }});
    if (torchvision) contenders.push_back({"torchvision_dataloader", n, nullptr});
    if (python_loader) contenders.push_back({"stoker_python_loader", n, nullptr});
  }
  if (contenders.empty()) throw std::invalid_argument("images: no contender to run");

  // An untimed round, which also checks that the pipeline and the loop make the very same crops.
  std::uint64_t content = 0;
  bool have_content = false;
  double fetching_rate = 0;  // the cached contender's first epoch, which fills its cache
  for (Contender& c : contenders) {
    if (!c.run) continue;
    const Confined cores(c.threads);
    const RunResult r = c.run(true, c.pools);
    if (c.name == "stoker_pipeline_cached" && fetching_rate == 0)
      fetching_rate = static_cast<double>(r.tally.images) / r.seconds;
    if (!r.tally.same_items(job.expected))
      throw std::runtime_error("images: " + c.name + " on " + std::to_string(c.threads) + " threads delivered " +
                               std::to_string(r.tally.images) + " of " + std::to_string(job.expected.images) +
                               " images in " + std::to_string(r.tally.batches) + " batches, or other ones");
    if (have_content && r.tally.content != content)
      throw std::runtime_error("images: " + c.name + " on " + std::to_string(c.threads) +
                               " threads made other crops than the first contender (checksums differ)");
    content = r.tally.content;
    have_content = true;
  }
  std::cerr << "images: warm-up done; the pipeline and the loop made the same " << job.expected.images
            << " crops, bit for bit\n";

  const bool peak_resets = reset_peak_rss();
  for (int rep = 0; rep < common.repeats; ++rep) {
    std::cerr << "images: repeat " << rep + 1 << "/" << common.repeats << "\n";
    for (std::size_t k = 0; k < contenders.size(); ++k) {  // rotated: slow phases hit all alike
      Contender& c = contenders[(k + static_cast<std::size_t>(rep)) % contenders.size()];
      const Confined cores(c.threads);
      if (!c.run) {
        c.rates.push_back(run_python(opt, c.name == "stoker_python_loader" ? "stoker" : "torchvision", c.threads));
        continue;
      }
      if (opt.cold) c.pools.clear();
      reset_peak_rss();
      const double before = status_kib("VmRSS:") / 1024;
      RunResult r = c.run(false, c.pools);
      if (!r.tally.same_items(job.expected))
        throw std::runtime_error("images: " + c.name + " lost or repeated images in repeat " + std::to_string(rep + 1));
      r.rss_before_mib = before;
      r.peak_rss_mib = status_kib("VmHWM:") / 1024;
      c.rates.push_back(static_cast<double>(job.expected.images) / r.seconds);
      c.cpu_ms.push_back(r.cpu_seconds * 1e3 / static_cast<double>(job.expected.images));
      c.rss_growth_mib.push_back(r.peak_rss_mib - before);
      c.last = std::move(r);
    }
  }
  const double cached_after = resident_fraction(files);

  // Results, then the ratios at each N.
  const auto find = [&](const std::string& name, int n) -> const Contender* {
    for (const Contender& c : contenders)
      if (c.name == name && c.threads == n) return &c;
    return nullptr;
  };
  const auto samples_text = [](const std::vector<double>& v) {
    std::string s;
    for (double x : v) s += (s.empty() ? "" : " ") + fixed(x, 1);
    return s;
  };
  std::cout << "\nimages/s, median (min-max) of " << common.repeats
            << " repeats of one epoch; CPU ms per image (process-wide); every repeat\n\n";
  Json results = Json::array();
  for (const Contender& c : contenders) {
    const Spread s = spread(c.rates);
    std::cout << "  " << std::left << std::setw(24) << c.name << std::right << " N=" << std::setw(2) << c.threads
              << "  " << std::setw(8) << fixed(s.median, 1) << " (" << fixed(s.min, 1) << "-" << fixed(s.max, 1) << ")";
    if (!c.cpu_ms.empty()) std::cout << "  " << fixed(spread(c.cpu_ms).median, 2) << " ms";
    std::cout << "  [" << samples_text(c.rates) << "]\n";
    Json entry = {{"name", c.name},
                  {"threads", c.threads},
                  {"images_per_s_median", s.median},
                  {"images_per_s_min", s.min},
                  {"images_per_s_max", s.max},
                  {"samples", c.rates}};
    if (!c.cpu_ms.empty()) entry["cpu_ms_per_image_median"] = spread(c.cpu_ms).median;
    if (!c.rss_growth_mib.empty() && peak_resets) {
      entry["peak_rss_growth_mib_max"] = *std::max_element(c.rss_growth_mib.begin(), c.rss_growth_mib.end());
      entry["peak_rss_mib_last"] = c.last.peak_rss_mib;
    }
    if (c.name.starts_with("stoker_pipeline")) {
      const ResizeAt at = c.name == "stoker_pipeline" ? ResizeAt::collate : ResizeAt::map;
      const PipelineLayout l = layout_for(c.threads, at);
      entry["layout"] = {{"decode_threads", l.decode_threads}, {"collate_threads", l.collate_threads},
                         {"read_queue", l.read_queue},         {"crop_queue", l.crop_queue},
                         {"batch_queue", l.batch_queue},       {"collate_queue", l.collate_queue}};
      entry["memory_bound_mib"] = job.bound_bytes(l, at) / kMiB;
    }
    results.push_back(std::move(entry));
  }
  Json ratios = Json::array(), vs_tight = Json::object(), vs_torch = Json::object(), loader_vs_torch = Json::object(),
       loader_vs_pipeline = Json::object(), remote_vs_local = Json::object(), mix_vs_single = Json::object(),
       cached_vs_local = Json::object();
  std::cout << "\n";
  for (int n : thread_counts) {
    const Contender *p = find("stoker_pipeline", n), *t = find("tight_loop", n), *v = find("torchvision_dataloader", n),
                    *m = find("stoker_pipeline_resize_in_map", n), *l = find("stoker_python_loader", n),
                    *u = find("stoker_pipeline_remote", n), *x = find("stoker_pipeline_mix", n);
    if (!p) continue;
    Json r = {{"threads", n}};
    const double pm = spread(p->rates).median;
    std::cout << "  N=" << n << ":";
    if (t) {
      const double q = pm / spread(t->rates).median;
      r["stoker_over_tight_loop"] = q;
      vs_tight[std::to_string(n)] = q;
      std::cout << "  stoker / tight loop " << fixed(q, 3) << " (goal >= 0.9)";
      if (m) {
        r["resize_in_map_over_tight_loop"] = spread(m->rates).median / spread(t->rates).median;
        std::cout << "  resizing in the map stage " << fixed(r["resize_in_map_over_tight_loop"].get<double>(), 3);
      }
    }
    if (u) {
      const double q = spread(u->rates).median / pm;
      r["remote_over_local"] = remote_vs_local[std::to_string(n)] = q;
      std::cout << "  from --remote / from --data " << fixed(q, 3) << " (goal >= 0.9)";
    }
    if (const Contender* c = find("stoker_pipeline_cached", n)) {
      const double q = spread(c->rates).median / pm;
      r["cached_over_local"] = cached_vs_local[std::to_string(n)] = q;
      std::cout << "  from the cache / from --data " << fixed(q, 3) << " (goal >= 0.95)";
    }
    if (x) {
      const double q = spread(x->rates).median / pm;
      r["mix_over_single"] = mix_vs_single[std::to_string(n)] = q;
      std::cout << "  the halves' mixture / one source " << fixed(q, 3) << " (goal >= 0.95)";
    }
    if (v) {
      const double q = pm / spread(v->rates).median;
      r["stoker_over_torchvision"] = q;
      vs_torch[std::to_string(n)] = q;
      std::cout << "  stoker / torchvision DataLoader " << fixed(q, 2) << " (goal >= 3)";
    }
    if (l) {
      const double lm = spread(l->rates).median;
      r["python_loader_over_stoker_pipeline"] = loader_vs_pipeline[std::to_string(n)] = lm / pm;
      std::cout << "\n        stoker.ImageLoader / the C++ pipeline " << fixed(lm / pm, 3) << " (goal >= 0.9)";
      if (v) {
        r["python_loader_over_torchvision"] = loader_vs_torch[std::to_string(n)] = lm / spread(v->rates).median;
        std::cout << "  stoker.ImageLoader / torchvision DataLoader " << fixed(lm / spread(v->rates).median, 2)
                  << " (goal >= 3)";
      }
    }
    std::cout << "\n";
    ratios.push_back(std::move(r));
  }
  const Contender* last_pipeline = nullptr;
  for (const Contender& c : contenders)
    if (c.name == "stoker_pipeline") last_pipeline = &c;
  if (last_pipeline) {
    std::cout << "\nlast run of the stoker pipeline on " << last_pipeline->threads << " threads:\n";
    print_summary(std::cout, last_pipeline->last.summary);
  }
  if (remote_run) {
    const RemoteCounts c = remote.data->remote_counts();
    std::cout << "remote reads: " << c.requests << " requests, " << c.retries << " retries; at most "
              << c.peak_bytes_in_flight << " bytes in flight at once (RemoteOptions::max_bytes_in_flight "
              << RemoteOptions{}.max_bytes_in_flight << ")\n";
  }
  Json cache_json;
  if (cached_run) {
    const RemoteCounts c = cached.data->remote_counts();
    const std::uint64_t held = cache_folder->bytes();
    std::cout << "shard cache: epoch 1 (fetching every shard) " << fixed(fetching_rate, 1) << " images/s; "
              << c.cache_fetches << " fetches, " << c.cache_hits << " reads of copies, " << c.cache_evictions
              << " evictions; the folder holds " << held << " bytes of its budget of " << cache_budget << "\n";
    if (held > cache_budget) throw std::runtime_error("images: the cache holds more than its budget");
    cache_json = {{"epoch1_images_per_s", fetching_rate}, {"fetches", c.cache_fetches}, {"hits", c.cache_hits},
                  {"evictions", c.cache_evictions},       {"bytes_held", held},         {"budget", cache_budget}};
  }
  std::cout << "page cache: " << fixed(100 * cached_before, 1) << "% of the files' pages resident before the runs, "
            << fixed(100 * cached_after, 1) << "% after\n";

  Json out;
  out["config"] = {
      {"data", opt.data},
      {"images", data->size()},
      {"files", files.size()},
      {"threads", thread_counts},
      {"size", opt.size},
      {"batch", opt.batch},
      {"seed", opt.seed},
      {"repeats", common.repeats},
      {"max_file_bytes", job.max_file_bytes},
      {"max_image_pixels", job.max_image_pixels},
      {"figure", "images / seconds for one epoch, files read from the page cache; median over repeats"},
      {"stoker_pipeline",
       "ImageSource (pread into a recycled buffer) -> DecodeCropWindow map on N threads (header, window drawn by "
       "RandomResizedCrop::plan, decode_window at the smallest DCT scale keeping it >= size) -> batch -> Collate on "
       "N threads resizing each window straight into the batch (apply_into with mirror and normalization, planar "
       "float32); pipeline .threads(N)"},
      {"stoker_pipeline_resize_in_map",
       "the same with DecodeResizedCrop in the map stage (the crop resized there into a float32 sample) and Collate "
       "copying the crops into the batch, on ceil(N/8) threads"},
      {"tight_loop",
       "N std::threads taking the epoch's images (ImageSource's order) by an atomic counter; each reads the file "
       "with ImageDataset::read into a pool of its own and writes the crop with DecodeResizedCrop::decode_into "
       "straight into its slot of a ring of 2 batches; the thread filling a batch's last slot delivers it"},
      {"stoker_pipeline_remote",
       "stoker_pipeline on the same shards read from --remote (one range request per image and per label; the "
       "server's own page cache holds them)"},
      {"stoker_pipeline_cached",
       "stoker_pipeline on the shards of --remote through RemoteOptions::cache_dir (a folder made under --cache, "
       "with room for them all): the untimed round fetches each shard whole, the timed rounds read the copies"},
      {"stoker_pipeline_mix",
       "stoker_pipeline reading the data set as MixedImageSource of its two halves (weights by their sizes, "
       "MixStop::all_exhausted: every image once)"},
      {"same_output", "the pipelines and the loop make the same crops, bit for bit (checked in an untimed round)"},
      {"page_cache", "every file read once before the runs; mincore() of each file says how much stayed cached"},
      {"pools", opt.cold ? "cold: every run starts with empty buffer pools"
                         : "warm: each contender keeps its buffer pools from run to run, as epochs do"}};
  if (torchvision) out["config"]["torchvision"] = opt.torchvision;
  out["results"] = std::move(results);
  out["ratios"] = std::move(ratios);
  out["ratio"] = {{"stoker_over_tight_loop", vs_tight}, {"goal_vs_tight_loop", 0.9}};
  if (torchvision) {
    out["ratio"]["stoker_over_torchvision"] = vs_torch;
    out["ratio"]["goal_vs_torchvision"] = 3.0;
  }
  if (python_loader) {
    out["ratio"]["python_loader_over_stoker_pipeline"] = loader_vs_pipeline;
    out["ratio"]["goal_python_loader_vs_stoker_pipeline"] = 0.9;
    if (torchvision) out["ratio"]["python_loader_over_torchvision"] = loader_vs_torch;
  }
  if (!mix_vs_single.empty()) {
    out["ratio"]["mix_over_single"] = mix_vs_single;
    out["ratio"]["goal_mix_over_single"] = 0.95;
  }
  if (!remote_vs_local.empty()) {
    out["ratio"]["remote_over_local"] = remote_vs_local;
    out["ratio"]["goal_remote_over_local"] = 0.9;
  }
  if (!cached_vs_local.empty()) {
    out["ratio"]["cached_over_local"] = cached_vs_local;
    out["ratio"]["goal_cached_over_local"] = 0.95;
    out["cache"] = cache_json;
  }
  out["config"]["pin_memory"] = opt.pin_memory;
  out["page_cache"] = {{"resident_before_runs", cached_before}, {"resident_after_runs", cached_after}};
  out["memory"] = {{"peak_rss_per_run", peak_resets},
                   {"process_peak_rss_mib", status_kib("VmHWM:") / 1024},
                   {"bound",
                    "files (2 read_queue + N) x max_file_bytes + windows N x max_image_pixels x 3 + crops "
                    "(crop_queue + N + batch x (1 + batch_queue + collate_threads)) x crop bytes + batches "
                    "(collate_queue + collate_threads + 1) x batch bytes + 2 x 32 MiB of idle pool memory"}};
  if (remote_run)
    out["remote"] = {{"requests", remote.data->remote_counts().requests},
                     {"peak_bytes_in_flight", remote.data->remote_counts().peak_bytes_in_flight},
                     {"max_bytes_in_flight", RemoteOptions{}.max_bytes_in_flight}};
  out["verified"] = {{"images_per_run", job.expected.images}, {"same_crops_in_pipeline_and_loop", have_content}};
  if (last_pipeline) out["pipeline_stages"] = stage_table(last_pipeline->last.summary);
  return out;
}

}  // namespace

SuiteRun setup_images(CLI::App& command) {
  auto o = std::make_shared<ImagesOptions>();
  command.add_option("--data", o->data, "A list file, class folder or .tar of JPEGs (stoker-make-data imagenet)")
      ->required();
  command
      .add_option("--remote", o->remote,
                  "The same shards as --data at a URL (http://, https://, s3://; braces as WebDataset writes "
                  "them): adds the contender stoker_pipeline_remote, the stoker pipeline reading them there")
      ->type_name("URL");
  command
      .add_option("--cache", o->cache,
                  "With --remote: adds the contender stoker_pipeline_cached, the stoker pipeline reading the shards "
                  "of --remote through a cache on the local disk, in a folder made (and removed) under DIR")
      ->type_name("DIR");
  command.add_flag("--mix", o->mix,
                   "Adds the contender stoker_pipeline_mix: the stoker pipeline reading the data set as a mixture "
                   "of its two halves (MixedImageSource), the same images once each");
  command
      .add_option("--threads", o->threads,
                  "Thread counts to run at, e.g. 1,2,4,8,16 (default: 1, 2, 4, ... up to the cores, and the cores)")
      ->delimiter(',')
      ->check(apps::in_range(1, 256));
  command.add_option("--images", o->images, "Use the first N images of the data set (0: all)")->capture_default_str();
  command.add_option("--size", o->size, "The crops' side")->check(apps::in_range(1u, 4096u))->capture_default_str();
  command.add_option("--batch", o->batch, "Images per batch")
      ->check(apps::in_range<std::size_t>(1, 1 << 16))
      ->capture_default_str();
  command.add_option("--seed", o->seed, "Seed of the epoch's order, the crops and the mirrors")->capture_default_str();
  command
      .add_option("--torchvision", o->torchvision,
                  "Also run this script (apps/stoker-bench/torchvision_images.py) on N DataLoader workers for each N, "
                  "in the same rotation")
      ->type_name("SCRIPT");
  command.add_option("--python", o->python, "The Python that runs --torchvision (Debian's, with python3-torchvision)")
      ->capture_default_str();
  command.add_flag("--python-loader", o->python_loader,
                   "Also run the --torchvision script with --loader stoker: stoker.ImageLoader from Python, on N "
                   "threads, in the same rotation (stoker must be on the PYTHONPATH)");
  command.add_flag("--pin-memory", o->pin_memory, "pin_memory=True for the Python loaders (nothing without a GPU)");
  command.add_flag("--cold", o->cold,
                   "Start every run with empty buffer pools, as a first epoch does (default: each contender keeps "
                   "its pools from run to run, as later epochs do); for the peak RSS of one run");
  command
      .add_option("--only", o->only,
                  "Run only these contenders (stoker_pipeline, tight_loop, torchvision_dataloader, "
                  "stoker_python_loader), e.g. to measure "
                  "one's peak RSS with /usr/bin/time -v")
      ->delimiter(',');
  return [o](const CommonOptions& common) { return run_images(*o, common); };
}

}  // namespace stoker::bench
