// SPDX-License-Identifier: Apache-2.0
// stoker-train: the nn ops against plain reference loops on each backend, and short training
// runs through the trainer's own code.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/core/stage_error.h"
#include "stoker/core/state.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/nn.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/reader.h"
#include "support.h"
#include "train.h"
#include "cuda_cases.h"

namespace nn = stoker::gpu::nn;
using stoker::gpu::Device;
using stoker::gpu::Stream;

namespace {

// Host vectors in and out of device memory, so that one check runs on either backend.
template <class T>
class DeviceArray {
 public:
  DeviceArray(Device& device, Stream& stream, const std::vector<T>& values)
      : stream_(stream),
        memory_(device.allocate(std::max<std::size_t>(values.size(), 1) * sizeof(T))),
        size_(values.size()) {
    stream.copy_to_device(memory_.data(), values.data(), size_ * sizeof(T));
    stream.synchronize();
  }
  T* get() const { return reinterpret_cast<T*>(memory_.data()); }
  std::vector<T> read() const {
    std::vector<T> out(size_);
    stream_.copy_to_host(out.data(), memory_.data(), size_ * sizeof(T));
    stream_.synchronize();
    return out;
  }

 private:
  Stream& stream_;
  stoker::gpu::Memory memory_;
  std::size_t size_;
};

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

// C = alpha op(A) op(B) + beta C, row-major, the textbook way.
std::vector<float> reference_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& a,
                                  int lda, const std::vector<float>& b, int ldb, float beta, std::vector<float> c,
                                  int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const float av = ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)];
        const float bv = tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)];
        sum += static_cast<double>(av) * bv;
      }
      float& out = c[static_cast<std::size_t>(i * ldc + j)];
      out = static_cast<float>(alpha * sum + (beta == 0 ? 0.0 : beta * out));
    }
  return c;
}

void check_gemm(Device& device) {
  auto stream = device.make_stream();
  const int m = 5, n = 7, k = 3;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const float beta : {0.0f, 0.5f}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        // Leading dimensions wider than the matrices, to catch a swapped one.
        const int lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
        const auto a = random_values(static_cast<std::size_t>((ta ? k : m) * lda), 1);
        const auto b = random_values(static_cast<std::size_t>((tb ? n : k) * ldb), 2);
        auto c = random_values(static_cast<std::size_t>(m * ldc), 3);
        // With beta = 0 whatever C held must not matter, NaN included.
        if (beta == 0) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
        const auto want = reference_gemm(ta, tb, m, n, k, 1.5f, a, lda, b, ldb, beta, c, ldc);
        DeviceArray<float> da(device, *stream, a), db(device, *stream, b), dc(device, *stream, c);
        nn::gemm(*stream, ta, tb, m, n, k, 1.5f, da.get(), lda, db.get(), ldb, beta, dc.get(), ldc);
        const auto got = dc.read();
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            const auto at = static_cast<std::size_t>(i * ldc + j);
            CHECK(got[at] == doctest::Approx(want[at]).epsilon(1e-5));
          }
      }
  CHECK_THROWS_AS(nn::gemm(*stream, false, false, 2, 2, 2, 1.0f, nullptr, 1, nullptr, 2, 0.0f, nullptr, 2),
                  std::invalid_argument);
}

// The mean loss as the op computes it, for finite differences.
double mean_loss(Device& device, Stream& stream, const std::vector<float>& logits,
                 const std::vector<std::int32_t>& labels, int rows, int classes) {
  DeviceArray<float> z(device, stream, logits), loss(device, stream, {0.0f});
  DeviceArray<std::int32_t> y(device, stream, labels);
  nn::softmax_cross_entropy(stream, z.get(), y.get(), rows, classes, nullptr, 0.0f, loss.get(), nullptr);
  return loss.read()[0] / rows;
}

void check_softmax_cross_entropy(Device& device) {
  auto stream = device.make_stream();
  const int rows = 4, classes = 5;
  auto logits = random_values(rows * classes, 4);
  for (float& v : logits) v *= 3;
  const std::vector<std::int32_t> labels{2, 0, 4, 1};

  DeviceArray<float> z(device, *stream, logits), grad(device, *stream, std::vector<float>(rows * classes, 9.0f));
  DeviceArray<float> loss(device, *stream, {1.0f});  // the op adds to what is there
  DeviceArray<std::int32_t> y(device, *stream, labels), correct(device, *stream, {10});
  nn::softmax_cross_entropy(*stream, z.get(), y.get(), rows, classes, grad.get(), 1.0f / rows, loss.get(),
                            correct.get());
  const auto g = grad.read();

  // Loss and accuracy against a direct computation.
  double want_loss = 1.0;
  int want_correct = 10;
  for (int i = 0; i < rows; ++i) {
    const float* row = &logits[static_cast<std::size_t>(i * classes)];
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(row[j]));
    want_loss += std::log(sum) - row[labels[static_cast<std::size_t>(i)]];
    want_correct += std::max_element(row, row + classes) - row == labels[static_cast<std::size_t>(i)];
  }
  CHECK(loss.read()[0] == doctest::Approx(want_loss).epsilon(1e-5));
  CHECK(correct.read()[0] == want_correct);

  // The gradient of the mean loss against central differences.
  const float h = 1e-2f;
  for (std::size_t at = 0; at < logits.size(); ++at) {
    CAPTURE(at);
    auto up = logits, down = logits;
    up[at] += h;
    down[at] -= h;
    const double numeric = (mean_loss(device, *stream, up, labels, rows, classes) -
                            mean_loss(device, *stream, down, labels, rows, classes)) /
                           (2 * h);
    CHECK(g[at] == doctest::Approx(numeric).epsilon(1e-3).scale(1.0));
  }

  // A label out of range: no loss, no gradient, not correct.
  DeviceArray<std::int32_t> bad(device, *stream, {-1, 0, 99, 1});
  DeviceArray<float> loss2(device, *stream, {0.0f});
  DeviceArray<std::int32_t> correct2(device, *stream, {0});
  nn::softmax_cross_entropy(*stream, z.get(), bad.get(), rows, classes, grad.get(), 1.0f, loss2.get(), correct2.get());
  const auto g2 = grad.read();
  for (int j = 0; j < classes; ++j) {
    CHECK(g2[static_cast<std::size_t>(j)] == 0.0f);
    CHECK(g2[static_cast<std::size_t>(2 * classes + j)] == 0.0f);
  }
  CHECK(loss2.read()[0] > 0.0f);  // rows 1 and 3 still count
}

void check_elementwise(Device& device) {
  auto stream = device.make_stream();
  const int rows = 3, cols = 4;
  const auto x = random_values(rows * cols, 5);
  const auto bias = random_values(cols, 6);

  DeviceArray<float> y(device, *stream, x), b(device, *stream, bias);
  nn::bias_activation(*stream, y.get(), b.get(), rows, cols, true);
  auto relu = y.read();
  DeviceArray<float> linear(device, *stream, x);
  nn::bias_activation(*stream, linear.get(), b.get(), rows, cols, false);
  const auto lin = linear.read();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x[i] + bias[i % cols];
    CHECK(lin[i] == doctest::Approx(v));
    CHECK(relu[i] == doctest::Approx(std::max(v, 0.0f)));
  }

  // A NaN (a diverged step) stays NaN through the ReLU on both backends, for the loss to show it.
  DeviceArray<float> diverged(device, *stream, {std::numeric_limits<float>::quiet_NaN(), -1.0f});
  DeviceArray<float> no_bias(device, *stream, {0.0f, 0.0f});
  nn::bias_activation(*stream, diverged.get(), no_bias.get(), 1, 2, true);
  const auto kept = diverged.read();
  CHECK(std::isnan(kept[0]));
  CHECK(kept[1] == 0.0f);

  DeviceArray<float> grad(device, *stream, std::vector<float>(x.size(), 2.0f));
  nn::relu_backward(*stream, grad.get(), y.get(), x.size());
  const auto gr = grad.read();
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(gr[i] == (relu[i] > 0 ? 2.0f : 0.0f));

  DeviceArray<float> sums(device, *stream, std::vector<float>(cols, 7.0f));
  nn::column_sum(*stream, linear.get(), rows, cols, sums.get());
  const auto s = sums.read();
  for (int j = 0; j < cols; ++j) {
    double want = 0;
    for (int i = 0; i < rows; ++i) want += lin[static_cast<std::size_t>(i * cols + j)];
    CHECK(s[static_cast<std::size_t>(j)] == doctest::Approx(want));
  }

  const auto p0 = random_values(10, 7), g0 = random_values(10, 8), v0 = random_values(10, 9);
  DeviceArray<float> p(device, *stream, p0), g(device, *stream, g0), v(device, *stream, v0);
  DeviceArray<float> lr(device, *stream, std::vector<float>{0.5f});
  nn::fill(*stream, lr.get(), 0.1f);  // the rate is read as the step runs: the last one set
  nn::sgd_momentum(*stream, p.get(), g.get(), v.get(), p0.size(), lr.get(), 0.9f, 0.01f);
  const auto p1 = p.read(), v1 = v.read();
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const float vel = 0.9f * v0[i] + g0[i] + 0.01f * p0[i];
    CHECK(v1[i] == doctest::Approx(vel));
    CHECK(p1[i] == doctest::Approx(p0[i] - 0.1f * vel));
  }

  nn::zero(*stream, p.get(), p0.size() * sizeof(float));
  for (float value : p.read()) CHECK(value == 0.0f);
}

// Rows and columns past 2^20, which a kernel whose grid is capped at 4096 blocks of 256
// threads covers only with a grid-stride loop; the last ones are the ones a capped grid skips.
void check_past_a_million(Device& device) {
  auto stream = device.make_stream();
  const int n = (1 << 20) + 1000, classes = 2;
  std::vector<float> logits(static_cast<std::size_t>(n) * classes);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {  // row i favours class i % 2, and is labelled so
    logits[static_cast<std::size_t>(2 * i + i % 2)] = 1.0f;
    labels[static_cast<std::size_t>(i)] = i % 2;
  }
  DeviceArray<float> z(device, *stream, logits), grad(device, *stream, std::vector<float>(logits.size(), 9.0f));
  DeviceArray<float> loss(device, *stream, {0.0f});
  DeviceArray<std::int32_t> y(device, *stream, labels), correct(device, *stream, {0});
  nn::softmax_cross_entropy(*stream, z.get(), y.get(), n, classes, grad.get(), 1.0f, loss.get(), correct.get());
  CHECK(correct.read()[0] == n);  // exact: every row counted once
  // Summed in float by the CUDA kernel's atomics, a million equal terms drift by about 0.1%.
  const double row_loss = std::log(1.0 + std::exp(-1.0));
  CHECK(loss.read()[0] == doctest::Approx(row_loss * n).epsilon(1e-2));
  const auto g = grad.read();
  for (const int i : {0, (1 << 20) - 1, 1 << 20, n - 1}) {
    CAPTURE(i);
    const float p = static_cast<float>(1.0 / (1.0 + std::exp(-1.0)));
    CHECK(g[static_cast<std::size_t>(2 * i + i % 2)] == doctest::Approx(p - 1.0f));
  }

  // Two rows of n columns: column j holds j and 1.
  std::vector<float> two_rows(2 * static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    two_rows[static_cast<std::size_t>(j)] = static_cast<float>(j % 1000);
    two_rows[static_cast<std::size_t>(n + j)] = 1.0f;
  }
  DeviceArray<float> a(device, *stream, two_rows), sums(device, *stream, std::vector<float>(n, -1.0f));
  nn::column_sum(*stream, a.get(), 2, n, sums.get());
  const auto s = sums.read();
  std::size_t wrong = 0;
  for (int j = 0; j < n; ++j) wrong += s[static_cast<std::size_t>(j)] != static_cast<float>(j % 1000 + 1);
  CHECK(wrong == 0);
}

bool have_fashion_mnist() {
  return std::filesystem::exists(std::filesystem::path(stoker::kFashionMnistDir) / "train-images-idx3-ubyte.gz");
}

stoker::train::TrainOptions small_run(const char* mode, std::size_t images) {
  stoker::train::TrainOptions o;
  o.device = "cpu";
  o.mode = mode;
  o.limit = images;
  o.epochs = 2;
  o.threads = 2;
  return o;
}

}  // namespace

TEST_CASE("nn ops on the CPU backend: gemm with each transposition" * doctest::timeout(30)) {
  check_gemm(*Device::open("cpu"));
}

TEST_CASE("nn ops on the CPU backend: softmax cross-entropy and its gradient against finite differences" *
          doctest::timeout(30)) {
  check_softmax_cross_entropy(*Device::open("cpu"));
}

TEST_CASE("nn ops on the CPU backend: bias, ReLU, column sums, SGD and zero against plain loops" *
          doctest::timeout(30)) {
  check_elementwise(*Device::open("cpu"));
}

TEST_CASE("nn ops on rows and columns past 2^20, on the CPU backend and on CUDA" * doctest::timeout(60)) {
  check_past_a_million(*Device::open("cpu"));
  if (!stoker::test::cuda_half("the CUDA half (grid-stride loops past 2^20)")) {
    return;
  }
  check_past_a_million(*Device::open("cuda"));
}

TEST_CASE("nn ops on CUDA match the same references" * doctest::timeout(60)) {
  if (!stoker::test::cuda_half("the CUDA nn op checks")) {
    return;
  }
  const auto device = Device::open("cuda");
  check_gemm(*device);
  check_softmax_cross_entropy(*device);
  check_elementwise(*device);
}

// stoker-train's graph step: cuBLAS and the nn kernels captured into a Replay and run inside a
// traced span (timed_work while a device timeline listens). The replays give what the same work
// issued op by op gives, and the trace shows the span alone, once a replay.
TEST_CASE("kernels and a cuBLAS call captured and replayed inside a traced span equal the same work issued op by op" *
          doctest::timeout(60)) {
  std::vector<std::shared_ptr<Device>> devices{Device::open("cpu")};
  if (stoker::test::cuda_half("the CUDA capture under tracing")) devices.push_back(Device::open("cuda"));
  for (const auto& device : devices) {
    CAPTURE(device->name());
    auto stream = device->make_stream();
    const int m = 8, n = 6, k = 5;
    DeviceArray<float> a(*device, *stream, random_values(m * k, 1)), b(*device, *stream, random_values(k * n, 2));
    DeviceArray<float> bias(*device, *stream, random_values(n, 3)), c(*device, *stream, std::vector<float>(m * n));
    DeviceArray<float> scale(*device, *stream, {0.0f});
    // C = scale * relu(A B + bias); scale is read from device memory, as the trainer's rate is.
    const auto issue = [&] {
      nn::gemm(*stream, false, false, m, n, k, 1.0f, a.get(), k, b.get(), n, 0.0f, c.get(), n);
      nn::bias_activation(*stream, c.get(), bias.get(), m, n, true);
      nn::sgd_momentum(*stream, c.get(), c.get(), c.get(), static_cast<std::size_t>(m * n), scale.get(), 0.0f, 0.0f);
    };
    nn::fill(*stream, scale.get(), 0.5f);
    issue();  // op by op; its first cuBLAS call also makes the stream's handle, which a capture cannot
    const auto want = c.read();

    const auto timeline = stoker::gpu::device_timeline(device);
    timeline->start();
    std::optional<stoker::gpu::Replay> step;
    for (int run = 0; run < 3; ++run)
      stoker::gpu::timed_work(*stream, "step", [&] {
        if (!step) step.emplace(*stream, issue);
        nn::fill(*stream, scale.get(), 0.5f);
        step->run();
      });
    stream->synchronize();
    std::vector<stoker::TimedSpan> spans;
    timeline->take(spans);
    timeline->stop();
    CHECK(c.read() == want);
    REQUIRE(spans.size() == 3);
    for (const auto& span : spans) CHECK(std::string(span.name) == "step");
  }
}

TEST_CASE("bad trainer options are refused naming the option" * doctest::timeout(10)) {
  using stoker::train::validate;
  auto o = small_run("pipelined", 6000);
  CHECK_NOTHROW(validate(o));
  auto bad = o;
  bad.augment = "tpu";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--augment"), std::invalid_argument);
  bad = o;
  bad.resident = "maybe";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--resident"), std::invalid_argument);
  bad = o;
  bad.image_batch = 0;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--image-batch"), std::invalid_argument);
  bad = o;
  bad.min_after_dequeue = bad.shuffle_capacity;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--min-after-dequeue"), std::invalid_argument);
  bad = o;
  bad.batch_size = bad.shuffle_capacity;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--batch-size"), std::invalid_argument);
  bad = o;
  bad.mode = "eager";
  CHECK_THROWS_AS(validate(bad), std::invalid_argument);
  bad = o;
  bad.data = "/nonexistent/fashion";
  CHECK_THROWS_AS(stoker::train::run_training(bad), stoker::DataError);
  bad = o;
  bad.checkpoint = "checkpoints";
  CHECK_NOTHROW(validate(bad));  // free order resumes too: the rest of the epoch, once each
  bad.augment = "gpu";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--checkpoint needs --mode pipelined and --augment cpu"),
                       std::invalid_argument);
  // Data-parallel: each rank takes an equal share of every step.
  CHECK_THROWS_WITH_AS(validate(o, 2), doctest::Contains("--batch-size 255 does not divide among 2 ranks"),
                       std::invalid_argument);
  bad = o;
  bad.batch_size = 256;
  CHECK_NOTHROW(validate(bad, 2));
  bad.mode = "sync";
  CHECK_THROWS_WITH_AS(validate(bad, 2), doctest::Contains("several ranks need --mode pipelined"),
                       std::invalid_argument);
  bad = o;
  bad.checkpoint_every = 10;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--checkpoint-every needs --checkpoint"),
                       std::invalid_argument);
  bad = o;
  bad.rank_timeout = -1;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--rank-timeout must be 0"), std::invalid_argument);
}

TEST_CASE("the default batch divides among any number of ranks, to the nearest multiple") {
  using stoker::train::default_batch_for;
  CHECK(default_batch_for(255, 1) == 255);
  CHECK(default_batch_for(255, 2) == 256);
  CHECK(default_batch_for(255, 3) == 255);
  CHECK(default_batch_for(255, 4) == 256);
  CHECK(default_batch_for(255, 7) == 252);
  CHECK(default_batch_for(255, 300) == 300);  // at least one crop per rank
  stoker::train::TrainOptions o;
  for (int ranks = 1; ranks <= 64; ++ranks) {
    o.batch_size = default_batch_for(255, ranks);
    CHECK_NOTHROW(stoker::train::validate(o, ranks));
  }
}

TEST_CASE("binding advice: a rank squeezed into fewer cores than its share, or sharing them, is named") {
  using stoker::train::binding_advice;
  using stoker::train::binding_record;
  // 2 ranks on 16 cores, each bound to 1 (mpirun's default at 2 ranks).
  CHECK(binding_advice({binding_record(1, 16, 2), binding_record(1, 16, 2)}, 0) ==
        "ranks 0, 1 may run on 1 of the 16 cores of a machine of 2 ranks (the launcher bound them): each pipeline "
        "gets 1 threads where it could have 8; launch with --map-by ppr:2:node:pe=8, or --bind-to none and give "
        "--threads 8 (docs/scale-out.md)");
  // 4 ranks, each bound to a socket of 16 of the 32 cores: 16 threads each where 8 is the share.
  CHECK(binding_advice(std::vector<std::string>(4, binding_record(16, 32, 4)), 0) ==
        "ranks 0-3 each run a pipeline of 16 threads on cores they share with 3 other ranks (a machine of 32 "
        "cores): give --threads 8, or launch with --map-by ppr:4:node:pe=8 (docs/scale-out.md)");
  CHECK(binding_advice(std::vector<std::string>(4, binding_record(16, 32, 4)), 8).empty());  // --threads 8
  CHECK(binding_advice({binding_record(8, 16, 2), binding_record(8, 16, 2)}, 0).empty());    // ppr:2:node:pe=8
  CHECK(binding_advice({binding_record(1, 16, 0), binding_record(1, 16, 0)}, 0).empty());    // launcher unknown
}

TEST_CASE(
    "--device takes cuda:N, refuses a device that is not one or not there naming the option, and gives each "
    "rank of a machine its own GPU" *
    doctest::timeout(30)) {
  using stoker::train::device_for_rank;
  auto o = small_run("pipelined", 600);
  o.device = "gpu";
  CHECK_THROWS_WITH_AS(stoker::train::validate(o), doctest::Contains("--device must be auto, cpu, cuda or cuda:N"),
                       std::invalid_argument);
  // The device is opened before any data is read: these fail without the data set too.
  for (const char* bad : {"cuda:x", "cuda:-1", "cuda:7"}) {
    o.device = bad;
    CHECK_NOTHROW(stoker::train::validate(o));
    CHECK_THROWS_WITH_AS(stoker::train::run_training(o), doctest::Contains(("--device " + std::string(bad)).c_str()),
                         std::invalid_argument);
  }
  CHECK(device_for_rank("auto", 3, 4, 2) == "cuda:1");
  CHECK(device_for_rank("cuda", 2, 4, 2) == "cuda:0");
  CHECK(device_for_rank("auto", 3, 4, 0) == "auto");             // no GPU: the CPU backend, as auto says
  CHECK(device_for_rank("auto", std::nullopt, 4, 2) == "auto");  // no launcher to say where the rank is
  CHECK(device_for_rank("auto", 1, 1, 2) == "auto");             // one rank: the current device
  CHECK(device_for_rank("cuda:1", 0, 4, 2) == "cuda:1");         // as asked
  CHECK(device_for_rank("cpu", 0, 4, 2) == "cpu");
}

TEST_CASE("a checkpoint is refused by a run with other options, and when truncated or missing" *
          doctest::timeout(120)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const auto dir = std::filesystem::temp_directory_path() / "stoker_test_checkpoint";
  std::filesystem::remove_all(dir);
  auto o = small_run("pipelined", 500);
  o.epochs = 1;
  o.deterministic = true;
  o.checkpoint = dir.string();
  stoker::train::run_training(o);
  auto resumed = o;
  resumed.resume = dir.string();
  CHECK_NOTHROW(stoker::train::run_training(resumed));  // the run was over: nothing is left to do
  resumed.learning_rate = 0.1f;
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed),
                       doctest::Contains("the checkpoint was made with --lr 0.05, this run has 0.1"),
                       std::invalid_argument);
  resumed = o;
  resumed.resume = dir.string();
  resumed.seed = 2;
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed),
                       doctest::Contains("the checkpoint was made with --seed 1, this run has 2"),
                       std::invalid_argument);
  // Other training data: the same files unpacked, but for one pixel of image 250 (of the 500 the
  // run reads: neither the first nor the last, which a pipeline state's fingerprint hashes).
  const stoker::test::TempDir changed("checkpoint-other-data");
  for (const char* name :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::ifstream in(std::filesystem::path(o.data) / (std::string(name) + ".gz"), std::ios::binary);
    std::vector<char> gz((std::istreambuf_iterator<char>(in)), {});
    auto bytes = stoker::gunzip(std::as_bytes(std::span(gz)), name);
    if (std::string_view(name) == "train-images-idx3-ubyte") bytes.at(16 + 250 * 784 + 100) ^= std::byte{1};
    std::ofstream(changed.path() / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  resumed = o;
  resumed.resume = dir.string();
  resumed.data = changed.path().string();
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed),
                       doctest::Contains("the checkpoint was made with training data"), std::invalid_argument);
  const auto file = dir / "checkpoint";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed), doctest::Contains("the file is truncated"),
                       stoker::StateError);
  resumed.resume = (dir / "absent").string();
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed), doctest::Contains("cannot open"), stoker::StateError);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "after --resume an epoch counts all its samples, samples/s only those this process trained; a finished "
    "run resumed trains nothing and reports its model's accuracy" *
    doctest::timeout(120)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const stoker::test::TempDir dir("resume-figures");
  auto o = small_run("pipelined", 500);  // 2500 samples: 10 batches
  o.epochs = 1;
  o.deterministic = true;
  o.checkpoint = dir.path().string();
  std::uint64_t steps = 0;
  stoker::train::TrainCallbacks stop_after_4;
  stop_after_4.on_batch = [&](std::uint32_t, std::uint64_t, std::uint64_t) { ++steps; };
  stop_after_4.stop_requested = [&] { return steps == 4; };
  const auto stopped = stoker::train::run_training(o, stop_after_4);
  REQUIRE(stopped.interrupted.has_value());
  REQUIRE(stopped.interrupted->samples == 4 * 255);

  auto resumed = o;
  resumed.resume = o.checkpoint;
  const auto r = stoker::train::run_training(resumed);
  REQUIRE(r.epochs.size() == 1);
  const auto& e = r.epochs[0];
  CHECK(e.samples == 2500);
  CHECK(e.batches == 10);
  const double here = 2500 - 4 * 255;
  CHECK(e.samples_per_s() == doctest::Approx(here / e.train_seconds));
  CHECK(r.samples_per_s() == doctest::Approx(here / r.train_seconds()));

  const auto again = stoker::train::run_training(resumed);  // from the end of the run
  CHECK(again.epochs.empty());
  CHECK(again.test_accuracy() == r.test_accuracy());  // the same model on the same test set
}

// The digest says which (epoch, crop) pairs a run trained, each once: it is the sum of
// sample_digest over every crop of every epoch, whatever the mode, the augment and the order, and
// for a run stopped mid-epoch twice and resumed (free order), which ends with the same digest.
TEST_CASE("the digest of the samples trained: every crop of every epoch once, in every mode, and stopped twice "
          "and resumed" *
          doctest::timeout(180)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  auto o = small_run("pipelined", 300);  // 1500 crops an epoch: 5 full batches and a short one
  std::uint64_t want = 0;
  for (std::uint32_t epoch = 1; epoch <= o.epochs; ++epoch)
    for (std::uint64_t crop = 0; crop < 300 * static_cast<std::uint64_t>(o.crops); ++crop)
      want += stoker::train::sample_digest(epoch, crop);
  const auto whole = stoker::train::run_training(o);
  REQUIRE(whole.epochs.size() == 2);
  CHECK(whole.digest == want);
  CHECK(whole.digest == whole.epochs[0].digest + whole.epochs[1].digest);
  CHECK(whole.epochs[0].digest != whole.epochs[1].digest);  // the epoch is part of each pair
  for (const std::string mode : {"sync", "pipelined"})
    for (const std::string augment : {"cpu", "gpu"}) {
      CAPTURE(mode);
      CAPTURE(augment);
      auto other = small_run(mode.c_str(), 300);
      other.augment = augment;
      CHECK(stoker::train::run_training(other).digest == want);
    }

  const stoker::test::TempDir dir("digest-resume");
  o.checkpoint = dir.path().string();
  std::uint64_t steps = 0;
  stoker::train::TrainCallbacks stop;
  stop.on_batch = [&](std::uint32_t, std::uint64_t, std::uint64_t) { ++steps; };
  stop.stop_requested = [&] { return steps == 3; };
  const auto first = stoker::train::run_training(o, stop);  // in epoch 1
  REQUIRE(first.interrupted.has_value());
  CHECK(first.digest == first.interrupted->digest);
  auto resumed = o;
  resumed.resume = o.checkpoint;
  steps = 0;
  stop.stop_requested = [&] { return steps == 5; };  // in epoch 2
  const auto second = stoker::train::run_training(resumed, stop);
  REQUIRE(second.epochs.size() == 1);
  CHECK(second.epochs[0].digest == whole.epochs[0].digest);  // with the part before the checkpoint
  REQUIRE(second.interrupted.has_value());
  const auto last = stoker::train::run_training(resumed);
  REQUIRE(last.epochs.size() == 1);
  CHECK(last.epochs[0].digest == whole.epochs[1].digest);
  CHECK(last.digest == want);
  CHECK(stoker::train::run_training(resumed).digest == want);  // a finished run, resumed: nothing more
}

// The loss and accuracy counters are part of the checkpoint, so a deterministic run repeats only
// if every sum in the step has a fixed order (on CUDA: no float atomicAdd). A resumed run's first
// step runs kernel by kernel where the uninterrupted one replayed its CUDA graph: the same bytes.
TEST_CASE("a deterministic run writes the same checkpoint bytes every time, and stopped and resumed too, on each "
          "backend" *
          doctest::timeout(240)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  std::vector<std::string> backends{"cpu"};
  if (stoker::test::cuda_half("the CUDA run of this case")) backends.push_back("cuda");
  for (const auto& device : backends) {
    CAPTURE(device);
    const auto bytes_of = [](const std::filesystem::path& dir) {
      std::ifstream in(dir / "checkpoint", std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const stoker::test::TempDir first("repeat-a"), second("repeat-b"), stopped("repeat-stopped");
    auto o = small_run("pipelined", 1000);  // 5000 crops a epoch: 19 full batches and a short one
    o.device = device;
    o.deterministic = true;
    o.checkpoint = first.path().string();
    stoker::train::run_training(o);
    o.checkpoint = second.path().string();
    stoker::train::run_training(o);
    const std::string want = bytes_of(first.path());
    REQUIRE_FALSE(want.empty());
    CHECK(bytes_of(second.path()) == want);

    o.checkpoint = stopped.path().string();
    std::uint64_t steps = 0;
    stoker::train::TrainCallbacks stop_after_7;
    stop_after_7.on_batch = [&](std::uint32_t, std::uint64_t, std::uint64_t) { ++steps; };
    stop_after_7.stop_requested = [&] { return steps == 7; };
    REQUIRE(stoker::train::run_training(o, stop_after_7).interrupted.has_value());
    auto resumed = o;
    resumed.resume = o.checkpoint;
    stoker::train::run_training(resumed);
    CHECK(bytes_of(stopped.path()) == want);
  }
}

TEST_CASE("a short pipelined run on the CPU learns, with one copy per batch and one read-back per epoch" *
          doctest::timeout(240)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const auto o = small_run("pipelined", 6000);
  const auto r = stoker::train::run_training(o);
  REQUIRE(r.epochs.size() == 2);
  CHECK(r.device == "cpu");
  CHECK(r.test_images == 6000);
  CHECK(r.test_accuracy() > 0.6);  // chance is 0.1
  CHECK(r.epochs[1].loss < r.epochs[0].loss);
  for (const auto& e : r.epochs) {
    CHECK(e.samples == 6000u * 5);
    CHECK(e.batches == (6000u * 5 + 254) / 255);
  }
  // Setup: the initial weights and the test set; then one per batch. Back: one per epoch.
  CHECK(r.transfers.h2d_copies == r.batches() + 2);
  CHECK(r.transfers.d2h_copies == r.epochs.size());
  REQUIRE(r.pipeline.has_value());
  CHECK(r.pipeline->consumed == r.batches());
}

TEST_CASE("sync mode sees the same samples as pipelined mode and learns as well" * doctest::timeout(240)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  // Fewer images than above: this test trains twice, and sanitizer builds run it too.
  const auto pipelined = stoker::train::run_training(small_run("pipelined", 3000));
  const auto sync = stoker::train::run_training(small_run("sync", 3000));
  REQUIRE(sync.epochs.size() == pipelined.epochs.size());
  for (std::size_t e = 0; e < sync.epochs.size(); ++e) {
    CHECK(sync.epochs[e].samples == pipelined.epochs[e].samples);
    CHECK(sync.epochs[e].batches == pipelined.epochs[e].batches);
  }
  CHECK(sync.transfers.h2d_copies == pipelined.transfers.h2d_copies);
  CHECK(sync.transfers.d2h_copies == pipelined.transfers.d2h_copies);
  CHECK_FALSE(sync.pipeline.has_value());
  CHECK(sync.test_accuracy() > 0.6);
  // The same crops in another order: the two runs should land close to each other.
  CHECK(std::abs(sync.test_accuracy() - pipelined.test_accuracy()) < 0.05);
}

TEST_CASE(
    "--augment gpu: streaming, sync and resident runs see the same samples, make the copies they promise, "
    "and learn" *
    doctest::timeout(240)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const std::size_t images = 2000;
  auto run = [&](const char* mode, const char* resident) {
    auto o = small_run(mode, images);
    o.device = stoker::test::cuda_half("the CUDA run of this case") ? "cuda" : "cpu";
    o.augment = "gpu";
    o.resident = resident;
    o.image_batch = 300;
    return stoker::train::run_training(o);
  };
  const auto streaming = run("pipelined", "no");
  const auto sync = run("sync", "no");
  const auto resident = run("pipelined", "yes");
  INFO("device: " << streaming.device_name);
  CHECK_FALSE(streaming.resident);
  CHECK_FALSE(sync.resident);
  CHECK(resident.resident);
  for (const auto* r : {&streaming, &sync, &resident}) {
    REQUIRE(r->epochs.size() == 2);
    for (const auto& e : r->epochs) {
      CHECK(e.samples == images * 5);
      CHECK(e.batches == (images * 5 + 254) / 255);
    }
    CHECK(r->test_accuracy() > 0.6);      // chance is 0.1
    CHECK(r->transfers.d2h_copies == 2);  // the counters, once per epoch
    // On CUDA every full step but the first is one graph launch; the CPU backend has none.
    const std::uint64_t full_steps = 2 * (images * 5 / 255);
    CHECK(r->graph_steps == (r->device == "cuda" ? full_steps - 1 : 0));
    CHECK(r->graph == (r->graph_steps > 0));
  }
  // Setup: the weights and the test set; then one copy per 300 images and one of the slots of
  // each epoch's drain; or the data set once, then at most one copy of crop jobs per call.
  const std::size_t calls = (images + 299) / 300 + 1;
  CHECK(streaming.transfers.h2d_copies == 2 + 2 * calls);
  CHECK(sync.transfers.h2d_copies == streaming.transfers.h2d_copies);
  CHECK(resident.transfers.h2d_copies > 3);
  CHECK(resident.transfers.h2d_copies <= 3 + 2 * calls);
  REQUIRE(streaming.pipeline.has_value());
  CHECK(streaming.pipeline->consumed == streaming.batches());
}

namespace {

// Writes `images` 28x28 gray PNGs with a list file (`dir/list.txt`) and returns the list: image i
// of class i % 10, `pixels(i)` its pixels. The files are the PNGs stoker-make-data writes.
template <class Pixels>
std::filesystem::path write_png_list(const std::filesystem::path& dir, std::size_t images, Pixels&& pixels,
                                     const std::function<std::int32_t(std::size_t)>& label) {
  auto pool = stoker::BufferPool::create();
  std::string list;
  for (std::size_t i = 0; i < images; ++i) {
    stoker::Sample s(*pool, {.channels = 1, .height = 28, .width = 28, .channels_last = true}, stoker::DType::u8);
    pixels(i, s.as<std::uint8_t>());
    const std::string name = std::to_string(label(i)) + "/" + std::to_string(i) + ".png";
    std::filesystem::create_directories(dir / std::to_string(label(i)));
    const auto png = stoker::encode_png(s);
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
    list += name + " " + std::to_string(label(i)) + "\n";
  }
  std::ofstream(dir / "list.txt") << list;
  return dir / "list.txt";
}

// Classes told apart by a smooth pattern of their own, the same mirrored, under noise: what the
// model learns in an epoch or two.
std::filesystem::path write_pattern_classes(const std::filesystem::path& dir, std::size_t images) {
  return write_png_list(
      dir, images,
      [](std::size_t i, std::span<std::uint8_t> p) {
        const double c = static_cast<double>(i % 10);
        std::uint64_t state = i * 0x9e3779b97f4a7c15ULL + 1;
        for (std::size_t k = 0; k < p.size(); ++k) {
          const double y = static_cast<double>(k / 28), x = static_cast<double>(k % 28) - 13.5;
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          const double v = 120 + 90 * std::sin((0.1 + 0.04 * c) * y + c) * std::cos((0.08 + 0.03 * (9 - c)) * x);
          p[k] = static_cast<std::uint8_t>(v + static_cast<double>(state >> 60));
        }
      },
      [](std::size_t i) { return static_cast<std::int32_t>(i % 10); });
}

stoker::train::TrainOptions image_run(const std::filesystem::path& list) {
  auto o = small_run("pipelined", 0);
  o.images = list.string();
  o.epochs = 2;
  o.batch_size = 32;
  return o;
}

}  // namespace

TEST_CASE("--images: a PNG list trains, a tenth held out for testing, and bad files fail or are skipped and counted" *
          doctest::timeout(120)) {
  const stoker::test::TempDir dir("train_images");
  const auto list = write_pattern_classes(dir.path(), 400);
  auto o = image_run(list);
  const auto r = stoker::train::run_training(o);
  CHECK(r.train_images == 360);
  CHECK(r.test_images == 40);
  CHECK(r.test_source == "a tenth of " + list.string() + " drawn at random, held out");
  CHECK(r.skipped_images == 0);
  REQUIRE(r.epochs.size() == 2);
  for (const auto& e : r.epochs) CHECK(e.samples == 360u * 5);
  CHECK(r.test_accuracy() > 0.8);  // chance is 0.1: the tenth holds every class

  // Checkpoints: a resume goes on with the same files, and is refused with others.
  auto checkpointed = o;
  checkpointed.checkpoint = (dir.path() / "checkpoint").string();
  checkpointed.deterministic = true;
  stoker::train::run_training(checkpointed);
  auto resumed = checkpointed;
  resumed.checkpoint.clear();
  resumed.resume = checkpointed.checkpoint;
  const auto again = stoker::train::run_training(resumed);
  CHECK(again.nothing_to_train);
  CHECK(again.test_accuracy() > 0.8);
  resumed.images = (dir.path() / "other.txt").string();
  std::filesystem::copy_file(list, resumed.images);
  std::ofstream(resumed.images, std::ios::app) << "0/0.png 0\n";  // one more image
  CHECK_THROWS_WITH_AS(stoker::train::run_training(resumed),
                       doctest::Contains("the checkpoint was made with training data list "), std::invalid_argument);

  // A test list of its own; a truncated PNG among the training images and one among the test's.
  const auto test_list = write_pattern_classes(dir.path() / "test", 30);
  o.test_images = test_list.string();
  for (const auto& victim : {dir.path() / "0/0.png", dir.path() / "test/9/9.png"})
    std::filesystem::resize_file(victim, std::filesystem::file_size(victim) / 2);
  try {
    stoker::train::run_training(o);
    FAIL("a bad file did not stop the run");
  } catch (const stoker::StageError& e) {  // the test set is decoded first
    CHECK_MESSAGE(std::string(e.what()).find("test/9/9.png: damaged PNG") != std::string::npos, e.what());
  }
  o.on_bad_input = "skip";
  const auto skipped = stoker::train::run_training(o);
  CHECK(skipped.skipped_images == 1 + 2);  // the test file once, the training file every epoch
  CHECK(skipped.train_images == 400);      // read every epoch, one of them bad
  CHECK(skipped.test_images == 30);
  CHECK(skipped.test_source == test_list.string());
  for (const auto& e : skipped.epochs) CHECK(e.samples == 399u * 5);

  // --limit: the first 100 training and test images, the two bad ones among them.
  o.limit = 100;
  const auto limited = stoker::train::run_training(o);
  CHECK(limited.train_images == 100);
  CHECK(limited.test_images == 30);
  CHECK(limited.skipped_images == 1 + 2);
  // Crops larger than the images: each image is refused, naming it.
  o.on_bad_input = "fail";
  o.image_size = 30;
  CHECK_THROWS_WITH_AS(stoker::train::run_training(o), doctest::Contains("smaller than the 30x30 crops"),
                       stoker::StageError);
}

TEST_CASE("--images options are refused naming the option" * doctest::timeout(10)) {
  using stoker::train::validate;
  auto o = small_run("pipelined", 100);
  auto bad = o;
  bad.test_images = "test.txt";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--test-images needs --images"), std::invalid_argument);
  bad = o;
  bad.on_bad_input = "skip";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--on-bad-input skip needs --images"), std::invalid_argument);
  bad.images = "list.txt";
  CHECK_NOTHROW(validate(bad));
  bad.on_bad_input = "ignore";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--on-bad-input must be fail or skip"), std::invalid_argument);
  bad = o;
  bad.images = "list.txt";
  bad.mode = "sync";
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--images needs --mode pipelined"), std::invalid_argument);
  bad = o;
  bad.image_size = 20;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--image-size needs --images"), std::invalid_argument);
  bad.images = "/nonexistent/list.txt";
  CHECK_THROWS_WITH_AS(stoker::train::run_training(bad), doctest::Contains("/nonexistent/list.txt: does not exist"),
                       stoker::DataError);
  bad = o;
  bad.images = "list.txt";
  bad.cache = "/tmp/cache";
  bad.cache_bytes = 1 << 30;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--cache keeps shards read from a URL"), std::invalid_argument);
  bad.images = "https://data.example.com/train-{0..9}.tar";
  CHECK_NOTHROW(validate(bad));
  bad.cache_bytes = 0;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("--cache and --cache-bytes go together"),
                       std::invalid_argument);
}

TEST_CASE("--images on Fashion-MNIST as PNG files learns as the IDX files do, with the same model and crops" *
          doctest::timeout(240)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  // The first 2000 training and 500 test images, written as the PNG files stoker-make-data writes.
  const stoker::test::TempDir dir("train_fmnist");
  const auto train = stoker::fashion_mnist(stoker::kFashionMnistDir, "train");
  const auto test = stoker::fashion_mnist(stoker::kFashionMnistDir, "t10k");
  const auto copy = [](const stoker::IdxDataset& d) {
    return [&d](std::size_t i, std::span<std::uint8_t> p) { std::ranges::copy(d.image(i), p.begin()); };
  };
  const auto label_of = [](const stoker::IdxDataset& d) { return [&d](std::size_t i) { return d.labels[i]; }; };
  auto idx = small_run("pipelined", 2000);
  auto files = idx;
  files.images = write_png_list(dir.path() / "train", 2000, copy(train), label_of(train)).string();
  files.test_images = write_png_list(dir.path() / "test", 2000, copy(test), label_of(test)).string();
  const auto from_idx = stoker::train::run_training(idx);
  const auto from_files = stoker::train::run_training(files);
  CHECK(from_files.train_images == from_idx.train_images);
  CHECK(from_files.test_images == from_idx.test_images);
  CHECK(from_files.samples() == from_idx.samples());
  MESSAGE("test accuracy after 2 epochs on 2000 images: IDX " << from_idx.test_accuracy() << ", PNG files "
                                                              << from_files.test_accuracy());
  CHECK(from_files.test_accuracy() > 0.6);
  // Other draws of the same crops (image ids, the files' order): close, not equal.
  CHECK(std::abs(from_files.test_accuracy() - from_idx.test_accuracy()) < 0.05);
}
