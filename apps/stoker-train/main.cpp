// SPDX-License-Identifier: Apache-2.0
// stoker-train [options]: trains a multilayer perceptron on Fashion-MNIST through a stoker
// pipeline, on the GPU when there is one and on the CPU when there is none, and reports test
// accuracy, throughput and how much the trainer waited for its input.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iomanip>
#include <iostream>
#include <limits>
#include <string>
#include <unistd.h>

#include "app_log.h"
#include "app_main.h"
#include "stoker/cluster/communicator.h"
#include "stoker/core/stage_error.h"
#include "stoker/core/stage_stats.h"
#include "stoker/core/state.h"
#include "stoker/stages/reader.h"
#include "train.h"

namespace stoker::train {
namespace {

using Json = nlohmann::ordered_json;

using apps::fixed;
using apps::one_line;

std::string layers(const TrainOptions& o) {
  std::string s = std::to_string(o.crop_size * o.crop_size);
  for (int w : o.hidden) (s += '-') += std::to_string(w);
  return s += "-10";
}

// What the copy counters should show, to read them against.
std::string copies_expected(const TrainOptions& o, const TrainReport& r) {
  if (r.ranks.size() > 1)
    return "two at setup (weights, test set), then per step one batch and the gradients up, the gradients back";
  if (o.augment == "cpu") return "two at setup (weights, test set), then one per batch";
  if (r.resident) return "three at setup (weights, test set, training images), then none";
  return "two at setup (weights, test set), then one per " + std::to_string(o.image_batch) + " images";
}

// --augment gpu crops with the device's kernels, which without a GPU run on the CPU backend.
std::string crops_made_on(const TrainOptions& o, const TrainReport& r) {
  if (o.augment == "cpu") return "on the cpu";
  return r.device == "cuda" ? "on the gpu" : "on the cpu (the CPU backend runs --augment gpu's kernels)";
}

// SIGINT and SIGTERM: the first stops the run between two steps, so that the pipeline stops and
// closes its occupancy log and trace whole; a second ends the process at once. A handler may run
// on any thread, in the middle of anything (a malloc, a pipeline's lock), so it only does what is
// async-signal-safe: clock_gettime, stores to lock-free atomics, _exit. The training loop reads
// the flag. A repeat within half a second is the same request: `timeout -s INT` sends the signal
// to the program and then to its process group, the program included.
std::atomic<int> g_signal{0};
std::atomic<std::int64_t> g_signal_ns{0};  // when the first came
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const std::int64_t ns = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  std::int64_t unset = 0;
  g_signal_ns.compare_exchange_strong(unset, ns);
  int none = 0;
  if (g_signal.compare_exchange_strong(none, signal)) return;
  if (ns - g_signal_ns.load() >= 500'000'000) _exit(128 + signal);
}

void handle_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the threads' blocking calls go on rather than fail with EINTR
  for (const int signal : {SIGINT, SIGTERM}) sigaction(signal, &action, nullptr);
}

// A progress bar redrawn in place, at most ten times a second; only on a terminal.
class ProgressBar {
 public:
  /// Drawn only when `enabled` and stdout is a terminal.
  ProgressBar(std::uint32_t epochs, bool enabled) : epochs_(epochs), enabled_(enabled && isatty(STDOUT_FILENO) == 1) {}

  void update(std::uint32_t epoch, std::uint64_t done, std::uint64_t total) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done != total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 40;
    const double share = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(share * kWidth);
    std::cout << "\repoch " << epoch << "/" << epochs_ << " [" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << std::setw(3)
              << static_cast<int>(share * 100) << "%" << std::flush;
  }
  void clear() {
    if (enabled_) std::cout << "\r\033[K" << std::flush;
  }

 private:
  std::uint32_t epochs_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

void add_options(CLI::App& app, TrainOptions& o, bool& json) {
  app.add_option("--data", o.data,
                 "Directory with Fashion-MNIST's train-* and t10k-* IDX files (Debian package dataset-fashion-mnist)")
      ->capture_default_str()
      ->group("Data");
  app.add_option("--epochs", o.epochs, "Passes over the training images")
      ->check(apps::in_range<std::uint32_t>(1, 100000))
      ->capture_default_str()
      ->group("Data");
  app.add_option("--batch-size", o.batch_size, "Crops per training step")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 20))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--crops", o.crops,
                 "Random crops taken of each training image per epoch (an epoch has images x crops samples)")
      ->check(apps::in_range(1, 1000))
      ->capture_default_str()
      ->group("Data");
  app.add_option("--crop-size", o.crop_size,
                 "Side of the square crops, at most 28; the test images are center-cropped to it")
      ->check(apps::in_range<std::uint32_t>(1, 28))
      ->capture_default_str()
      ->group("Data");
  app.add_option("--mirror-p", o.mirror_p, "Probability that a training crop is mirrored left-right")
      ->check(apps::in_range(0.0, 1.0))
      ->capture_default_str()
      ->group("Data");

  app.add_option("--threads", o.threads, "Threads of the pipeline, shared by all its stages (0: one per core)")
      ->check(apps::in_range(0, 1024))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_flag("--autotune", o.autotune,
               "Move threads between the crop and collate stages as the run goes, within --threads; each move is "
               "logged with its evidence (and written to the occupancy log). They start at --crop-threads and "
               "--collate-threads, 1 each unless given")
      ->group("Pipeline");
  app.add_option("--crop-threads", o.crop_threads, "Threads of the crop stage (draws each crop's window and mirror)")
      ->check(apps::in_range(1, 1024))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--collate-threads", o.collate_threads,
                 "Threads of the collate stage (cuts, mirrors and normalizes the crops into a pinned batch)")
      ->check(apps::in_range(1, 1024))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--read-queue", o.read_queue, "Capacity of the queue of images between the reader and the crop stage")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 24))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--batch-queue", o.batch_queue,
                 "Capacity of each queue of batches: batcher -> collate -> host-to-device copy -> trainer")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 16))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--staging-buffers", o.staging_buffers,
                 "Pinned host buffers batches are collated into; each waits for its copy to finish")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 16))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--shuffle-capacity", o.shuffle_capacity, "Crops the shuffle buffer holds at most")
      ->check(apps::in_range<std::size_t>(2, std::size_t{1} << 28))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--min-after-dequeue", o.min_after_dequeue,
                 "Crops the shuffle buffer keeps after each dequeue: more mixes crops of one image better")
      ->check(apps::in_range<std::size_t>(0, std::size_t{1} << 28))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--seed", o.seed, "Seed of the crops, mirrors, shuffle and initial weights")
      ->check(apps::at_least<std::uint64_t>(0))
      ->capture_default_str()
      ->group("Data");
  app.add_option("--occupancy-log", o.occupancy_log,
                 "Write the queues' fill over time to FILE (JSON Lines) for stoker-inspect; pipelined mode only")
      ->type_name("FILE")
      ->group("Output");
  app.add_option("--trace", o.trace,
                 "Write the run's timeline to FILE (Chrome trace events: open it in ui.perfetto.dev or "
                 "chrome://tracing); pipelined mode only")
      ->type_name("FILE")
      ->group("Output");

  app.add_option("--device", o.device,
                 "Where to train: auto (CUDA when a GPU is visible, else the CPU), cpu, cuda (the current GPU) or "
                 "cuda:N; with several ranks, auto and cuda give each rank of a machine its own GPU")
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--augment", o.augment,
                 "Where crops are made: cpu (stages on host threads, crops copied to the device) or gpu (whole "
                 "images copied to the device, cropped, shuffled and batched there)")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--image-batch", o.image_batch, "--augment gpu: whole images sent to the device in one copy")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 20))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--resident", o.resident,
                 "--augment gpu: upload the training images once and send only the crops to cut: auto (on a GPU "
                 "with room for them), yes or no")
      ->check(CLI::IsMember({"auto", "yes", "no"}))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--mode", o.mode,
                 "pipelined: reading, crops, copies and training overlap; sync: the same work one step after "
                 "another with no overlap (the feed-dict baseline)")
      ->check(CLI::IsMember({"pipelined", "sync"}))
      ->capture_default_str()
      ->group("Pipeline");

  app.add_option("--hidden", o.hidden, "Widths of the hidden layers, comma-separated")
      ->delimiter(',')
      ->check(apps::in_range(1, 1 << 16))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--lr", o.learning_rate, "SGD's learning rate at the start; it decays to 0 along a cosine")
      ->check(apps::above(0.0f))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--momentum", o.momentum, "SGD's momentum")
      ->check(apps::in_range(0.0f, 0.999f))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")
      ->check(apps::at_least(0.0f))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--in-flight", o.in_flight, "Training steps queued on the device before the trainer waits for it")
      ->check(apps::in_range(1, 64))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_option("--graph", o.graph,
                 "auto: on a CUDA device (one rank), each full training step is one CUDA graph launch; no: "
                 "kernel by kernel")
      ->check(CLI::IsMember({"auto", "no"}))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--limit", o.limit, "Use only the first N training and N test images (0: all); for quick runs")
      ->check(apps::in_range<std::size_t>(0, std::numeric_limits<std::uint32_t>::max()))
      ->capture_default_str()
      ->group("Data");
  app.add_option("--images", o.images,
                 "Train on image files instead of the IDX files: a list file of 'path label' lines, a folder per "
                 "class, or tar shards, local or at a URL (http(s)://, s3://; braces as WebDataset writes them) "
                 "(JPEG or PNG, decoded to gray; labels 0 to 9), cropped as --crop-size or --image-size says")
      ->type_name("PATH")
      ->group("Data");
  app.add_option("--test-images", o.test_images,
                 "With --images: the test set's image files (default: a tenth of --images drawn at random, the same "
                 "every run, held out)")
      ->type_name("PATH")
      ->group("Data");
  app.add_option("--cache", o.cache,
                 "With --images at a URL: keep whole shards in DIR, a cache on the local disk that the ranks of a "
                 "host share, so that epochs after the first read them there (docs/remote.md)")
      ->type_name("DIR")
      ->group("Data");
  app.add_option("--cache-bytes", o.cache_bytes,
                 "With --cache: the most it holds (a number of bytes, or with a unit: 500M, 20G); least recently "
                 "used shards make room")
      ->transform(CLI::AsSizeValue(false))
      ->type_name("BYTES")
      ->group("Data");
  app.add_option("--image-size", o.image_size, "With --images: the crops' side (default: --crop-size)")
      ->check(apps::in_range<std::uint32_t>(1, 1024))
      ->group("Data");
  app.add_option("--on-bad-input", o.on_bad_input,
                 "With --images, what a file that cannot be read or decoded does: fail (exit 1, naming it) or skip "
                 "(left out, counted in skipped_images)")
      ->check(CLI::IsMember({"fail", "skip"}))
      ->capture_default_str()
      ->group("Data");
  app.add_flag("--remote-workers", o.remote_workers,
               "Under mpirun -np N: rank 0 trains on whole steps, and ranks 1 to N-1 read, crop, shuffle, batch "
               "and collate, taking shards of every epoch from rank 0 as they need them, and send it the batches "
               "(docs/scale-out.md)")
      ->group("Pipeline");
  app.add_option("--rank-timeout", o.rank_timeout,
                 "Under mpirun: seconds a rank waits for another (a collective, a worker's batches, rank 0's "
                 "answers) before it ends the job, naming the rank that stopped answering and what it was doing; "
                 "0: as long as it takes")
      ->check(apps::at_least(0.0))
      ->capture_default_str()
      ->group("Pipeline");
  app.add_flag("--deterministic", o.deterministic,
               "Make the pipeline yield the same batches in the same order whatever its threads, so that "
               "--resume goes on exactly, bit for bit")
      ->group("Pipeline");
  app.add_option("--checkpoint", o.checkpoint,
                 "Write the model, its optimizer and the pipeline's state to DIR/checkpoint at the end, and every "
                 "--checkpoint-every steps; each write replaces the last whole")
      ->type_name("DIR")
      ->group("Output");
  app.add_option("--checkpoint-every", o.checkpoint_every, "Training steps between checkpoints (0: only at the end)")
      ->check(apps::at_least<std::uint64_t>(0))
      ->capture_default_str()
      ->group("Output");
  app.add_option("--resume", o.resume,
                 "Go on from DIR/checkpoint where that run stood, mid-epoch included, with the same options: with "
                 "--deterministic the rest of the run is the same as without the stop, bit for bit; without, the "
                 "epoch goes on with every sample it had not trained on, once each")
      ->type_name("DIR")
      ->group("Data");
  app.add_flag("--json", json, "Also print the result as one JSON object on the last line of stdout")->group("Output");
}

// A digest as 16 hex digits: JSON readers that hold numbers in doubles would round it.
Json digest_json(std::uint64_t digest, bool known = true) {
  if (!known) return nullptr;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

Json to_json(const TrainOptions& o, const TrainReport& r) {
  Json epochs = Json::array();
  for (const EpochReport& e : r.epochs)
    epochs.push_back({{"epoch", e.epoch},
                      // The resumed epoch lacks what a checkpoint without digests trained of it.
                      {"digest", digest_json(e.digest, r.digest_known || e.resumed_samples == 0)},
                      {"loss", e.loss},
                      {"train_accuracy", e.train_accuracy},
                      {"test_accuracy", e.test_accuracy},
                      {"samples", e.samples},
                      {"resumed_samples", e.resumed_samples},
                      {"seconds", e.train_seconds},
                      {"samples_per_s", e.samples_per_s()},
                      {"starvation_pct", 100 * e.starvation()},
                      {"device_wait_s", e.device_wait_seconds}});
  Json out;
  out["test_accuracy"] = r.test_accuracy();
  out["epochs"] = r.epochs.size();
  out["samples_per_s"] = r.samples_per_s();
  out["starvation_pct"] = 100 * r.starvation();
  out["batches"] = r.batches();
  out["h2d_copies"] = r.transfers.h2d_copies;
  out["d2h_copies"] = r.transfers.d2h_copies;
  out["device"] = r.device;
  out["device_name"] = r.device_name;
  out["mode"] = r.mode;
  out["augment"] = o.augment;
  out["resident"] = r.resident;
  out["graph"] = r.graph;
  out["graph_steps"] = r.graph_steps;
  std::uint64_t all_samples = r.samples(), all_trained = r.trained_samples();  // every rank's
  if (!r.ranks.empty()) {
    all_samples = all_trained = 0;
    for (const auto& rank : r.ranks) {
      all_samples += rank.samples;
      all_trained += rank.trained_samples;
    }
  }
  out["samples"] = all_samples;
  out["trained_samples"] = all_trained;
  out["digest"] = digest_json(r.digest, r.digest_known);
  if (r.nothing_to_train) out["nothing_to_train"] = true;
  out["train_seconds"] = r.train_seconds();
  out["h2d_bytes"] = r.transfers.h2d_bytes;
  out["d2h_bytes"] = r.transfers.d2h_bytes;
  out["train_images"] = r.train_images;
  out["test_images"] = r.test_images;
  out["skipped_images"] = r.skipped_images;
  out["model"] = "mlp " + layers(o);
  out["parameters"] = r.parameters;
  out["batch_size"] = o.batch_size;
  out["crops"] = o.crops;
  out["seed"] = o.seed;
  out["world_size"] = std::max<std::size_t>(r.ranks.size(), 1 + r.remote_workers);
  if (r.remote_workers != 0) {
    out["remote_workers"] = r.remote_workers;
    out["remote_bytes"] = r.remote_bytes;
    out["remote_peak_in_flight"] = r.remote_peak;
    Json workers = Json::array();
    // Images of the data set (not crops, which "samples" counts): what each was handed to make batches of.
    for (const auto& w : r.workers) workers.push_back({{"rank", w.rank}, {"images", w.images}});
    out["workers"] = std::move(workers);
    out["remote_lost"] = r.remote_lost;
  }
  if (!r.ranks.empty()) {
    Json ranks = Json::array();
    for (std::size_t i = 0; i < r.ranks.size(); ++i)
      ranks.push_back(
          {{"rank", i},
           {"samples", r.ranks[i].samples},
           {"digest", digest_json(r.ranks[i].digest)},
           {"samples_per_s", r.ranks[i].samples_per_s()},
           {"starvation_pct", 100 * r.ranks[i].starvation()},
           {"exchange_wait_pct",
            r.ranks[i].train_seconds > 0 ? 100 * r.ranks[i].exchange_wait_seconds / r.ranks[i].train_seconds : 0.0}});
    out["ranks"] = std::move(ranks);
  }
  out["per_epoch"] = std::move(epochs);
  return out;
}

// Every rank of a job (mpirun -np N stoker-train) runs this; rank 0 alone prints.
int run(int argc, char** argv, cluster::Communicator& ranks) {
  const bool lead = ranks.rank() == 0;
  if (!lead) std::cout.setstate(std::ios::failbit);
  CLI::App app{
      "stoker-train: trains a multilayer perceptron on Fashion-MNIST crops fed by a stoker pipeline\n"
      "(reader -> random crops + mirror -> shuffle buffer -> batch -> pinned staging -> copy -> trainer),\n"
      "on the GPU when there is one, and reports test accuracy, samples/s and input starvation.\n"
      "See " +
      apps::doc_page("train.md") + "."};
  app.name("stoker-train");
  TrainOptions o;
  bool json = false;
  add_options(app, o, json);
  if (const auto done = apps::parse_command_line(app, argc, argv)) return *done;
  if (o.image_size != 0) {
    if (app.count("--crop-size") != 0)
      throw apps::UsageError("--image-size and --crop-size both set the crops' side: give one of them");
    o.crop_size = o.image_size;
  }

  // The default batch divides among any number of ranks; a batch given does, or is refused.
  std::string batch_note;
  if (app.count("--batch-size") == 0 && !o.remote_workers && ranks.size() > 1) {
    const std::size_t given = o.batch_size;
    o.batch_size = default_batch_for(given, ranks.size());
    if (o.batch_size != given)
      batch_note = " (the default " + std::to_string(given) + " rounded to a multiple of " +
                   std::to_string(ranks.size()) + " ranks)";
  }
  if (o.autotune) {  // start small: the tuner adds threads where they are needed
    if (app.count("--crop-threads") == 0) o.crop_threads = 1;
    if (app.count("--collate-threads") == 0) o.collate_threads = 1;
  }

  // Under mpirun the launcher passes a signal on to every rank, which would each stop at another
  // step and leave the others waiting in a collective: there the default (the end) is better.
  if (ranks.size() == 1) handle_stop_signals();

  ProgressBar bar(o.epochs, lead);
  TrainCallbacks callbacks;
  callbacks.on_start = [&](const TrainReport& r) {
    if (o.images.empty())
      std::cout << "data:   " << r.train_images << " training and " << r.test_images << " test images from " << o.data
                << " (" << fixed(r.load_seconds, 1) << " s to load, center-crop and upload the test set)\n";
    else
      std::cout << "data:   " << r.train_images << " training images from " << o.images << "; " << r.test_images
                << " test images from " << r.test_source
                << (r.skipped_images ? " (" + std::to_string(r.skipped_images) + " bad files skipped)" : "") << " ("
                << fixed(r.load_seconds, 1) << " s to decode, center-crop and upload them)\n";
    std::cout << "device: " << r.device_name << "\n"
              << "model:  MLP " << layers(o) << " (" << r.parameters << " parameters), SGD momentum " << o.momentum
              << ", lr " << o.learning_rate << " cosine to 0, weight decay " << o.weight_decay << "\n"
              << "input:  " << o.mode << ", " << o.crops << " random " << o.crop_size << "x" << o.crop_size
              << " crops per image (mirror p " << o.mirror_p << ") " << crops_made_on(o, r) << ", shuffle "
              << o.shuffle_capacity << "/" << o.min_after_dequeue << ", batches of " << o.batch_size << batch_note
              << ", " << apps::plural(o.epochs, "epoch") << " of "
              << r.train_images * static_cast<std::uint64_t>(o.crops) << " samples\n";
    if (o.remote_workers)
      std::cout << "ranks:  " << ranks.size() << " (" << ranks.engine() << "): rank 0 trains; "
                << (ranks.size() == 2 ? "rank 1 reads" : "ranks 1 to " + std::to_string(ranks.size() - 1) + " read")
                << ", crop, shuffle, batch and collate, and send it the batches\n";
    else if (ranks.size() > 1)
      std::cout << "ranks:  " << ranks.size() << " (" << ranks.engine() << "), each with its share of every epoch and "
                << o.batch_size / static_cast<std::size_t>(ranks.size())
                << " crops of every step; gradients averaged every step\n";
    if (!r.binding.empty()) {
      std::cout.flush();
      std::cerr << "stoker-train: warning: " << r.binding << std::endl;
    }
  };
  callbacks.on_batch = [&](std::uint32_t epoch, std::uint64_t done, std::uint64_t total) {
    bar.update(epoch, done, total);
  };
  callbacks.stop_requested = [] { return g_signal.load() != 0; };
  callbacks.on_epoch = [&](const EpochReport& e) {
    bar.clear();
    std::cout << "epoch " << std::setw(2) << e.epoch << "/" << o.epochs << "  loss " << fixed(e.loss, 4) << "  train "
              << fixed(e.train_accuracy, 4) << "  test " << fixed(e.test_accuracy, 4) << "  " << std::setw(7)
              << static_cast<long long>(e.samples_per_s()) << " samples/s  starvation " << std::setw(5)
              << fixed(100 * e.starvation(), 1) << "%  " << fixed(e.train_seconds, 1) << " s"
              << (e.resumed_samples != 0
                      ? "  (resumed after " + std::to_string(e.resumed_samples) + " samples; samples/s counts the rest)"
                      : "")
              << std::endl;
  };

  try {
    apps::log_level_from_environment();
    // Before the data is read: a bad combination or a path that cannot be written is a bad
    // argument, not a failed run.
    validate(o, ranks.size());
    if (!o.occupancy_log.empty()) apps::prepare_output_file("--occupancy-log", o.occupancy_log);
    if (!o.trace.empty()) apps::prepare_output_file("--trace", o.trace);
    if (!o.checkpoint.empty()) apps::prepare_output_directory("--checkpoint", o.checkpoint);
    const TrainReport r = run_training(o, callbacks, &ranks);
    if (r.worker) return 0;  // rank 0 reports
    if (r.interrupted) {
      bar.clear();
      const int signal = g_signal.load();
      std::cout.flush();
      std::cerr << "stoker-train: interrupted by " << (signal == SIGTERM ? "SIGTERM" : "SIGINT") << " in epoch "
                << r.interrupted->epoch << "/" << o.epochs << " after " << r.interrupted->samples << " of "
                << r.train_images * static_cast<std::uint64_t>(o.crops) << " samples"
                << (o.checkpoint.empty() ? "" : "; checkpoint written to " + o.checkpoint) << "\n";
      return 128 + signal;
    }
    if (r.nothing_to_train) {
      std::cout << "result: nothing left to train: the run in " << o.resume << " had finished its "
                << apps::plural(o.epochs, "epoch") << "; its model's test accuracy " << fixed(r.test_accuracy(), 4)
                << " (" << r.device << ")\n";
      if (json) std::cout << to_json(o, r).dump() << std::endl;
      return 0;
    }
    std::cout << "\n";
    if (r.pipeline) {
      print_summary(std::cout, *r.pipeline);
      std::cout << "\n";
    }
    std::cout << "copies: " << r.transfers.h2d_copies << " host-to-device (" << format_bytes(r.transfers.h2d_bytes)
              << "), " << r.transfers.d2h_copies << " device-to-host (" << format_bytes(r.transfers.d2h_bytes)
              << "): " << copies_expected(o, r) << "; one read-back per epoch\n"
              << "result: test accuracy " << fixed(r.test_accuracy(), 4) << " after "
              << apps::plural(r.epochs.size(), "epoch") << ", " << static_cast<long long>(r.samples_per_s())
              << " samples/s, starvation " << fixed(100 * r.starvation(), 1) << "% (" << r.mode << ", " << r.device
              << ")\n";
    if (!o.images.empty() && o.on_bad_input == "skip")
      std::cout << "images: " << r.skipped_images
                << " bad files skipped (--on-bad-input skip; a bad training file counts once per epoch)\n";
    if (r.remote_workers != 0)
      std::cout << "remote: " << r.remote_workers << " workers sent " << format_bytes(r.remote_bytes)
                << " of batches; at most " << r.remote_peak << " were on their way at once"
                << (r.remote_lost.empty() ? std::string()
                                          : "; " + cluster::rank_list(r.remote_lost) +
                                                " lost (silent for --rank-timeout): the others made their work")
                << "\n";
    if (json) std::cout << to_json(o, r).dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    // Bad options or data: every rank finds the same, and rank 0 says it.
    if (!dynamic_cast<const std::invalid_argument*>(&e) && !dynamic_cast<const DataError*>(&e) &&
        !dynamic_cast<const StateError*>(&e) && !dynamic_cast<const cluster::RankMismatch*>(&e))
      throw;
    bar.clear();
    if (lead) std::cerr << "stoker-train: " << one_line(e.what()) << '\n';
    return 2;
  }
}

}  // namespace
}  // namespace stoker::train

int main(int argc, char** argv) {
  return stoker::apps::guarded_main(
      "stoker-train",
      [](int argc, char** argv) {
        return stoker::cluster::run_world(
            argc, argv, [&](stoker::cluster::Communicator& ranks) { return stoker::train::run(argc, argv, ranks); });
      },
      argc, argv);
}
