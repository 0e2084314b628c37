// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "augment_crop.h"  // the kernels' own entry point (private to gpu/)
#include "gpu/stream_tools.h"
#include "stoker/core/pipeline.h"
#include "stoker/gpu/augment.h"
#include "support.h"
#include "cuda_cases.h"

using namespace stoker;
using namespace std::chrono_literals;
using gpu::DeviceBatch;
using gpu::GpuAugment;
using gpu::GpuAugmentOptions;
using test::devices;

namespace {

const Normalization kFashion{.scale = 255, .mean = {0.2860f}, .std = {0.3530f}};

std::shared_ptr<BufferPool> pool() {
  static const auto p = BufferPool::create();
  return p;
}

// Image `id` of a made-up data set: the same for the same (shape, dtype, id), labelled with
// its id so that the crops of one image can be recognised.
Sample make_image(Shape shape, DType dtype, std::uint64_t id, std::uint64_t salt = 0) {
  Sample s(*pool(), shape, dtype, static_cast<std::int32_t>(id), id);
  Rng rng(derive_seed(salt, id));
  switch (dtype) {
    case DType::u8:
      for (auto& v : s.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
      break;
    case DType::u16:
      for (auto& v : s.as<std::uint16_t>()) v = static_cast<std::uint16_t>(rng());
      break;
    case DType::f32:
      for (auto& v : s.as<float>()) v = static_cast<float>(rng() >> 40) / 16384.0f - 300.0f;
      break;
  }
  return s;
}

// A data set of `images` images, cut into input batches of `per_batch`.
struct Images {
  Shape shape{1, 1, 28, 28, false};
  DType dtype = DType::u8;
  std::uint64_t images = 100;
  std::size_t per_batch = 16;

  std::size_t batches() const { return (images + per_batch - 1) / per_batch; }
  std::vector<Sample> batch(std::size_t k) const {
    std::vector<Sample> out;
    for (std::uint64_t id = k * per_batch; id < std::min<std::uint64_t>(images, (k + 1) * per_batch); ++id)
      out.push_back(make_image(shape, dtype, id));
    return out;
  }
  // A pipeline source of the same images, one at a time.
  auto source() const {
    return [*this, next = std::uint64_t{0}]() mutable -> std::optional<Sample> {
      if (next == images) {
        next = 0;
        return std::nullopt;
      }
      return make_image(shape, dtype, next++);
    };
  }
};

// A crop, as bytes that compare bit for bit: its label, its values, then its id (Sample::id,
// DeviceBatch::host_ids).
std::string key(std::int32_t label, std::span<const float> values, std::uint64_t id = 0) {
  std::string k(sizeof label + values.size_bytes() + sizeof id, '\0');
  std::memcpy(k.data(), &label, sizeof label);
  if (!values.empty()) std::memcpy(k.data() + sizeof label, values.data(), values.size_bytes());
  std::memcpy(k.data() + sizeof label + values.size_bytes(), &id, sizeof id);
  return k;
}
std::int32_t label_of(const std::string& k) {
  std::int32_t label = 0;
  std::memcpy(&label, k.data(), sizeof label);
  return label;
}

using Minibatches = std::vector<std::vector<std::string>>;

// Reads minibatches back to the host, after the device has built them. On the CPU backend the
// device's memory is the host's: no copy. On CUDA, one counted copy per minibatch.
class ReadBack {
 public:
  explicit ReadBack(gpu::Device& device) : device_(device), stream_(device.make_stream()) {}

  std::vector<std::string> operator()(const DeviceBatch& b) {
    REQUIRE(b.dtype == DType::f32);
    const auto labels_at = static_cast<std::size_t>(reinterpret_cast<const std::byte*>(b.labels()) -
                                                    static_cast<const std::byte*>(b.data()));
    std::vector<std::byte> host(labels_at + b.count * sizeof(std::int32_t));
    if (device_.backend() == gpu::Backend::cpu) {
      b.ready().synchronize();
      std::memcpy(host.data(), b.data(), host.size());
    } else {
      stream_->wait(b.ready());
      stream_->copy_to_host(host.data(), b.data(), host.size());
      stream_->synchronize();
      ++copies;
    }
    const std::size_t n = b.sample_elements();
    const auto* values = reinterpret_cast<const float*>(host.data());
    const auto* labels = reinterpret_cast<const std::int32_t*>(host.data() + labels_at);
    std::vector<std::string> crops;
    for (std::size_t i = 0; i < b.count; ++i) {
      CHECK(labels[i] == b.host_labels.at(i));
      crops.push_back(key(labels[i], {values + i * n, n}, b.host_ids.at(i)));
    }
    return crops;
  }
  std::uint64_t copies = 0;  ///< device-to-host copies made here

 private:
  gpu::Device& device_;
  std::unique_ptr<gpu::Stream> stream_;
};

// What GpuAugment must give for one epoch: RandomCrops' fused crops on the CPU, through a
// RandomShuffleQueue of the same capacity, min_after_dequeue and per-epoch seed, a minibatch
// taken as soon as one can be, the rest drained at the end.
Minibatches expected(const Images& data, const GpuAugmentOptions& o, StageContext ctx) {
  const RandomCrops crops(o.crops);
  RandomShuffleQueue<std::string> window(
      "expected",
      {o.shuffle.capacity, o.shuffle.min_after_dequeue,
       derive_seed(o.shuffle.seed.value_or(derive_seed(ctx.seed, hash_name("gpu_augment window"))), ctx.epoch)});
  Minibatches out;
  for (std::size_t k = 0; k < data.batches(); ++k)
    for (const Sample& image : data.batch(k))
      for (const Sample& c : crops.apply(image, ctx)) {
        REQUIRE(window.try_push(key(c.label, c.as<float>(), c.id)));
        std::vector<std::string> m;
        if (window.try_pop_many(m, o.batch_size, false) != 0) out.push_back(std::move(m));
      }
  window.close();
  for (std::vector<std::string> m; window.try_pop_many(m, o.batch_size, true) != 0; m.clear()) out.push_back(m);
  if (o.drop_remainder && !out.empty() && out.back().size() < o.batch_size) out.pop_back();
  return out;
}

// One epoch through `augment` without a pipeline, each minibatch read back as it comes.
Minibatches run_epoch(GpuAugment& augment, const Images& data, StageContext ctx, ReadBack& read) {
  Minibatches out;
  std::vector<DeviceBatch> emitted;
  Emitter<DeviceBatch> emit(emitted);
  const auto collect = [&] {
    for (auto& b : emitted) out.push_back(read(b));
    emitted.clear();  // the buffers go back to their pool
  };
  for (std::size_t k = 0; k < data.batches(); ++k) {
    augment(data.batch(k), emit, ctx);
    collect();
  }
  augment.end_epoch(emit, ctx);
  collect();
  return out;
}

// The share of crops that travel in a minibatch with another crop of their image: near 1 for
// crops batched in the order they were cut, small when they are well shuffled.
double together(const Minibatches& minibatches) {
  std::size_t crops = 0, with_sibling = 0;
  for (const auto& m : minibatches) {
    std::map<std::int32_t, int> per_image;
    for (const auto& c : m) ++per_image[label_of(c)];
    for (const auto& [image, n] : per_image) with_sibling += n > 1 ? static_cast<std::size_t>(n) : 0;
    crops += m.size();
  }
  return crops ? static_cast<double>(with_sibling) / static_cast<double>(crops) : 0.0;
}

std::size_t total(const Minibatches& m) {
  std::size_t n = 0;
  for (const auto& b : m) n += b.size();
  return n;
}

// Crops of 0 to `most` per image, as a count_of: some images give none.
CropCount varying(int most) {
  return [most](const Sample&, Rng& rng) { return static_cast<int>(rng.below(static_cast<std::uint64_t>(most) + 1)); };
}

GpuAugmentOptions fashion_options(std::size_t max_images = 64) {
  return {.crops = {.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion},
          .batch_size = 32,
          .shuffle = {.capacity = 400, .min_after_dequeue = 300, .seed = 11},
          .image = Shape{1, 1, 28, 28, false},
          .max_images = max_images};
}

// `epochs` epochs of a pipeline of seed `seed`, each read back and compared with what RandomCrops
// and a host shuffle give; returns the crops read.
std::size_t check_pipeline(Pipeline<DeviceBatch>& pipe, ReadBack& read, const Images& data, const GpuAugmentOptions& o,
                           std::uint64_t seed, std::uint32_t epochs) {
  std::size_t crops = 0;
  for (std::uint32_t e = 0; e < epochs; ++e) {
    Minibatches got;
    for (auto& b : pipe.epoch()) got.push_back(read(b));
    CHECK(got == expected(data, o, {seed, e}));
    crops += total(got);
  }
  return crops;
}

void check_epochs(gpu::Device& device, GpuAugment& augment, const Images& data, std::uint64_t seed, int epochs) {
  ReadBack read(device);
  for (std::uint32_t e = 0; e < static_cast<std::uint32_t>(epochs); ++e) {
    const StageContext ctx{seed, e};
    const Minibatches got = run_epoch(augment, data, ctx, read);
    const Minibatches want = expected(data, augment.options(), ctx);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
    CHECK(augment.held() == 0);
  }
}

}  // namespace

TEST_SUITE("GpuAugment on the CPU backend") {
  TEST_CASE("2D crops with mirror equal RandomCrops' fused output bit for bit, in the shuffle queue's order" *
            doctest::timeout(60)) {
    auto device = gpu::Device::open("cpu");
    GpuAugment augment(device, fashion_options());
    check_epochs(*device, augment, {.images = 150, .per_batch = 16}, 5, 2);
  }

  TEST_CASE("a count that varies per image, a short last input batch and a dropped remainder" * doctest::timeout(60)) {
    auto device = gpu::Device::open("cpu");
    auto o = fashion_options();
    o.crops.count = 7;
    o.crops.count_of = varying(7);
    o.drop_remainder = true;
    GpuAugment augment(device, o);
    check_epochs(*device, augment, {.images = 101, .per_batch = 10}, 9, 2);
  }

  TEST_CASE("3D crops of uint16 and float32 volumes, per-channel normalization, mirrored along depth" *
            doctest::timeout(60)) {
    auto device = gpu::Device::open("cpu");
    for (DType dtype : {DType::u16, DType::f32}) {
      CAPTURE(dtype_name(dtype));
      GpuAugmentOptions o{
          .crops = {.size = {4, 6, 8},
                    .count = 3,
                    .count_of = varying(3),
                    .mirror = MirrorOptions{.axis = Axis::depth},
                    .normalize = Normalization{.scale = 3.0f, .mean = {0.5f, -1.25f}, .std = {0.2f, 7.0f}}},
          .batch_size = 8,
          .shuffle = {.capacity = 40, .min_after_dequeue = 20, .seed = 3},
          .image = Shape{2, 7, 9, 11, true},
          .dtype = dtype,
          .max_images = 4};
      GpuAugment augment(device, o);
      check_epochs(*device, augment, {.shape = {2, 7, 9, 11, true}, .dtype = dtype, .images = 30, .per_batch = 4}, 1,
                   1);
    }
  }

  TEST_CASE("without normalize, crops are cast to float32" * doctest::timeout(30)) {
    auto device = gpu::Device::open("cpu");
    auto o = fashion_options();
    o.crops.normalize.reset();
    o.crops.mirror = MirrorOptions{.axis = Axis::height, .p = 1.0};
    GpuAugment augment(device, o);
    ReadBack read(*device);
    const Images data{.images = 20, .per_batch = 20};
    const Minibatches got = run_epoch(augment, data, {}, read);
    o.crops.normalize = Normalization{};  // the identity: what the cast gives
    CHECK(got == expected(data, o, {}));
  }

  TEST_CASE("in a pipeline: each crop once per epoch, crops of one image spread out, one copy per input batch" *
            doctest::timeout(120)) {
    auto device = gpu::Device::open("cpu");
    const auto o = fashion_options();
    GpuAugment augment(device, o);
    const Images data{.images = 400, .per_batch = 50};
    for (bool deterministic : {false, true}) {
      CAPTURE(deterministic);
      const auto before = device->transfers();
      // Collated into the pinned staging buffers by a stage of their own, on two threads.
      auto pipe = PipelineBuilder{}
                      .threads(3)
                      .seed(21)
                      .epochs(2)
                      .deterministic(deterministic)
                      .source("read", data.source())
                      .batch("images", data.per_batch)
                      .map("collate", Collate{.pool = augment.staging()}, {.threads = 2, .queue = 2})
                      .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 2})
                      .build();
      ReadBack read(*device);
      for (std::uint32_t e = 0; e < 2; ++e) {
        Minibatches got;
        for (auto& b : pipe.epoch()) got.push_back(read(b));
        const Minibatches want = expected(data, o, {21, e});
        if (deterministic) {
          CHECK(got == want);
        } else {  // images may reach the batcher in another order: the same crops, reshuffled
          const auto sorted = [](const Minibatches& m) {
            std::vector<std::string> all;
            for (const auto& b : m) all.insert(all.end(), b.begin(), b.end());
            std::sort(all.begin(), all.end());
            return all;
          };
          CHECK(sorted(got) == sorted(want));
        }
        CHECK(total(got) == data.images * 5);
        // Only the epoch's last minibatch may be short (without .deterministic() it may overtake
        // others: queues keep order per producing thread only).
        CHECK(std::count_if(got.begin(), got.end(), [&](auto& m) { return m.size() != o.batch_size; }) <= 1);

        // Crops batched in the order they were cut travel with their siblings; shuffled, few do.
        Minibatches in_cut_order(1);
        for (std::uint64_t image = 0; image < data.images; ++image)
          for (int k = 0; k < 5; ++k) {
            if (in_cut_order.back().size() == o.batch_size) in_cut_order.emplace_back();
            in_cut_order.back().push_back(key(static_cast<std::int32_t>(image), {}));
          }
        CHECK(together(in_cut_order) > 0.9);
        CHECK(together(got) < 0.4);
      }
      const auto after = device->transfers();
      // One copy per input batch, and one of the gather slots of each epoch's drain.
      CHECK(after.h2d_copies - before.h2d_copies == 2 * (data.batches() + 1));
      CHECK(after.d2h_copies == read.copies);
      CHECK(after.d2h_copies == 0);
    }
  }

  TEST_CASE("destroying the pipeline mid-epoch with minibatches in flight returns" * doctest::timeout(60)) {
    auto device = gpu::Device::open("cpu");
    auto o = fashion_options(20);
    o.batch_size = 16;
    o.shuffle = {.capacity = 100, .min_after_dequeue = 50, .seed = 1};
    o.output_buffers = 8;  // (20 images x 5 crops + 15) / 16: the least one call may need
    GpuAugment augment(device, o);
    std::vector<DeviceBatch> held;
    {
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .source("read", Images{.images = 100000, .per_batch = 20}.source())
                      .batch("images", 20)
                      .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 2})
                      .build();
      // Holding minibatches starves the pool of buffers: the stage ends up waiting for one.
      // (Holding more than output_buffers less what one call needs would wait forever.)
      for (int i = 0; i < 2; ++i) held.push_back(*pipe.next());
      std::this_thread::sleep_for(50ms);
    }
    for (auto& b : held) CHECK(b.ready().done());
    held.clear();
    CHECK(device->transfers().d2h_copies == 0);
  }

  TEST_CASE("a bad input fails the stage, naming it" * doctest::timeout(30)) {
    auto device = gpu::Device::open("cpu");
    GpuAugment augment(device, fashion_options());
    std::vector<DeviceBatch> out;
    Emitter<DeviceBatch> emit(out);
    augment(Images{.images = 4, .per_batch = 4}.batch(0), emit, {});
    std::vector<Sample> other;
    other.push_back(make_image({1, 1, 30, 30, false}, DType::u8, 0));
    CHECK_THROWS_WITH_AS(augment(std::move(other), emit, {}), doctest::Contains("1x30x30"), std::invalid_argument);
    CHECK(augment.held() == 0);  // a failed call leaves an empty window, not stale books

    std::vector<std::uint64_t> indices{1, 2};
    CHECK_THROWS_AS(augment(indices, emit, {}), std::invalid_argument);
  }

  TEST_CASE("options are checked" * doctest::timeout(30)) {
    auto device = gpu::Device::open("cpu");
    auto o = fashion_options();
    CHECK_THROWS_AS(GpuAugment(nullptr, o), std::invalid_argument);
    o.shuffle = {.capacity = 100, .min_after_dequeue = 90, .seed = 0};
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("shuffle.capacity"), std::invalid_argument);
    o = fashion_options();
    o.batch_size = 0;
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("batch_size"), std::invalid_argument);
    o = fashion_options();
    o.crops.count = 0;
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("count"), std::invalid_argument);

    o = fashion_options();
    o.output_buffers = 2;                          // 64 images x 5 crops make 10 minibatches of 32
    CHECK(GpuAugment::buffers_per_call(o) == 11);  // and the drain up to (300 + 31) / 32
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("output_buffers"), std::invalid_argument);
    o = fashion_options(0);
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("max_images"), std::invalid_argument);
    o = fashion_options();
    o.image.reset();
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("option image"), std::invalid_argument);
    o = fashion_options();
    o.image = Shape{1, 1, 20, 28, false};
    CHECK_THROWS_WITH_AS(GpuAugment(device, o), doctest::Contains("20"),
                         std::invalid_argument);  // the crop does not fit
  }

  TEST_CASE("a batch must be collated into the staging buffers, of the images' shape" * doctest::timeout(30)) {
    auto device = gpu::Device::open("cpu");
    GpuAugment augment(device, fashion_options(8));
    std::vector<DeviceBatch> out;
    Emitter<DeviceBatch> emit(out);
    const Images data{.images = 8, .per_batch = 8};
    CHECK_THROWS_WITH_AS(augment(make_batch(data.batch(0), *pool()), emit, {}), doctest::Contains("staging()"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(augment(Images{.images = 9, .per_batch = 9}.batch(0), emit, {}),
                         doctest::Contains("max_images is 8"), std::invalid_argument);
    augment(make_batch(data.batch(0), *augment.staging()), emit, {});
    CHECK(augment.held() == 8 * 5 - out.size() * 32);
  }
}

namespace {

// A CPU-backend device whose kernels (host tasks on the CPU backend) wait at a gate until it
// opens, while its copies run: a stream whose kernels still read a buffer after another stream
// has passed the copy into it.
class HeldKernels final : public gpu::Device {
 public:
  HeldKernels() : gate_(*inner_) {}
  ~HeldKernels() override { gate_.open(); }

  void open() { gate_.open(); }
  gpu::TransferCounts copies() const { return inner_->transfers(); }

  gpu::Backend backend() const noexcept override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  int ordinal() const noexcept override { return inner_->ordinal(); }
  std::unique_ptr<gpu::Stream> make_stream() override {
    return std::make_unique<HeldStream>(inner_->make_stream(), gate_);
  }
  std::shared_ptr<gpu::Stream> borrow_stream(std::uintptr_t native) override { return inner_->borrow_stream(native); }
  using gpu::Device::make_event;
  std::unique_ptr<gpu::Event> make_event(gpu::HostWait wait) override { return inner_->make_event(wait); }
  gpu::Memory allocate(std::size_t bytes) override { return inner_->allocate(bytes); }
  gpu::Memory allocate_pinned(std::size_t bytes) override { return inner_->allocate_pinned(bytes); }
  std::size_t free_memory() const override { return inner_->free_memory(); }

 private:
  class HeldStream final : public gpu::Stream {
   public:
    HeldStream(std::unique_ptr<gpu::Stream> inner, test::StreamGate& gate) : inner_(std::move(inner)), gate_(gate) {}
    void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
      inner_->copy_to_device(dst, src, bytes);
    }
    void copy_to_host(void* dst, const void* src, std::size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
    void copy_on_device(void* dst, const void* src, std::size_t bytes) override {
      inner_->copy_on_device(dst, src, bytes);
    }
    void record(gpu::Event& event) override { inner_->record(event); }
    void wait(gpu::Event& event) override { inner_->wait(event); }
    void host_task(std::function<void()> fn) override {
      gate_.hold(*inner_);
      inner_->host_task(std::move(fn));
    }
    void synchronize() override { inner_->synchronize(); }
    void check() override { inner_->check(); }
    void* native_handle() noexcept override { return nullptr; }

   private:
    std::unique_ptr<gpu::Stream> inner_;
    test::StreamGate& gate_;
  };

  std::shared_ptr<gpu::Device> inner_ = gpu::Device::open("cpu");
  test::StreamGate gate_;
};

}  // namespace

TEST_CASE("a call that stops while emitting gives its staging slot back only after the kernels that read it" *
          doctest::timeout(60)) {
  auto device = std::make_shared<HeldKernels>();
  auto o = fashion_options(20);
  o.batch_size = 16;
  o.shuffle = {.capacity = 100, .min_after_dequeue = 20, .seed = 1};  // 20 images x 5 crops: 5 minibatches
  o.staging_buffers = 1;  // every call copies into the same device staging slot
  o.output_buffers = 32;
  GpuAugment augment(device, o);
  struct Opened {  // before the augment's destructor waits for its streams
    HeldKernels& device;
    ~Opened() { device.open(); }
  } opened{*device};
  const Images data{.images = 1000, .per_batch = 20};
  {
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .source("read", data.source())
                    .batch("images", data.per_batch)
                    .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 1})
                    .build();
    // The first call's crops wait at the gate; it emits into a queue of one and, once the
    // pipeline stops, its emit throws.
    REQUIRE(pipe.next());
  }
  const auto before = device->copies();
  auto call = std::async(std::launch::async, [&] {
    std::vector<DeviceBatch> out;
    Emitter<DeviceBatch> emit(out);
    augment(data.batch(1), emit, {0, 1});
    return out.size();
  });
  // The stopped call's crop kernel and gathers have not read the slot yet: no copy may overwrite it.
  for (int i = 0; i < 60 && device->copies().h2d_copies == before.h2d_copies; ++i) std::this_thread::sleep_for(5ms);
  CHECK(device->copies().h2d_copies == before.h2d_copies);
  device->open();
  CHECK(call.get() == 5);
  CHECK(device->copies().h2d_copies == before.h2d_copies + 1);
}

namespace {

// The data set of `Images` (2D uint8) decoded, as IdxDataset holds it.
std::shared_ptr<const IdxDataset> as_dataset(const Images& data) {
  auto d = std::make_shared<IdxDataset>();
  d->images = {static_cast<std::uint32_t>(data.images), data.shape.height, data.shape.width, {}};
  for (std::uint64_t id = 0; id < data.images; ++id) {
    const Sample s = make_image(data.shape, DType::u8, id);
    d->images.pixels.insert(d->images.pixels.end(), s.as<std::uint8_t>().begin(), s.as<std::uint8_t>().end());
    d->labels.push_back(s.label);
  }
  return d;
}

}  // namespace

TEST_CASE("resident: one upload, then only the crops to cut cross, and the same minibatches as streaming" *
          doctest::timeout(120)) {
  auto device = gpu::Device::open(stoker::test::cuda_half("the CUDA run of this case") ? "cuda" : "cpu");
  INFO("device: " << device->name());
  auto o = fashion_options();
  o.crops.count_of = varying(5);
  const Images data{.images = 300, .per_batch = 32};
  const auto dataset = as_dataset(data);
  auto augment = GpuAugment::resident(device, dataset, o);
  CHECK(augment.is_resident());
  const auto uploaded = device->transfers();
  CHECK(uploaded.h2d_copies == 1);

  auto pipe = PipelineBuilder{}
                  .threads(2)
                  .seed(4)
                  .epochs(2)
                  .deterministic()  // indices reach the batcher in order: the exact sequence can be checked
                  .source("ids", IdSource(IdxReader(dataset)))
                  .batch("indices", data.per_batch)
                  .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 2})
                  .build();
  ReadBack read(*device);
  const std::size_t crops = check_pipeline(pipe, read, data, o, 4, 2);
  const std::size_t calls = 2 * ((data.images + data.per_batch - 1) / data.per_batch + 1);  // and the drains
  // After the upload, each crop crosses as its 28-byte job, in one copy per call at most: no
  // image byte, and no kernel reading jobs from pinned memory across PCIe.
  const auto after = device->transfers();
  CHECK(after.h2d_bytes - uploaded.h2d_bytes == crops * sizeof(gpu::detail::CropJob));
  CHECK(after.h2d_copies - uploaded.h2d_copies <= calls);
  CHECK(after.d2h_copies == read.copies);
}

TEST_CASE("streaming on the device the pipeline runs on: no copy back, one copy per input batch" *
          doctest::timeout(120)) {
  if (!stoker::test::cuda_half("the CUDA pipeline run of GpuAugment")) {
    return;
  }
  auto device = gpu::Device::open("cuda");
  INFO("device: " << device->name());
  auto o = fashion_options();
  o.crops.count_of = varying(5);
  GpuAugment augment(device, o);
  const Images data{.images = 500, .per_batch = 64};
  auto pipe = PipelineBuilder{}
                  .seed(8)
                  .epochs(2)
                  .deterministic()
                  .source("read", data.source())
                  .batch("images", data.per_batch)
                  .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 2})
                  .build();
  ReadBack read(*device);
  check_pipeline(pipe, read, data, o, 8, 2);
  const auto t = device->transfers();
  CHECK(t.h2d_copies == 2 * (data.batches() + 1));  // and each epoch's drain its gather slots
  CHECK(t.d2h_copies == read.copies);               // only the test's own read-backs
}

TEST_CASE("a traced run draws every copy and kernel on its stream's track, in order, once" * doctest::timeout(120)) {
  for (const auto& device : devices()) {
    INFO("device: " << device->name());
    const test::TempDir dir("device-trace");
    const auto path = dir / "run.trace.json";
    const auto o = fashion_options();
    GpuAugment augment(device, o);
    const Images data{.images = 300, .per_batch = 50};
    const auto before = device->transfers();
    ReadBack read(*device);
    {
      auto pipe = PipelineBuilder{}
                      .seed(3)
                      .epochs(2)
                      .trace(path.string())
                      .timeline(gpu::device_timeline(device))
                      .source("read", data.source())
                      .batch("images", data.per_batch)
                      .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 2})
                      .build();
      // One trace at a time takes a device's timeline.
      auto second = PipelineBuilder{}
                        .trace((dir / "second.trace.json").string())
                        .timeline(gpu::device_timeline(device))
                        .source("read", data.source());
      CHECK_THROWS_WITH(second.build(), doctest::Contains("already goes to another trace"));
      for (auto epoch : pipe.epochs())
        for (auto& b : epoch) (void)read(b);
    }
    const auto after = device->transfers();

    std::ifstream in(path);
    const auto trace = nlohmann::json::parse(in);
    std::map<int, std::string> tracks;
    std::map<int, std::vector<std::pair<double, double>>> spans;  // per track: (ts, dur) in file order
    std::map<std::string, std::uint64_t> count;                   // per span name
    for (const auto& e : trace.at("traceEvents")) {
      if (e.at("pid") != 2) continue;
      if (e.at("ph") == "M" && e.at("name") == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
      if (e.at("ph") != "X") continue;
      const int tid = e.at("tid");
      CHECK(tracks.contains(tid));
      spans[tid].emplace_back(e.at("ts").get<double>(), e.at("dur").get<double>());
      ++count[e.at("name").get<std::string>()];
      if (e.at("name") == "h2d") CHECK(e.at("args").at("bytes").get<std::uint64_t>() > 0);
    }
    // Every copy of the run, and kernels; none twice.
    CHECK(count["h2d"] == after.h2d_copies - before.h2d_copies);
    CHECK(count["d2h"] == after.d2h_copies - before.d2h_copies);
    CHECK(count["crop"] > 0);
    CHECK(count["gather"] > 0);
    // A track per stream, named after its device; a stream runs its work in order, one piece
    // at a time (CUDA's times come through float milliseconds: a microsecond's slack).
    const double slack = device->backend() == gpu::Backend::cpu ? 0.001 : 1.0;
    const std::string prefix = device->backend() == gpu::Backend::cpu ? "cpu stream " : "cuda:";
    for (const auto& [tid, list] : spans) {
      CAPTURE(tracks[tid]);
      CHECK(tracks[tid].starts_with(prefix));
      for (std::size_t i = 0; i < list.size(); ++i) {
        CHECK(list[i].first >= 0);
        CHECK(list[i].second >= 0);
        if (i > 0) CHECK(list[i].first >= list[i - 1].first + list[i - 1].second - slack);
      }
    }
  }
}

namespace {

// The crop and gather kernels against the CPU transform, on fresh random images, windows and
// flips, into outputs poisoned with NaN (and labels with a sentinel) before the run. Every
// array the kernels read or write starts `offset` bytes past an allocation's alignment.
void check_kernels(gpu::Device& device, Shape shape, DType dtype, CropSize size, const Normalization& norm,
                   std::size_t offset = 0) {
  const auto seed = std::random_device{}();
  INFO("device " << device.name() << ", images " << shape.str() << " " << dtype_name(dtype) << ", crops " << size.str()
                 << ", offset " << offset << ", seed " << seed);
  Rng rng(seed);
  const Normalizer normalizer(norm);
  const gpu::detail::CropKernels kernels(shape, dtype, size, normalizer);
  const std::size_t images = 6, jobs = 50, elements = kernels.crop_elements();

  std::vector<Sample> host_images;
  std::vector<std::byte> image_bytes;
  for (std::size_t i = 0; i < images; ++i) {
    host_images.push_back(make_image(shape, dtype, i, seed));
    const auto& b = host_images.back().data;
    image_bytes.insert(image_bytes.end(), b.data(), b.data() + b.size());
  }
  const Shape crop = kernels.crop();
  std::vector<gpu::detail::CropJob> job_list;
  std::vector<std::uint32_t> order(jobs);
  for (std::size_t i = 0; i < jobs; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);  // outputs in scattered slots
  for (std::size_t i = 0; i < jobs; ++i) {
    const auto origin = [&](std::uint32_t whole, std::uint32_t part) {
      return static_cast<std::uint32_t>(rng.below(whole - part + 1ull));
    };
    job_list.push_back({static_cast<std::uint32_t>(rng.below(images)), order[i], origin(shape.depth, crop.depth),
                        origin(shape.height, crop.height), origin(shape.width, crop.width),
                        static_cast<std::uint32_t>(rng.below(8)), static_cast<std::int32_t>(rng())});
  }
  std::vector<std::byte> table(kernels.table_bytes());
  kernels.write_table(table.data());

  auto stream = device.make_stream();
  std::vector<gpu::Memory> memory;
  const auto upload = [&](const void* data, std::size_t bytes) {
    memory.push_back(device.allocate(bytes + offset));
    stream->copy_to_device(memory.back().data() + offset, data, bytes);
    return memory.back().data() + offset;
  };
  const std::vector<float> nan(jobs * elements, std::numeric_limits<float>::quiet_NaN());
  const std::vector<std::int32_t> sentinel(jobs, std::numeric_limits<std::int32_t>::min());
  std::byte* d_images = upload(image_bytes.data(), image_bytes.size());
  std::byte* d_jobs = upload(job_list.data(), job_list.size() * sizeof(job_list[0]));
  std::byte* d_table = upload(table.data(), table.size());
  std::byte* d_out = upload(nan.data(), nan.size() * sizeof(float));
  std::byte* d_labels = upload(sentinel.data(), sentinel.size() * sizeof(std::int32_t));
  std::byte* d_gathered = upload(nan.data(), nan.size() * sizeof(float));
  std::byte* d_gathered_labels = upload(sentinel.data(), sentinel.size() * sizeof(std::int32_t));
  std::vector<std::uint32_t> slots(jobs);
  for (auto& s : slots) s = static_cast<std::uint32_t>(rng.below(jobs));
  std::byte* d_slots = upload(slots.data(), slots.size() * sizeof(std::uint32_t));

  auto* out = reinterpret_cast<float*>(d_out);
  auto* labels = reinterpret_cast<std::int32_t*>(d_labels);
  kernels.crop(*stream, d_images, images, reinterpret_cast<const gpu::detail::CropJob*>(d_jobs), jobs, d_table, out,
               labels, jobs);
  kernels.gather(*stream, out, labels, jobs, reinterpret_cast<const std::uint32_t*>(d_slots), jobs,
                 reinterpret_cast<float*>(d_gathered), reinterpret_cast<std::int32_t*>(d_gathered_labels));
  std::vector<float> got(jobs * elements), gathered(jobs * elements);
  std::vector<std::int32_t> got_labels(jobs), gathered_labels(jobs);
  stream->copy_to_host(got.data(), d_out, got.size() * sizeof(float));
  stream->copy_to_host(got_labels.data(), d_labels, got_labels.size() * sizeof(std::int32_t));
  stream->copy_to_host(gathered.data(), d_gathered, gathered.size() * sizeof(float));
  stream->copy_to_host(gathered_labels.data(), d_gathered_labels, gathered_labels.size() * sizeof(std::int32_t));
  stream->synchronize();

  std::vector<float> want(elements);
  for (const auto& job : job_list) {
    const Window w{job.z, job.y, job.x, crop.depth, crop.height, crop.width};
    const Flips flips{(job.flips & gpu::detail::kFlipDepth) != 0, (job.flips & gpu::detail::kFlipHeight) != 0,
                      (job.flips & gpu::detail::kFlipWidth) != 0};
    crop_mirror_normalize_into(host_images[job.image], w, flips, normalizer, want);
    CAPTURE(job.dst);
    CHECK(std::memcmp(got.data() + job.dst * elements, want.data(), elements * sizeof(float)) == 0);
    CHECK(got_labels[job.dst] == job.label);
  }
  for (std::size_t i = 0; i < jobs; ++i) {
    CHECK(std::memcmp(gathered.data() + i * elements, got.data() + slots[i] * elements, elements * sizeof(float)) == 0);
    CHECK(gathered_labels[i] == got_labels[slots[i]]);
  }
}

void check_all_kernels(gpu::Device& device) {
  check_kernels(device, {1, 1, 28, 28, false}, DType::u8, {24, 24}, kFashion);
  check_kernels(device, {3, 1, 17, 13, false}, DType::u8, {17, 5},
                {.scale = 255, .mean = {0.5f, 0.4f, 0.3f}, .std = {0.25f, 0.2f, 0.15f}});
  check_kernels(device, {2, 9, 10, 11, true}, DType::u16, {4, 10, 3},
                {.scale = 65535, .mean = {0.1f, 0.9f}, .std = {0.3f, 3.0f}});
  check_kernels(device, {1, 6, 7, 8, true}, DType::f32, {0, 5, 5}, {.scale = 7, .mean = {-2.5f}, .std = {0.7f}});
  // Rows wider than a warp, and more rows than a block takes at once; one a multiple of 4 wide
  // (written 4 values at a time), one not.
  check_kernels(device, {1, 1, 90, 150, false}, DType::u8, {81, 140}, kFashion);
  check_kernels(device, {1, 1, 90, 100, false}, DType::u16, {81, 70}, {.scale = 65535, .mean = {0.3f}, .std = {0.2f}});
}

}  // namespace

TEST_CASE("crop and gather kernels equal the CPU transform bit for bit: CPU backend" * doctest::timeout(60)) {
  auto device = gpu::Device::open("cpu");
  check_all_kernels(*device);
}

TEST_CASE("crop and gather kernels equal the CPU transform bit for bit: CUDA" * doctest::timeout(60)) {
  if (!stoker::test::cuda_half("the CUDA crop kernel checks")) {
    return;
  }
  auto device = gpu::Device::open("cuda");
  for (int run = 0; run < 3; ++run) check_all_kernels(*device);
}

TEST_CASE("the copy of an input batch is issued before the call waits for output buffers the consumer holds" *
          doctest::timeout(60)) {
  for (const auto& device : devices()) {
    CAPTURE(device->name());
    auto o = fashion_options();  // 64 images make 320 crops: 10 minibatches of 32 once the window is full
    o.output_buffers = GpuAugment::buffers_per_call(o);  // 11: the least one call may need
    GpuAugment augment(device, o);
    const Images data{.images = 64 * 3, .per_batch = 64};
    std::vector<DeviceBatch> held;
    Emitter<DeviceBatch> emit(held);
    augment(data.batch(0), emit, {});
    augment(data.batch(1), emit, {});
    REQUIRE(held.size() == 10);  // the consumer holds them: one output buffer is left
    const auto before = device->transfers();
    auto call = std::async(std::launch::async, [&] {
      std::vector<DeviceBatch> out;
      Emitter<DeviceBatch> more(out);
      augment(data.batch(2), more, {});
      return out.size();
    });
    // The call needs 10 buffers and waits for them; its batch goes to the device meanwhile.
    bool copied = false;
    for (int i = 0; i < 2000 && !copied; ++i) {
      copied = device->transfers().h2d_copies > before.h2d_copies;
      if (!copied) std::this_thread::sleep_for(5ms);
    }
    CHECK(copied);
    CHECK(call.wait_for(0ms) == std::future_status::timeout);  // still waiting for buffers
    held.clear();
    CHECK(call.get() == 10);
  }
}

TEST_CASE("crop and gather kernels at every alignment and awkward width equal the CPU transform" *
          doctest::timeout(120)) {
  for (const auto& device : devices()) {
    // Widths about a vector of 4, a warp of 32 and four warps; arrays 4, 8 and 12 bytes past a
    // 16-byte boundary, where no lane may take the 16-byte path.
    for (const std::uint32_t width : {1u, 2u, 3u, 4u, 5u, 31u, 32u, 33u, 127u, 128u, 129u})
      for (const std::size_t offset : {0u, 4u, 8u, 12u}) {
        check_kernels(*device, {1, 1, 7, width + 3, false}, DType::u8, {5, width}, kFashion, offset);
        check_kernels(*device, {2, 3, 4, width + 1, true}, DType::u16, {2, 3, width},
                      {.scale = 65535, .mean = {0.1f, 0.9f}, .std = {0.3f, 3.0f}}, offset);
        check_kernels(*device, {1, 1, 3, width, false}, DType::f32, {3, width},
                      {.scale = 7, .mean = {-2.5f}, .std = {0.7f}}, offset);
      }
  }
}

TEST_CASE("a 512^3 uint16 volume cropped into more than 2^31 output elements on CUDA" * doctest::timeout(300)) {
  if (!stoker::test::cuda_half("the 512^3 volume (9 GB of crops, CUDA only)")) {
    return;
  }
  auto device = gpu::Device::open("cuda");
  const Shape volume{1, 512, 512, 512, true};
  const Normalization norm{.scale = 65535, .mean = {0.25f}, .std = {0.5f}};
  const gpu::detail::CropKernels kernels(volume, DType::u16, {512, 512, 512}, Normalizer(norm));
  const std::size_t elements = kernels.crop_elements();  // 2^27
  const std::size_t crops = 17;                          // 17 x 2^27 > 2^31 floats
  REQUIRE(crops * elements > (std::size_t{1} << 31));
  if (device->free_memory() < crops * elements * sizeof(float) + (std::size_t{2} << 30)) {
    MESSAGE("this GPU has too little free memory for 9 GB of crops: skipped");
    return;
  }
  const Sample image = make_image(volume, DType::u16, 1);
  auto stream = device->make_stream();
  gpu::Memory d_image = device->allocate(image.data.size());
  stream->copy_to_device(d_image.data(), image.data.data(), image.data.size());
  std::vector<std::byte> table(kernels.table_bytes());
  kernels.write_table(table.data());
  gpu::Memory d_table = device->allocate(table.size());
  stream->copy_to_device(d_table.data(), table.data(), table.size());
  std::vector<gpu::detail::CropJob> jobs;
  for (std::uint32_t k = 0; k < crops; ++k) jobs.push_back({0, k, 0, 0, 0, k % 8, static_cast<std::int32_t>(k)});
  gpu::Memory d_jobs = device->allocate(jobs.size() * sizeof(jobs[0]));
  stream->copy_to_device(d_jobs.data(), jobs.data(), jobs.size() * sizeof(jobs[0]));
  gpu::Memory d_out = device->allocate(crops * elements * sizeof(float));
  gpu::Memory d_labels = device->allocate(crops * sizeof(std::int32_t));
  auto* out = reinterpret_cast<float*>(d_out.data());
  auto* labels = reinterpret_cast<std::int32_t*>(d_labels.data());
  kernels.crop(*stream, d_image.data(), 1, reinterpret_cast<const gpu::detail::CropJob*>(d_jobs.data()), crops,
               d_table.data(), out, labels, crops);
  // The first crop gathered again into the last slot: both ends of the 64-bit range.
  const std::uint32_t slot = 0;
  gpu::Memory d_slot = device->allocate(sizeof slot);
  stream->copy_to_device(d_slot.data(), &slot, sizeof slot);
  kernels.gather(*stream, out, labels, crops, reinterpret_cast<const std::uint32_t*>(d_slot.data()), 1,
                 out + (crops - 1) * elements, labels + (crops - 1));

  std::vector<float> got(elements), want(elements);
  for (const std::size_t k : {std::size_t{0}, crops - 2, crops - 1}) {
    CAPTURE(k);
    const auto& job = jobs[k == crops - 1 ? 0 : k];
    stream->copy_to_host(got.data(), out + k * elements, elements * sizeof(float));
    stream->synchronize();
    crop_mirror_normalize_into(image, {0, 0, 0, 512, 512, 512},
                               {(job.flips & gpu::detail::kFlipDepth) != 0, (job.flips & gpu::detail::kFlipHeight) != 0,
                                (job.flips & gpu::detail::kFlipWidth) != 0},
                               Normalizer(norm), want);
    CHECK(std::memcmp(got.data(), want.data(), elements * sizeof(float)) == 0);
  }
  std::vector<std::int32_t> got_labels(crops);
  stream->copy_to_host(got_labels.data(), labels, crops * sizeof(std::int32_t));
  stream->synchronize();
  for (std::size_t k = 0; k + 1 < crops; ++k) CHECK(got_labels[k] == static_cast<std::int32_t>(k));
  CHECK(got_labels[crops - 1] == 0);
}

namespace {

// Issues `job` (one corrupt crop job) from a stage of a running GpuAugment pipeline: the fault
// must reach the consumer as a StageError, and on the CPU backend with `cpu_message` in it.
void corrupt_job_fails_its_stage(const gpu::detail::CropJob& job, const std::string& cpu_message) {
  for (const auto& device : devices()) {
    CAPTURE(device->name());
    GpuAugment augment(device, fashion_options(16));
    const gpu::detail::CropKernels kernels({1, 1, 28, 28, false}, DType::u8, {24, 24}, Normalizer(kFashion));
    auto stream = device->make_stream();
    gpu::Memory images = device->allocate(4 * 28 * 28), out = device->allocate(4 * 24 * 24 * sizeof(float));
    gpu::Memory labels = device->allocate(4 * sizeof(std::int32_t)), table = device->allocate(kernels.table_bytes());
    gpu::Memory bad = device->allocate_pinned(sizeof(gpu::detail::CropJob));
    std::memcpy(bad.data(), &job, sizeof job);
    std::uint64_t calls = 0;
    {
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .source("read", Images{.images = 100000, .per_batch = 16}.source())
                      .batch("images", 16)
                      .map("collate", Collate{.pool = augment.staging()}, {.queue = 1})
                      .flat_map<DeviceBatch>("gpu_augment", augment, {.queue = 1})
                      .map("inject",
                           [&](DeviceBatch b) {
                             stream->check();  // as ToDevice and GpuAugment do at every call
                             if (++calls == 3)
                               kernels.crop(*stream, images.data(), 4,
                                            reinterpret_cast<const gpu::detail::CropJob*>(bad.data()), 1, table.data(),
                                            reinterpret_cast<float*>(out.data()),
                                            reinterpret_cast<std::int32_t*>(labels.data()), 4);
                             return b;
                           })
                      .build();
      try {
        for (int i = 0; i < 1'000'000; ++i) (void)pipe.next();
        FAIL("the fault never reached the consumer");
      } catch (const StageError& e) {
        const std::string what = e.what();
        CAPTURE(what);
        // On CUDA the fault is sticky: every later CUDA call fails with it, so any stage of
        // the device may report it first, even with CUDA_LAUNCH_BLOCKING=1 (a stage that calls
        // CUDA while the faulting launch is returning: seen on an H100, gpu_augment's launch).
        if (device->backend() == gpu::Backend::cpu)
          CHECK(e.stage() == "inject");
        else
          CHECK((e.stage() == "inject" || e.stage() == "gpu_augment" || e.stage() == "collate"));
        CHECK(what.find("CUDA_LAUNCH_BLOCKING=1") != std::string::npos);
        if (device->backend() == gpu::Backend::cpu) CHECK(what.find(cpu_message) != std::string::npos);
      }
    }  // the pipeline, GpuAugment's streams and pools go down after the fault without throwing
  }
}


}  // namespace

// Each in a process of its own on CUDA: a kernel's fault is sticky, every later CUDA call of the
// process fails with it.
TEST_CASE(
    "a crop job outside its images fails the stage that issued it with a StageError, not the process "
    "[own process on CUDA: the fault is sticky]" *
    doctest::timeout(60)) {
  // An index far outside the 4 images of the launch: on CUDA an illegal address without the
  // kernel's own check.
  corrupt_job_fails_its_stage({1u << 30, 0, 0, 0, 0, 0, 0}, "image 1073741824 of 4");
}

TEST_CASE(
    "a crop job whose window lies outside its image fails the stage that issued it with a StageError, not the "
    "process [own process on CUDA: the fault is sticky]" *
    doctest::timeout(60)) {
  // A 24x24 window at column 2^30 of a 28x28 image: on CUDA a read far past the images without
  // the kernel's check of the window.
  corrupt_job_fails_its_stage({0, 0, 0, 0, 1u << 30, 0, 0}, "lies outside the image 1x28x28");
}

TEST_CASE("one crop call fills many outputs, each with its own slots, as one output would, past a launch's outputs" *
          doctest::timeout(60)) {
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  for (const auto& device : devices()) {
    for (const CropSize size : {CropSize{24, 24}, CropSize{26, 26}, CropSize{5, 3}}) {
      CAPTURE(device->name());
      CAPTURE(size.str());
      Rng rng(seed);
      const Shape shape{1, 1, 28, 28, false};
      const gpu::detail::CropKernels kernels(shape, DType::u8, size, Normalizer(kFashion));
      const std::size_t images = 8, jobs = 400, elements = kernels.crop_elements();
      std::vector<std::byte> pixels;
      for (std::size_t i = 0; i < images; ++i) {
        const Sample image = make_image(shape, DType::u8, i, seed);
        pixels.insert(pixels.end(), image.data.data(), image.data.data() + image.data.size());
      }
      // 100 outputs (more than one launch takes), some empty, each job at a scattered slot of
      // its own output; the same jobs at slot i of one output are the reference.
      std::vector<std::uint32_t> firsts{0};
      for (int o = 1; o < 100; ++o) firsts.push_back(static_cast<std::uint32_t>(rng.below(jobs + 1)));
      std::sort(firsts.begin(), firsts.end());
      std::vector<gpu::detail::CropJob> many, one;
      for (std::size_t o = 0; o < firsts.size(); ++o) {
        const std::uint32_t end = o + 1 < firsts.size() ? firsts[o + 1] : jobs;
        std::vector<std::uint32_t> slots(end - firsts[o]);
        for (std::uint32_t k = 0; k < slots.size(); ++k) slots[k] = k;
        std::shuffle(slots.begin(), slots.end(), rng);
        for (std::uint32_t k = 0; k < slots.size(); ++k) {
          auto job = gpu::detail::CropKernels::drawn_job(static_cast<std::uint32_t>(rng.below(images)), rng(),
                                                         static_cast<std::uint32_t>(rng.below(5)),
                                                         static_cast<std::int32_t>(rng()));
          job.dst = slots[k];
          many.push_back(job);
          job.dst = firsts[o] + k;
          one.push_back(job);
        }
      }
      RandomCropOptions crops{.size = size, .count = 5, .mirror = MirrorOptions{.axis = Axis::width, .p = 0.5}};
      const auto draws = kernels.draws_for(crops, seed, 3);
      std::vector<std::byte> table(kernels.table_bytes());
      kernels.write_table(table.data());

      auto stream = device->make_stream();
      const auto upload = [&](const void* data, std::size_t bytes) {
        gpu::Memory m = device->allocate(std::max<std::size_t>(bytes, 1));
        if (bytes) stream->copy_to_device(m.data(), data, bytes);
        return m;
      };
      const std::vector<float> nan(jobs * elements, std::numeric_limits<float>::quiet_NaN());
      const std::vector<std::int32_t> sentinel(jobs, std::numeric_limits<std::int32_t>::min());
      gpu::Memory d_images = upload(pixels.data(), pixels.size()), d_table = upload(table.data(), table.size());
      gpu::Memory d_many = upload(many.data(), jobs * sizeof many[0]), d_one = upload(one.data(), jobs * sizeof one[0]);
      gpu::Memory ref = upload(nan.data(), jobs * elements * sizeof(float));
      gpu::Memory ref_labels = upload(sentinel.data(), jobs * sizeof(std::int32_t));
      std::vector<gpu::Memory> outs, out_labels;
      std::vector<gpu::detail::CropOutput> outputs;
      for (std::size_t o = 0; o < firsts.size(); ++o) {
        const std::uint32_t count = (o + 1 < firsts.size() ? firsts[o + 1] : jobs) - firsts[o];
        outs.push_back(upload(nan.data(), count * elements * sizeof(float)));
        out_labels.push_back(upload(sentinel.data(), count * sizeof(std::int32_t)));
        outputs.push_back({reinterpret_cast<float*>(outs.back().data()),
                           reinterpret_cast<std::int32_t*>(out_labels.back().data()), firsts[o], count});
      }
      kernels.crop(*stream, d_images.data(), images, reinterpret_cast<const gpu::detail::CropJob*>(d_one.data()), jobs,
                   d_table.data(), reinterpret_cast<float*>(ref.data()),
                   reinterpret_cast<std::int32_t*>(ref_labels.data()), jobs, draws);
      kernels.crop(*stream, d_images.data(), images, reinterpret_cast<const gpu::detail::CropJob*>(d_many.data()), jobs,
                   d_table.data(), outputs, draws);
      std::vector<float> want(jobs * elements), got(elements);
      std::vector<std::int32_t> want_labels(jobs);
      std::int32_t got_label = 0;
      stream->copy_to_host(want.data(), ref.data(), want.size() * sizeof(float));
      stream->copy_to_host(want_labels.data(), ref_labels.data(), jobs * sizeof(std::int32_t));
      stream->synchronize();
      for (std::size_t i = 0; i < jobs; ++i) {
        const auto& o = gpu::detail::output_of(outputs.data(), static_cast<std::uint32_t>(outputs.size()),
                                               static_cast<std::uint32_t>(i));
        CAPTURE(i);
        stream->copy_to_host(got.data(), o.out + std::size_t{many[i].dst} * elements, elements * sizeof(float));
        stream->copy_to_host(&got_label, o.labels + many[i].dst, sizeof got_label);
        stream->synchronize();
        CHECK(std::memcmp(got.data(), want.data() + i * elements, elements * sizeof(float)) == 0);
        CHECK(got_label == want_labels[i]);
        CHECK(got_label == many[i].label);
      }
    }
  }
}

TEST_CASE("a crop drawn from (seed, epoch, id, k) alone equals RandomCrops::plan's, window and mirror" *
          doctest::timeout(60)) {
  const auto seed = std::random_device{}();
  INFO("seed " << seed);
  Rng rng(seed);
  const std::vector<std::pair<Shape, CropSize>> geometries{{{1, 1, 28, 28, false}, {24, 24}},
                                                           {{3, 1, 17, 13, false}, {17, 5}},
                                                           {{2, 9, 10, 11, true}, {4, 10, 3}},
                                                           {{1, 6, 7, 8, true}, {0, 5, 5}},
                                                           {{1, 1, 1, 1, false}, {1, 1}}};
  for (const auto& [shape, size] : geometries)
    for (const double p : {0.0, 0.3, 0.5, 1.0})
      for (const Axis axis : {Axis::width, Axis::height, Axis::depth}) {
        if (axis == Axis::depth && !shape.volume) continue;
        RandomCropOptions o{.size = size, .count = 1 + static_cast<int>(rng.below(7))};
        if (p > 0) o.mirror = MirrorOptions{.axis = axis, .p = p, .salt = rng()};
        o.salt = rng();
        const RandomCrops crops(o);
        const gpu::detail::CropKernels kernels(shape, DType::u8, size, Normalizer(Normalization{}));
        for (int trial = 0; trial < 40; ++trial) {
          const StageContext ctx{.seed = rng(), .epoch = static_cast<std::uint32_t>(rng.below(100))};
          const std::uint64_t id = trial % 2 ? rng() : rng.below(100000);  // ids past 2^32 too
          CAPTURE(shape.str());
          CAPTURE(p);
          CAPTURE(id);
          const Sample image = make_image(shape, DType::u8, id);
          const auto planned = crops.plan(image, ctx);
          REQUIRE(planned.size() == static_cast<std::size_t>(o.count));
          const auto draws = kernels.draws_for(o, ctx.seed, ctx.epoch);
          for (std::uint32_t k = 0; k < planned.size(); ++k) {
            auto job = gpu::detail::CropKernels::drawn_job(0, id, k, 0);
            gpu::detail::draw_if_asked(draws, job);
            const auto want = gpu::detail::make_job(0, planned[k], 0);
            CHECK(job.z == want.z);
            CHECK(job.y == want.y);
            CHECK(job.x == want.x);
            CHECK(job.flips == want.flips);
          }
        }
      }
}

TEST_CASE(
    "crops drawn where they are cut give the same minibatches as the host's plan: streaming and resident, on "
    "every backend" *
    doctest::timeout(120)) {
  for (const auto& device : devices()) {
    CAPTURE(device->name());
    auto o = fashion_options();  // no count_of: every crop is drawn where it is cut
    REQUIRE_FALSE(o.crops.count_of);
    const Images data{.images = 150, .per_batch = 32};
    GpuAugment streaming(device, o);
    check_epochs(*device, streaming, data, 17, 2);

    auto resident = GpuAugment::resident(device, as_dataset(data), o);
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .seed(17)
                    .epochs(2)
                    .deterministic()
                    .source("ids", IdSource(IdxReader(as_dataset(data))))
                    .batch("indices", data.per_batch)
                    .flat_map<DeviceBatch>("gpu_augment", resident, {.queue = 1})
                    .build();
    ReadBack read(*device);
    check_pipeline(pipe, read, data, o, 17, 2);

    // 3D, mirrored along depth, uint16.
    GpuAugmentOptions volume{.crops = {.size = {4, 6, 8},
                                       .count = 3,
                                       .mirror = MirrorOptions{.axis = Axis::depth},
                                       .normalize = Normalization{.scale = 3.0f, .mean = {0.5f}, .std = {0.2f}}},
                             .batch_size = 8,
                             .shuffle = {.capacity = 40, .min_after_dequeue = 20, .seed = 3},
                             .image = Shape{1, 7, 9, 11, true},
                             .dtype = DType::u16,
                             .max_images = 4};
    GpuAugment cubes(device, volume);
    check_epochs(*device, cubes, {.shape = {1, 7, 9, 11, true}, .dtype = DType::u16, .images = 30, .per_batch = 4}, 5,
                 1);
  }
}
