// SPDX-License-Identifier: Apache-2.0
// stoker-torch-example [options]: a client of stoker written against libtorch. It trains a small
// CNN on Fashion-MNIST crops with libtorch's own optimizer, on the CPU, fed either by a stoker
// pipeline (its batches reach libtorch through DLPack, without a copy) or by libtorch's own
// DataLoader doing the same job, and reports throughput and test accuracy. See docs/torch.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "app_log.h"
#include "app_main.h"
#include "example.h"
#include "stoker/stages/reader.h"

namespace stoker::torch_example {
namespace {

using Json = nlohmann::ordered_json;
using apps::fixed;
using apps::one_line;

void add_options(CLI::App& app, ExampleOptions& o, bool& json) {
  app.add_option("--loader", o.loader,
                 "Where the batches come from: stoker (a stoker pipeline, handed over through DLPack) or torch "
                 "(libtorch's DataLoader with a RandomSampler and the Stack collation)")
      ->check(CLI::IsMember({"stoker", "torch"}))
      ->capture_default_str();
  app.add_option("--workers", o.workers,
                 "stoker: the pipeline's threads (and bodies of its crop and collate stages), at least 1; torch: "
                 "the DataLoader's worker threads (0: load on the training thread)")
      ->check(apps::in_range(0, 256))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the training images")
      ->check(apps::in_range<std::uint32_t>(1, 100000))
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Crops per batch (at most 8000, what the shuffle buffer hands out)")
      ->check(apps::in_range<std::size_t>(1, 8000))
      ->capture_default_str();
  app.add_option("--images", o.images, "Use only the first N training images (0: all 60000); for short runs")
      ->check(apps::in_range<std::size_t>(0, std::size_t{1} << 32))
      ->capture_default_str();
  app.add_option("--lr", o.learning_rate, "Adam's learning rate")->check(apps::above(0.0))->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the crops, mirrors, shuffles and initial weights")
      ->check(apps::at_least<std::uint64_t>(0))
      ->capture_default_str();
  app.add_option("--steps", o.steps,
                 "train: a training step per batch; none: only touch each batch (its first element), to measure "
                 "the loader alone")
      ->check(CLI::IsMember({"train", "none"}))
      ->capture_default_str();
  app.add_option("--intra-op-threads", o.intra_op_threads,
                 "libtorch's intra-op threads for the model (0: libtorch's own default; 1 on the 2-core dev machine)")
      ->check(apps::in_range(0, 1024))
      ->capture_default_str();
  app.add_option("--data", o.data,
                 "Directory with Fashion-MNIST's train-* and t10k-* IDX files (Debian package dataset-fashion-mnist)")
      ->capture_default_str();
  app.add_flag("--json", json, "Also print the result as one JSON object on the last line of stdout");
}

Json to_json(const ExampleOptions& o, const ExampleReport& r) {
  Json epochs = Json::array();
  for (const EpochReport& e : r.epochs)
    epochs.push_back({{"epoch", e.epoch},
                      {"samples", e.samples},
                      {"batches", e.batches},
                      {"seconds", e.seconds},
                      {"samples_per_s", e.samples_per_s()},
                      {"loss", e.loss},
                      {"train_accuracy", e.train_accuracy}});
  Json out;
  out["loader"] = o.loader;
  out["workers"] = o.workers;
  out["epochs"] = r.epochs.size();
  out["steps"] = o.steps;
  out["samples_per_s"] = r.samples_per_s();
  if (o.steps == "none")
    out["crops_per_s_input_only"] = r.samples_per_s();
  else
    out["test_accuracy"] = r.test_accuracy.value_or(0.0);
  out["zero_copy"] = r.zero_copy;
  out["device"] = "cpu";
  out["samples"] = r.samples();
  out["batches"] = r.batches();
  out["seconds"] = r.seconds;
  out["cpu_seconds"] = r.cpu_seconds;
  out["batch_size"] = o.batch_size;
  out["train_images"] = r.train_images;
  out["test_images"] = r.test_images;
  out["model"] = "cnn conv1x16x3 relu maxpool2 conv16x32x3 relu maxpool2 linear512x10";
  out["parameters"] = r.parameters;
  out["optimizer"] = "adam";
  out["lr"] = o.learning_rate;
  out["seed"] = o.seed;
  out["intra_op_threads"] = r.intra_op_threads;
  out["hardware_threads"] = std::thread::hardware_concurrency();
  out["torch_version"] = r.torch_version;
  if (o.steps == "none") out["checksum"] = r.checksum;
  out["per_epoch"] = std::move(epochs);
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{
      "stoker-torch-example: trains a small CNN on Fashion-MNIST crops with libtorch, on the CPU, fed by a\n"
      "stoker pipeline through DLPack (--loader stoker) or by libtorch's own DataLoader doing the same job\n"
      "(--loader torch), and reports samples/s and test accuracy. See " +
      apps::doc_page("torch.md") + "."};
  app.name("stoker-torch-example");
  ExampleOptions o;
  o.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json = false;
  add_options(app, o, json);
  if (const auto done = apps::parse_command_line(app, argc, argv)) return *done;
  apps::log_level_from_environment();

  ExampleCallbacks callbacks;
  callbacks.on_start = [&](const ExampleReport& r) {
    std::cout << "data:   " << r.train_images << " training images (" << r.train_images * kCropsPerImage
              << " crops an epoch), " << r.test_images << " test images from " << o.data << " ("
              << fixed(r.load_seconds, 1) << " s to load" << (o.steps == "train" ? " and center-crop the test set" : "")
              << ")\n"
              << "model:  CNN conv 1->16 3x3, relu, maxpool 2, conv 16->32 3x3, relu, maxpool 2, linear 512->10 ("
              << r.parameters << " parameters), Adam lr " << o.learning_rate << "; libtorch " << r.torch_version
              << " on the CPU, " << r.intra_op_threads << " intra-op threads\n"
              << "steps:  "
              << (o.steps == "train" ? "train" : "none (input only: each batch is touched, not trained on)") << ", "
              << apps::plural(o.epochs, "epoch") << "\n";
  };
  callbacks.on_zero_copy = [&](const ExampleReport& r) {
    std::cout << "input:  " << r.input << "\n"
              << "zero copy: " << (r.zero_copy ? "yes" : "no") << " (" << r.zero_copy_evidence << ")" << std::endl;
  };
  callbacks.on_epoch = [&](const EpochReport& e) {
    std::cout << "epoch " << e.epoch << "/" << o.epochs;
    if (o.steps == "train") std::cout << "  loss " << fixed(e.loss, 4) << "  train " << fixed(e.train_accuracy, 4);
    std::cout << "  " << e.samples << " samples in " << e.batches << " batches  "
              << static_cast<long long>(e.samples_per_s()) << " samples/s  " << fixed(e.seconds, 1) << " s"
              << std::endl;
  };

  try {
    const ExampleReport r = run_example(o, callbacks);
    std::cout << "result: " << o.loader << " loader, " << o.workers
              << " workers: " << static_cast<long long>(r.samples_per_s()) << " samples/s over " << r.samples()
              << " samples in " << fixed(r.seconds, 1) << " s"
              << (o.steps == "train" ? ", test accuracy " + fixed(r.test_accuracy.value_or(0.0), 4) : ", input only")
              << ", zero copy " << (r.zero_copy ? "yes" : "no") << "\n";
    if (json) std::cout << to_json(o, r).dump() << std::endl;
    return 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << "stoker-torch-example: " << one_line(e.what()) << '\n';
    return 2;
  } catch (const DataError& e) {
    std::cerr << "stoker-torch-example: " << one_line(e.what()) << '\n';
    return 2;
  }
}

}  // namespace
}  // namespace stoker::torch_example

int main(int argc, char** argv) {
  return stoker::apps::guarded_main("stoker-torch-example", stoker::torch_example::run, argc, argv);
}
