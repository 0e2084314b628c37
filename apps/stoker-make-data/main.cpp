// SPDX-License-Identifier: Apache-2.0
// stoker-make-data KIND DIR [options]: writes an image data set to disk, with nothing to
// download: an ImageNet-like folder of JPEGs, or Fashion-MNIST as PNG files.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>

#include "app_main.h"
#include "make_data.h"
#include "stoker/stages/idx.h"

namespace stoker::apps {
namespace {

nlohmann::json describe(const std::string& kind, const std::string& dir, const MadeData& made, double seconds) {
  nlohmann::json j{{"kind", kind},
                   {"dir", dir},
                   {"images", made.images},
                   {"bytes", made.bytes},
                   {"mean_bytes", made.images ? double(made.bytes) / made.images : 0.0},
                   {"bits_per_pixel", made.pixels ? 8.0 * made.bytes / made.pixels : 0.0},
                   {"progressive", made.progressive},
                   {"gray", made.gray},
                   {"seconds", seconds}};
  for (const auto& l : made.lists) j["lists"].push_back(l.string());
  for (const auto& s : made.shards) j["shards"].push_back(s.string());
  return j;
}

// A line on stderr at most every `seconds` while files are written: "stoker-make-data: 1200 of
// 50000 images (2%)". Nothing when `seconds` is 0, or for a run shorter than that.
Progress progress_line(double seconds) {
  if (seconds <= 0) return {};
  using Clock = std::chrono::steady_clock;
  struct State {
    std::mutex mutex;
    Clock::duration every;
    Clock::time_point next;
  };
  auto state = std::make_shared<State>();
  state->every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  state->next = Clock::now() + state->every;
  return [state](const char* what, std::uint64_t done, std::uint64_t total) {
    const auto now = Clock::now();
    const std::unique_lock lock(state->mutex, std::try_to_lock);  // a writer never waits for it
    if (!lock || now < state->next) return;
    state->next = now + state->every;
    std::cerr << "stoker-make-data: " << done << " of " << total << " " << what << " (" << 100 * done / total << "%)\n";
  };
}

int run(int argc, char** argv) {
  CLI::App app{
      "stoker-make-data: writes an image data set to disk, with nothing to download.\n"
      "  imagenet DIR       JPEGs like ImageNet's (sizes, qualities, natural-like content), a folder per\n"
      "                     class, a list file and optionally WebDataset tar shards\n"
      "  fashion-mnist DIR  Fashion-MNIST (from the Debian package's IDX files) as PNG files\n"
      "See " +
      apps::doc_page("images.md") + "."};
  app.name("stoker-make-data");
  app.require_subcommand(1);
  bool json = false;
  int threads = 0;
  std::string dir;

  ImageNetLikeOptions imagenet;
  auto* inet = app.add_subcommand("imagenet", "An ImageNet-like folder of JPEGs");
  inet->add_option("DIR", dir, "Where to write: DIR/train/class_NNN/img_NNNNNN.jpg, DIR/train.txt")->required();
  inet->add_option("--images", imagenet.images, "How many images")->capture_default_str()->check(at_least(1u));
  inet->add_option("--classes", imagenet.classes, "How many classes (image i is in class i % classes)")
      ->capture_default_str()
      ->check(at_least(1u));
  inet->add_option("--min-side", imagenet.min_side, "Shortest side, pixels")
      ->capture_default_str()
      ->check(at_least(8u));
  inet->add_option("--max-side", imagenet.max_side, "Longest side, pixels")->capture_default_str()->check(at_least(8u));
  inet->add_option("--progressive", imagenet.progressive, "Share of progressive JPEGs")
      ->capture_default_str()
      ->check(in_range(0.0, 1.0));
  inet->add_option("--gray", imagenet.gray, "Share of grayscale JPEGs")
      ->capture_default_str()
      ->check(in_range(0.0, 1.0));
  inet->add_option("--tar-shards", imagenet.tar_shards,
                   "Also write the images as this many WebDataset tar shards, DIR/shards/train-NNNN.tar, each with "
                   "its wds2idx index")
      ->capture_default_str();
  inet->add_option("--seed", imagenet.seed, "Every file follows from the seed")->capture_default_str();

  std::string source = kFashionMnistDir;
  std::uint32_t limit = 0;
  auto* fashion = app.add_subcommand("fashion-mnist", "Fashion-MNIST as PNG files");
  fashion->add_option("DIR", dir, "Where to write: DIR/{train,test}/<label>/NNNNN.png, DIR/train.txt, DIR/test.txt")
      ->required();
  fashion->add_option("--from", source, "The folder of the IDX files")->capture_default_str();
  fashion->add_option("--limit", limit, "Only the first N images of each split (0: all)")->capture_default_str();

  double progress_s = 5;
  for (auto* sub : {inet, fashion}) {
    sub->add_option("--threads", threads, "Threads that write (0: one per core); the files do not depend on it")
        ->capture_default_str()
        ->check(at_least(0));
    sub->add_option("--progress", progress_s, "Say on stderr how far it got, every this many seconds (0: never)")
        ->capture_default_str()
        ->check(in_range(0.0, 86400.0));
    sub->add_flag("--json", json, "Also print the result as one JSON object on the last line of stdout");
  }
  if (const auto done = parse_command_line(app, argc, argv)) return *done;
  if (imagenet.min_side > imagenet.max_side)
    throw UsageError("--min-side " + std::to_string(imagenet.min_side) + " is over --max-side " +
                     std::to_string(imagenet.max_side));

  const auto t0 = std::chrono::steady_clock::now();
  const bool is_imagenet = inet->parsed();
  imagenet.threads = threads;
  imagenet.progress = progress_line(progress_s);
  const MadeData made = is_imagenet ? make_imagenet_like(dir, imagenet)
                                    : export_fashion_mnist(dir, source, limit, threads, imagenet.progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "stoker-make-data: wrote " << made.images << (is_imagenet ? " JPEGs" : " PNGs") << " ("
            << fixed(made.bytes / 1048576.0, 1) << " MiB, "
            << fixed(8.0 * made.bytes / std::max<std::uint64_t>(1, made.pixels), 2) << " bits/pixel";
  if (is_imagenet) std::cout << ", " << made.progressive << " progressive, " << made.gray << " gray";
  std::cout << ") into " << dir << " in " << fixed(seconds, 1) << " s\n";
  for (const auto& l : made.lists) std::cout << "  list: " << l.string() << '\n';
  if (!made.shards.empty())
    std::cout << "  " << plural(made.shards.size(), "tar shard") << ": " << made.shards.front().string() << " ...\n";
  if (json) std::cout << describe(is_imagenet ? "imagenet" : "fashion-mnist", dir, made, seconds).dump() << '\n';
  return 0;
}

}  // namespace
}  // namespace stoker::apps

int main(int argc, char** argv) {
  return stoker::apps::guarded_main("stoker-make-data", stoker::apps::run, argc, argv);
}
