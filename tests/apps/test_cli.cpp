// SPDX-License-Identifier: Apache-2.0
// The programs through their command lines: what a user types, what the programs print and
// with which exit status, and the files they leave behind.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <utility>
#include <vector>

#include "stoker/config.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/sample.h"
#include "stoker/version.h"
#include "support.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using stoker::test::TempDir;
using namespace std::chrono_literals;

const std::string kTrain = STOKER_TRAIN;
const std::string kInspect = STOKER_INSPECT;
// stoker-bench is not built in sanitizer builds (apps/CMakeLists.txt): its cases and rows run
// where it is, and a row whose program is "" is left out.
#ifdef STOKER_BENCH
const std::string kBench = STOKER_BENCH;
#else
const std::string kBench;
#endif

bool have_fashion_mnist() { return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A program running with its stdout and stderr in files of `dir`.
class Child {
 public:
  Child(const std::vector<std::string>& args, const TempDir& dir) {
    static int children = 0;
    const std::string tag = std::to_string(children++);
    out_ = dir / ("out" + tag);
    err_ = dir / ("err" + tag);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int failed = posix_spawn(&pid_, argv[0], &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    REQUIRE(failed == 0);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void signal(int which) const { ::kill(pid_, which); }
  /// The exit status, or minus the signal that ended it.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  pid_t pid_ = -1;
  fs::path out_, err_;
};

// Waits until `path` has some bytes in it, or 30 s.
bool await_bytes(const fs::path& path) {
  for (const auto t0 = stoker::test::Clock::now(); stoker::test::Clock::now() - t0 < 30s;) {
    std::error_code ignored;
    if (fs::file_size(path, ignored) > 0 && !ignored) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

}  // namespace

TEST_CASE("stoker-train stopped by SIGINT or SIGTERM mid-epoch stops cleanly and exits 130 or 143" *
          doctest::timeout(90)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const TempDir dir("cli");
  for (const int signal : {SIGINT, SIGTERM}) {
    const std::string name = signal == SIGINT ? "SIGINT" : "SIGTERM";
    CAPTURE(name);
    const fs::path log = dir / (name + ".jsonl"), trace = dir / (name + ".trace.json");
    Child train({kTrain, "--device", "cpu", "--epochs", "2", "--limit", "20000", "--occupancy-log", log.string(),
                 "--trace", trace.string()},
                dir);
    // The log fills once the pipeline runs: the run is in its first epoch, far from its end.
    REQUIRE(await_bytes(log));
    train.signal(signal);
    train.signal(signal);  // as `timeout -s INT` does: to the program, then to its process group
    const int status = train.wait();
    const std::string err = train.err();
    INFO("stderr: " << err);
    CHECK(status == 128 + signal);
    CHECK(err.find("stoker-train: interrupted by " + name + " in epoch 1/2 after ") == 0);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);

    Child inspect({kInspect, log.string()}, dir);
    CHECK(inspect.wait() == 0);
    CHECK(inspect.err().empty());  // no torn line skipped, nothing to warn of
    nlohmann::json events;
    CHECK_NOTHROW(events = nlohmann::json::parse(read_file(trace)));
    CHECK(events["traceEvents"].size() > 1);
  }
}

TEST_CASE("a bad number on the command line is refused with exit status 2 and one short line naming the option" *
          doctest::timeout(60)) {
  const TempDir dir("cli");
  const std::string& bench = kBench;
  // Arguments that would run (a missing data set, short benchmarks) end quickly should the
  // bad number go through.
  const std::vector<std::string> train{kTrain, "--data", (dir / "absent").string()};
  const std::vector<std::string> pipeline{bench, "pipeline", "--repeats", "1", "--items", "1000"};
  const struct {
    std::vector<std::string> base;
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {train, {"--lr", "0"}, "stoker-train: --lr: must be > 0, got 0"},
      {train, {"--epochs", "abc"}, "stoker-train: --epochs: must be a whole number, got abc"},
      {train, {"--epochs", "0"}, "stoker-train: --epochs: must be 1 to 100000, got 0"},
      {train, {"--seed", "-5"}, "stoker-train: --seed: must be 0 or more, got -5"},
      {train, {"--hidden", "64,-1"}, "stoker-train: --hidden: must be 1 to 65536, got -1"},
      {train, {"--momentum", "1"}, "stoker-train: --momentum: must be 0 to 0.999, got 1"},
      {train, {"--limit", "4294967296"}, "stoker-train: --limit: must be 0 to 4294967295, got 4294967296"},
      {pipeline, {"--queue", "0"}, "stoker-bench: --queue: must be 1 to 1048576, got 0"},
      {pipeline, {"--threads", "-3"}, "stoker-bench: --threads: must be 0 to 1024, got -3"},
      {pipeline, {"--overhead-items", "0"}, "stoker-bench: --overhead-items: must be at least 1, got 0"},
  };
  for (const auto& c : cases) {
    if (c.base.front().empty()) continue;  // stoker-bench, not built here
    std::vector<std::string> args = c.base;
    args.insert(args.end(), c.args.begin(), c.args.end());
    Child program(args, dir);
    CAPTURE(c.says);
    CHECK(program.wait() == 2);
    const std::string err = program.err();
    CHECK(err.find(c.says + " (see ") == 0);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
}

TEST_CASE("an output path that is a directory, and a bad --stages list, are bad arguments: exit status 2, one line" *
          doctest::timeout(60)) {
  const TempDir dir("cli");
  const std::string& bench = kBench;
  const std::string taken = dir.path().string();  // a directory
  // A short run on the data set, should the path go through to the pipeline.
  const std::vector<std::string> train{kTrain, "--device", "cpu", "--limit", "100", "--epochs", "1"};
  const struct {
    std::vector<std::string> base;
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {train, {"--occupancy-log", taken}, "stoker-train: --occupancy-log " + taken + ": is a directory\n"},
      {train, {"--trace", taken}, "stoker-train: --trace " + taken + ": is a directory\n"},
      {{bench, "pipeline", "--repeats", "1", "--items", "1000", "--overhead-items", "1000"},
       {"--stages", "garbage"},
       "stoker-bench: --stages: 'garbage' is not US:THREADS (e.g. 20:1) (see stoker-bench --help)\n"},
  };
  for (const auto& c : cases) {
    if (c.base.front().empty()) continue;  // stoker-bench, not built here
    std::vector<std::string> args = c.base;
    args.insert(args.end(), c.args.begin(), c.args.end());
    Child program(args, dir);
    CAPTURE(c.says);
    CHECK(program.wait() == 2);
    CHECK(program.err() == c.says);
  }
}

TEST_CASE("stoker-inspect --plot creates the plot's missing parent directories, and says so" * doctest::timeout(30)) {
  const TempDir dir("cli");
  const fs::path log = dir / "run.jsonl";
  std::ofstream(log) << R"({"type":"sample","t":0.0,"queue":"read->consumer","producer":"read",)"
                        R"("consumer":"consumer","size":1,"capacity":4})"
                     << "\n"
                     << R"({"type":"sample","t":0.05,"queue":"read->consumer","producer":"read",)"
                        R"("consumer":"consumer","size":3,"capacity":4})"
                     << "\n";
  const fs::path plot = dir / "plots" / "today" / "run.svg";
  Child inspect({kInspect, log.string(), "--plot", plot.string()}, dir);
  const int status = inspect.wait();
  INFO("stderr: " << inspect.err());
  CHECK(status == 0);
  CHECK(fs::file_size(plot) > 0);
  CHECK(inspect.err() ==
        "note: --plot " + plot.string() + ": created the folder " + plot.parent_path().string() + "\n");
  // A second run finds the folder there: nothing to say.
  Child again({kInspect, log.string(), "--plot", plot.string()}, dir);
  CHECK(again.wait() == 0);
  CHECK(again.err().empty());
}

TEST_CASE("stoker-train says where the crops were made, and counts one epoch in the singular" * doctest::timeout(60)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const TempDir dir("cli");
  Child train({kTrain, "--device", "cpu", "--augment", "gpu", "--limit", "100", "--epochs", "1"}, dir);
  const int status = train.wait();
  const std::string out = train.out();
  INFO("stdout: " << out << "\nstderr: " << train.err());
  REQUIRE(status == 0);
  CHECK(out.find("crops per image (mirror p 0.5) on the cpu (the CPU backend runs --augment gpu's kernels)") !=
        std::string::npos);
  CHECK(out.find(", 1 epoch of 500 samples\n") != std::string::npos);
  CHECK(out.find(" after 1 epoch, ") != std::string::npos);
  CHECK(out.find("1 epochs") == std::string::npos);
}

TEST_CASE("a mistyped option is refused with the option it most likely meant" * doctest::timeout(60)) {
  const TempDir dir("cli");
  const struct {
    std::vector<std::string> args;
    std::string says;  // the end of the one line on stderr
  } cases[] = {
      {{kTrain, "--epoch", "2"}, "; --epoch: did you mean --epochs? (see stoker-train --help)\n"},
      {{kTrain, "--devic=cpu"}, "; --devic=cpu: did you mean --device? (see stoker-train --help)\n"},
      {{kInspect, "--jsn", "x.jsonl"}, "; --jsn: did you mean --json? (see stoker-inspect --help)\n"},
      {{kTrain, "--no-such-thing"},
       "The following argument was not expected: --no-such-thing (see stoker-train --help)\n"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.says);
    Child program(c.args, dir);
    CHECK(program.wait() == 2);
    const std::string err = program.err();
    CHECK(err.size() >= c.says.size());
    CHECK(err.compare(err.size() - std::min(err.size(), c.says.size()), c.says.size(), c.says) == 0);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
}

TEST_CASE("every program says its version, its commit and what the build has with --version" * doctest::timeout(60)) {
  const TempDir dir("cli");
  for (const std::string& program : {kTrain, kInspect, kBench}) {
    if (program.empty()) continue;
    const std::string name = fs::path(program).filename().string();
    CAPTURE(name);
    Child child({program, "--version"}, dir);
    CHECK(child.wait() == 0);
    const std::string out = child.out();
    CHECK(out.find(name + " " STOKER_VERSION_STRING) == 0);
    CHECK(out.find("\nbuilt with: " STOKER_BUILD_FEATURES "\n") != std::string::npos);
    // --help promises the image decoders too.
    CHECK(out.find("\nimage decoders: JPEG (libjpeg-turbo 2.") != std::string::npos);
    CHECK(out.find("), PNG (libspng 0.") != std::string::npos);
    CHECK(out.find("license: Apache-2.0") != std::string::npos);
    CHECK(child.err().empty());
  }
}

TEST_CASE("stoker-train refuses in sync mode what only a pipeline has, before anything else" * doctest::timeout(60)) {
  const TempDir dir("cli");
  const fs::path file = dir / "run.out";
  // An absent data set: were the option let through, the run would fail on it instead.
  const std::vector<std::string> sync{kTrain, "--mode", "sync", "--data", (dir / "absent").string()};
  const struct {
    std::vector<std::string> args;
    std::string option;
  } cases[] = {{{"--occupancy-log", file.string()}, "--occupancy-log"},
               {{"--trace", file.string()}, "--trace"},
               {{"--autotune"}, "--autotune"}};
  for (const auto& c : cases) {
    std::vector<std::string> args = sync;
    args.insert(args.end(), c.args.begin(), c.args.end());
    Child train(args, dir);
    CAPTURE(c.option);
    CHECK(train.wait() == 2);
    CHECK(train.err() ==
          "stoker-train: " + c.option + " needs --mode pipelined: sync mode runs no pipeline to record or tune\n");
    CHECK_FALSE(fs::exists(file));
  }
}

TEST_CASE("a --checkpoint directory that cannot be written is refused before the first sample" * doctest::timeout(60)) {
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const TempDir dir("cli");
  const fs::path file = dir / "a-file";
  std::ofstream(file) << "not a directory";
  // A short run: were the path let through, it would train, then fail writing the checkpoint.
  const std::vector<std::string> train{kTrain, "--device", "cpu", "--limit", "500", "--epochs", "1"};
  const struct {
    std::string dir, says;
  } cases[] = {{file.string(), "stoker-train: --checkpoint " + file.string() + ": is not a directory\n"},
               {(file / "run").string(),
                "stoker-train: --checkpoint " + (file / "run").string() + ": cannot be created: Not a directory\n"}};
  for (const auto& c : cases) {
    std::vector<std::string> args = train;
    args.insert(args.end(), {"--checkpoint", c.dir});
    Child program(args, dir);
    CAPTURE(c.says);
    CHECK(program.wait() == 2);
    CHECK(program.err() == c.says);
    CHECK(program.out().find("epoch") == std::string::npos);  // nothing trained
  }
}

TEST_CASE("a log level from the environment that names none is a bad argument, naming the variable" *
          doctest::timeout(60)) {
  const TempDir dir("cli");
  const std::vector<std::string> train{kTrain, "--data", (dir / "absent").string()};
  const struct {
    const char* variable;
    const char* value;
    std::string says;  // empty: not stoker's to judge, the run goes on (to the absent data set)
  } cases[] = {
      {"STOKER_LOG_LEVEL", "loud", "stoker-train: STOKER_LOG_LEVEL: 'loud' is not a log level"},
      {"SPDLOG_LEVEL", "loud", "stoker-train: SPDLOG_LEVEL: 'loud' is not a log level"},
      {"SPDLOG_LEVEL", "other=info,stoker=loud", "stoker-train: SPDLOG_LEVEL: 'loud' is not a log level"},
      {"SPDLOG_LEVEL", "other=loud,stoker=warn", ""},
      {"STOKER_LOG_LEVEL", "Debug", ""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.variable);
    CAPTURE(c.value);
    ::setenv(c.variable, c.value, 1);
    Child program(train, dir);
    const int status = program.wait();
    ::unsetenv(c.variable);
    const std::string err = program.err();
    CAPTURE(err);
    CHECK(status == 2);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    if (!c.says.empty())
      CHECK(err.find(c.says) == 0);
    else
      CHECK(err.find("absent") != std::string::npos);  // the data set, not the level
  }
}

namespace {

// `count` small images as files with a list, `dir/list.txt`: JPEGs of 60 to 99 x 80 pixels, or
// 28x28 gray PNGs of labels 0 to 9.
fs::path write_images(const TempDir& dir, int count, bool jpeg) {
  auto pool = stoker::BufferPool::create();
  std::string list;
  for (int i = 0; i < count; ++i) {
    const std::uint32_t height = jpeg ? 60 + static_cast<std::uint32_t>(i % 40) : 28, width = jpeg ? 80 : 28;
    const std::uint32_t channels = jpeg ? 3 : 1;
    stoker::Sample s(*pool, {.channels = channels, .height = height, .width = width, .channels_last = true},
                     stoker::DType::u8);
    auto p = s.as<std::uint8_t>();
    for (std::size_t k = 0; k < p.size(); ++k)
      p[k] = static_cast<std::uint8_t>((k * 7 + static_cast<std::size_t>(i) * 31) % 251);
    const auto bytes = jpeg ? stoker::encode_jpeg(s) : stoker::encode_png(s);
    const std::string name = "img" + std::to_string(i) + (jpeg ? ".jpg" : ".png");
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    list += name + " " + std::to_string(i % 10) + "\n";
  }
  std::ofstream(dir / "list.txt") << list;
  return dir / "list.txt";
}

nlohmann::json last_json_line(const std::string& out) {
  const auto end = out.find_last_not_of('\n');
  const auto start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

#ifdef STOKER_BENCH
// Runs stoker-bench with `args` (ending in --json), which must succeed; its stdout and its JSON line.
std::pair<std::string, nlohmann::json> run_bench(std::vector<std::string> args, const TempDir& dir) {
  args.insert(args.begin(), STOKER_BENCH);
  Child bench(args, dir);
  const int status = bench.wait();
  std::string out = bench.out();
  INFO("stdout: " << out << "\nstderr: " << bench.err());
  REQUIRE(status == 0);
  auto j = last_json_line(out);
  return {std::move(out), std::move(j)};
}

}  // namespace

TEST_CASE("stoker-bench images: the JSON line holds both contenders at every N, their ratio and the memory bound" *
          doctest::timeout(120)) {
  const TempDir dir("cli");
  const fs::path list = write_images(dir, 24, true);
  const auto [out, j] = run_bench({"images", "--data", list.string(), "--threads", "1,2", "--repeats", "1", "--batch",
                                   "5", "--size", "32", "--json"},
                                  dir);
  CHECK(j["suite"] == "images");
  CHECK(j["config"]["images"] == 24);
  const char* names[] = {"stoker_pipeline", "stoker_pipeline_resize_in_map", "tight_loop"};
  REQUIRE(j["results"].size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    const auto& r = j["results"][i];
    CHECK(r["name"] == names[i % 3]);
    CHECK(r["threads"] == (i < 3 ? 1 : 2));
    CHECK(r["images_per_s_median"].get<double>() > 0);
    CHECK(r["samples"].size() == 1);
  }
  CHECK(j["results"][0]["memory_bound_mib"].get<double>() > 0);
  CHECK(j["results"][1]["memory_bound_mib"].get<double>() > 0);
  REQUIRE(j["ratios"].size() == 2);
  CHECK(j["ratios"][1]["threads"] == 2);
  CHECK(j["ratios"][1]["stoker_over_tight_loop"].get<double>() > 0);
  CHECK(j["ratios"][1]["resize_in_map_over_tight_loop"].get<double>() > 0);
  CHECK(j["ratio"]["stoker_over_tight_loop"].contains("1"));
  CHECK(j["page_cache"]["resident_before_runs"].get<double>() > 0.99);
  CHECK(j["verified"]["same_crops_in_pipeline_and_loop"] == true);
}

TEST_CASE("stoker-bench augment --threads: each N's stage summary in the JSON, a trace of each with --trace-dir" *
          doctest::timeout(120)) {
  const TempDir dir("cli");
  {
    Child refused({STOKER_BENCH, "augment", "--trace-dir", (dir / "traces").string()}, dir);
    CHECK(refused.wait() == 2);
    CHECK(refused.err().find("stoker-bench: --trace-dir requires --threads") == 0);
  }
  if (!have_fashion_mnist()) {
    MESSAGE("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const fs::path traces = dir / "traces";
  const auto [out, j] = run_bench(
      {"augment", "--images", "510", "--threads", "1,3", "--repeats", "1", "--trace-dir", traces.string(), "--json"},
      dir);
  REQUIRE(j["scaling"].size() == 2);
  CHECK(j["vs_hand_loop"].get<double>() > 0);
  for (const auto& s : j["scaling"]) {
    const int n = s["threads"].get<int>();
    CAPTURE(n);
    CHECK(s["read_queue"] == 64 * n);
    CHECK(s["hand_loop_crops_per_s"].get<double>() > 0);  // the hand-written loop ran on N threads too
    CHECK(s["ratio_to_hand_loop"].get<double>() > 0);
    const auto& last = s["stoker_last_run"];
    CHECK(last["wall_s"].get<double>() > 0);
    std::vector<std::string> stages;
    for (const auto& st : last["stages"]) stages.push_back(st["name"]);
    CHECK(stages == std::vector<std::string>{"read", "crops", "batch", "collate"});
    CHECK(last["stages"][3]["items_in"] == 10);  // 510 images x 5 crops in batches of 255
    CHECK(last["stages"][3]["threads"] == n);
    REQUIRE(last["queues"].size() == 4);
    CHECK(last["queues"][0]["capacity"] == 64 * n);
    CHECK(out.find("last run of the stoker pipeline on " + std::to_string(n) + (n == 1 ? " thread:" : " threads:")) !=
          std::string::npos);
    const fs::path trace = traces / ("augment-threads-" + std::to_string(n) + ".trace.json");
    REQUIRE(fs::exists(trace));
    std::ifstream in(trace);
    const auto events = nlohmann::json::parse(in)["traceEvents"];
    CHECK(std::count_if(events.begin(), events.end(), [](const auto& e) { return e.value("name", "") == "collate"; }) >=
          1);
  }
}

#endif  // STOKER_BENCH

TEST_CASE("stoker-train --images: a bad file fails the run naming it, or is skipped and counted in the JSON" *
          doctest::timeout(120)) {
  const TempDir dir("cli");
  const fs::path list = write_images(dir, 40, false);
  fs::resize_file(dir / "img3.png", fs::file_size(dir / "img3.png") - 10);  // a training image, cut short
  const std::vector<std::string> run{kTrain,     "--device", "cpu",          "--images", list.string(),
                                     "--epochs", "1",        "--batch-size", "20",       "--json"};
  Child failing(run, dir);
  CHECK(failing.wait() == 1);
  const std::string err = failing.err();
  CHECK_MESSAGE(err.find((dir / "img3.png").string() + ": damaged PNG") != std::string::npos, err);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);

  std::vector<std::string> skip = run;
  skip.insert(skip.end(), {"--on-bad-input", "skip"});
  Child skipping(skip, dir);
  const int status = skipping.wait();
  const std::string out = skipping.out();
  INFO("stdout: " << out << "\nstderr: " << skipping.err());
  REQUIRE(status == 0);
  const auto j = last_json_line(out);
  CHECK(j["train_images"] == 36);
  CHECK(j["test_images"] == 4);
  CHECK(j["skipped_images"] == 1);  // in the training set or the test set: one epoch, so once
  CHECK(out.find("4 test images from a tenth of " + list.string() + " drawn at random, held out") != std::string::npos);
}
