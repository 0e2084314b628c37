// SPDX-License-Identifier: Apache-2.0
#include "checkpoint.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "stoker/core/random.h"
#include "train.h"

namespace stoker::train {

namespace {
constexpr std::string_view kFormat = "stoker-train-checkpoint";
constexpr int kVersion = Checkpoint::kLatest;

template <class T>
std::string text(const T& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
}  // namespace

// Recorded from version 3 on: a checkpoint of an earlier version is not checked against them.
constexpr std::array kSinceVersion3 = {"--seed", "--crops", "training data"};

std::map<std::string, std::string> Checkpoint::options_of(const TrainOptions& o, const std::string& data) {
  std::string hidden;
  for (const int w : o.hidden) {
    if (!hidden.empty()) hidden += ',';
    hidden += std::to_string(w);
  }
  return {{"--epochs", text(o.epochs)},
          {"--lr", text(o.learning_rate)},
          {"--momentum", text(o.momentum)},
          {"--weight-decay", text(o.weight_decay)},
          {"--hidden", hidden},
          {"--crop-size", text(o.crop_size)},
          {"--mirror-p", text(o.mirror_p)},
          {"--remote-workers", o.remote_workers ? "on" : "off"},
          {"--seed", text(o.seed)},
          {"--crops", text(o.crops)},
          {"training data", data}};
}

void Checkpoint::check_options(const TrainOptions& o, const std::string& data,
                               const std::filesystem::path& from) const {
  for (const auto& [name, value] : options_of(o, data)) {
    const auto it = options.find(name);
    if (it == options.end() && version < 3 && std::ranges::find(kSinceVersion3, name) != kSinceVersion3.end()) continue;
    if (it == options.end() || it->second != value)
      throw std::invalid_argument("--resume " + from.string() + ": the checkpoint was made with " + name + " " +
                                  (it == options.end() ? "unset" : it->second) + ", this run has " + value);
  }
}

nlohmann::json Checkpoint::pipeline_list() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : pipelines) list.push_back(nlohmann::json::parse(p.to_json()));
  return list;
}

void Checkpoint::save(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  nlohmann::json header = {{"format", kFormat},
                           {"version", kVersion},
                           {"step", step},
                           {"samples", samples},
                           {"batches", batches},
                           {"options", options},
                           {"pipelines", pipeline_list()},
                           {"plan", plan ? nlohmann::json::parse(plan->to_json()) : nlohmann::json()},
                           {"model_bytes", model.size()}};
  if (digests) {
    header["digest"] = digests->run;
    header["epoch_digest"] = digests->epoch;
  }
  std::string bytes = header.dump() + "\n";
  bytes.append(reinterpret_cast<const char*>(model.data()), model.size());
  write_file_atomically(file(dir), bytes);
}

Checkpoint Checkpoint::load(const std::filesystem::path& dir) {
  const std::string name = file(dir).string();
  std::ifstream in(file(dir), std::ios::binary);
  if (!in) throw StateError(name + ": cannot open (is " + dir.string() + " a checkpoint directory?)");
  std::string line;
  std::getline(in, line);
  Checkpoint c;
  std::uint64_t model_bytes = 0;
  try {
    const auto h = nlohmann::json::parse(line);
    if (!h.is_object() || h.value("format", "") != kFormat) throw StateError(name + ": not a stoker-train checkpoint");
    const auto version = h.at("version");
    if (!version.is_number_integer() || version < 1 || version > kVersion)
      throw StateError(name + ": version " + version.dump() + " of the checkpoint, but this stoker-train reads 1 to " +
                       std::to_string(kVersion));
    c.version = version.get<int>();
    c.step = h.at("step").get<std::uint64_t>();
    c.samples = h.at("samples").get<std::uint64_t>();
    c.batches = h.at("batches").get<std::uint64_t>();
    c.options = h.at("options").get<std::map<std::string, std::string>>();
    if (h.at("version") == 1) c.options.emplace("--remote-workers", "off");  // which version 1 could not be
    for (const auto& p : h.at("pipelines")) c.pipelines.push_back(PipelineState::from_json(p.dump(), name));
    if (c.pipelines.empty()) throw StateError(name + ": no pipeline state in the checkpoint");
    if (h.contains("plan") && !h.at("plan").is_null())
      c.plan = cluster::EpochPlan::from_json(h.at("plan").dump(), name);
    model_bytes = h.at("model_bytes").get<std::uint64_t>();
    if (version >= 3)
      c.digests = Digests{h.at("digest").get<std::uint64_t>(), h.at("epoch_digest").get<std::uint64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw StateError(name + ": not a stoker-train checkpoint (" + e.what() + ")");
  }
  std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c.file_hash = derive_seed(hash_name(line), hash_name(rest));
  if (rest.size() != model_bytes)
    throw StateError(name + ": " + std::to_string(rest.size()) + " bytes of model after the header, " +
                     std::to_string(model_bytes) + " expected: the file is " +
                     (rest.size() < model_bytes ? "truncated" : "longer than written"));
  c.model.resize(rest.size());
  std::memcpy(c.model.data(), rest.data(), rest.size());
  return c;
}

}  // namespace stoker::train
