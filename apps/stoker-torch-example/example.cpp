// SPDX-License-Identifier: Apache-2.0
#include "example.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "loader.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/transforms.h"

namespace stoker::torch_example {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The process's CPU time so far, every thread's.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// conv 1->16 3x3, relu, maxpool 2, conv 16->32 3x3, relu, maxpool 2, linear to 10:
// 24x24 -> 22x22 -> 11x11 -> 9x9 -> 4x4, so the linear layer sees 32 x 4 x 4 = 512 features.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3)))),
        fc(register_module("fc", torch::nn::Linear(32 * 4 * 4, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc->forward(x.flatten(1));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

IdxDataset load(const ExampleOptions& o, std::string_view split, std::size_t limit) {
  IdxDataset d = fashion_mnist(o.data, split);
  if (limit != 0 && limit < d.size()) {
    d.labels.resize(limit);
    d.images.count = static_cast<std::uint32_t>(limit);
    d.images.pixels.resize(limit * d.images.height * d.images.width);
  }
  return d;
}

// The test set: every image center-cropped to 24x24 and normalized by stoker::CenterCrop,
// collated into one batch and handed to libtorch through DLPack like the training batches.
BatchTensors test_tensors(std::shared_ptr<const IdxDataset> data) {
  const auto pool = BufferPool::create();
  const IdxReader reader(std::move(data), {.pool = pool});
  const CenterCrop center({.size = {kCropSide, kCropSide},
                           .normalize = Normalization{.scale = 255.0f, .mean = {kMean}, .std = {kStd}},
                           .pool = pool});
  std::vector<Sample> crops;
  crops.reserve(reader.dataset_size());
  for (std::uint64_t i = 0; i < reader.dataset_size(); ++i) crops.push_back(center(reader.read(i)));
  return to_tensors(make_batch(std::move(crops), *pool));
}

double accuracy(Net& model, const BatchTensors& test) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0;
  const std::int64_t n = test.samples.size(0);
  for (std::int64_t i = 0; i < n; i += 1000) {
    const std::int64_t end = std::min(n, i + 1000);
    const torch::Tensor predicted = model->forward(test.samples.slice(0, i, end)).argmax(1);
    correct += predicted.eq(test.labels.slice(0, i, end)).sum().item<std::int64_t>();
  }
  return n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0;
}

}  // namespace

void validate(const ExampleOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (o.loader != "stoker" && o.loader != "torch") fail("--loader must be stoker or torch, not '" + o.loader + "'");
  if (o.steps != "train" && o.steps != "none") fail("--steps must be train or none, not '" + o.steps + "'");
  if (o.workers < 0 || o.workers > 256) fail("--workers must be in [0, 256]");
  if (o.loader == "stoker" && o.workers < 1)
    fail("--workers 0 means loading on the training thread, which only --loader torch does; stoker needs 1 or more");
  if (o.epochs < 1) fail("--epochs must be at least 1");
  const std::size_t most = kShuffleCapacity - kMinAfterDequeue;
  if (o.batch_size < 1 || o.batch_size > most)
    fail("--batch-size must be in [1, " + std::to_string(most) + "]: what the shuffle buffer (capacity " +
         std::to_string(kShuffleCapacity) + ", min_after_dequeue " + std::to_string(kMinAfterDequeue) +
         ") can hand out at once");
  if (!(o.learning_rate > 0 && std::isfinite(o.learning_rate))) fail("--lr must be positive");
  if (o.intra_op_threads < 0 || o.intra_op_threads > 1024) fail("--intra-op-threads must be in [0, 1024]");
}

std::uint64_t ExampleReport::samples() const {
  std::uint64_t n = 0;
  for (const EpochReport& e : epochs) n += e.samples;
  return n;
}

std::uint64_t ExampleReport::batches() const {
  std::uint64_t n = 0;
  for (const EpochReport& e : epochs) n += e.batches;
  return n;
}

ExampleReport run_example(const ExampleOptions& o, const ExampleCallbacks& callbacks) {
  validate(o);
  ExampleReport report;
  report.torch_version = TORCH_VERSION;
  if (o.intra_op_threads > 0) torch::set_num_threads(o.intra_op_threads);
  report.intra_op_threads = torch::get_num_threads();
  torch::manual_seed(o.seed);  // the initial weights, and the RandomSampler's permutations

  const auto t_load = Clock::now();
  auto train = std::make_shared<const IdxDataset>(load(o, "train", o.images));
  auto test_data = std::make_shared<const IdxDataset>(load(o, "t10k", 0));
  if (train->size() == 0 || test_data->size() == 0) throw DataError(o.data, "the train or the test set is empty");
  if (train->images.height < kCropSide || train->images.width < kCropSide)
    throw DataError(o.data, "the images (" + train->shape().str() + ") are smaller than the 24x24 crops");
  report.train_images = train->size();
  report.test_images = test_data->size();
  const bool training = o.steps == "train";
  std::optional<BatchTensors> test;
  if (training) test = test_tensors(test_data);
  report.load_seconds = seconds_since(t_load);

  Net model;
  for (const auto& p : model->parameters()) report.parameters += static_cast<std::size_t>(p.numel());
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(o.learning_rate));
  if (callbacks.on_start) callbacks.on_start(report);

  // The clock starts before the loader is made: stoker's pipeline and libtorch's workers
  // both start working as they are made.
  const auto t_run = Clock::now();
  const double cpu_run = cpu_seconds();
  const std::unique_ptr<Loader> loader =
      o.loader == "stoker" ? make_stoker_loader(o, train) : make_torch_loader(o, train);
  bool first = true;
  for (std::uint32_t epoch = 1; epoch <= o.epochs; ++epoch) {
    EpochReport e{.epoch = epoch};
    double loss_sum = 0;
    std::int64_t correct = 0;
    const auto t_epoch = Clock::now();
    if (training) model->train();
    loader->run_epoch(epoch, [&](const torch::Tensor& x, const torch::Tensor& y) {
      if (first) {
        first = false;
        report.zero_copy = loader->zero_copy();
        report.zero_copy_evidence = loader->zero_copy_evidence();
        report.input = loader->describe();
        if (callbacks.on_zero_copy) callbacks.on_zero_copy(report);
      }
      const std::int64_t n = x.size(0);
      if (training) {
        optimizer.zero_grad();
        const torch::Tensor logits = model->forward(x);
        const torch::Tensor& labels = y;  // int64 from both loaders, as cross_entropy wants
        const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
        loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>() * static_cast<double>(n);
        correct += logits.argmax(1).eq(labels).sum().item<std::int64_t>();
      } else {
        report.checksum += static_cast<double>(x.data_ptr<float>()[0]);  // touch the batch, no more
      }
      e.samples += static_cast<std::uint64_t>(n);
      ++e.batches;
    });
    e.seconds = seconds_since(t_epoch);
    const auto samples = static_cast<double>(std::max<std::uint64_t>(e.samples, 1));
    e.loss = loss_sum / samples;
    e.train_accuracy = static_cast<double>(correct) / samples;
    report.epochs.push_back(e);
    if (callbacks.on_epoch) callbacks.on_epoch(e);
  }
  report.seconds = seconds_since(t_run);
  report.cpu_seconds = cpu_seconds() - cpu_run;
  if (training) report.test_accuracy = accuracy(model, *test);
  return report;
}

}  // namespace stoker::torch_example
