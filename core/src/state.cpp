// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace stoker {

namespace {
constexpr std::string_view kFormat = "stoker-pipeline-state";

std::string errno_text() { return std::strerror(errno); }
}  // namespace

std::string PipelineState::to_json() const {
  nlohmann::json stage_list = nlohmann::json::array();
  for (const auto& [name, what] : stages) stage_list.push_back({{"name", name}, {"what", what}});
  nlohmann::json j = {{"format", kFormat}, {"version", kVersion},  {"order", deterministic ? "deterministic" : "free"},
                      {"seed", seed},      {"epoch", epoch},       {"consumed", consumed},
                      {"data", data},      {"stages", stage_list}, {"inputs", inputs}};
  if (taken) {
    // Ascending origins as differences from the one before: small numbers, a few characters each.
    nlohmann::json except = nlohmann::json::array();
    std::uint64_t previous = 0;
    for (const auto o : taken->except) except.push_back(o - std::exchange(previous, o));
    j["taken"] = {{"queue", taken->queue}, {"below", taken->below}, {"except", std::move(except)}};
  }
  return j.dump();
}

PipelineState PipelineState::from_json(std::string_view text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw StateError(origin + ": not a pipeline state (" + e.what() + ")");
  }
  // Every field is checked for its type; nlohmann's own messages name the type, these the field.
  auto field = [&](const nlohmann::json& object, const char* name, auto kind) -> const nlohmann::json& {
    if (!object.is_object() || !object.contains(name))
      throw StateError(origin + ": the field '" + name + "' is missing");
    const auto& v = object.at(name);
    if (!kind(v)) throw StateError(origin + ": the field '" + name + "' has the wrong type (" + v.type_name() + ")");
    return v;
  };
  const auto is_string = [](const nlohmann::json& v) { return v.is_string(); };
  const auto is_count = [](const nlohmann::json& v) { return v.is_number_unsigned(); };
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    throw StateError(origin + ": not a pipeline state (no \"format\": \"stoker-pipeline-state\")");
  const auto version = field(j, "version", is_count).get<std::uint64_t>();
  if (version < 1 || version > kVersion)
    throw StateError(origin + ": version " + std::to_string(version) +
                     " of the pipeline state, but this stoker reads 1 to " + std::to_string(kVersion));
  PipelineState s;
  if (version >= 2) {
    const auto order = field(j, "order", is_string).get<std::string>();
    if (order != "deterministic" && order != "free")
      throw StateError(origin + ": the field 'order' is '" + order + "', not 'deterministic' or 'free'");
    s.deterministic = order == "deterministic";
  }
  s.seed = field(j, "seed", is_count).get<std::uint64_t>();
  const auto epoch = field(j, "epoch", is_count).get<std::uint64_t>();
  if (epoch > UINT32_MAX) throw StateError(origin + ": the field 'epoch' is out of range");
  s.epoch = static_cast<std::uint32_t>(epoch);
  s.consumed = field(j, "consumed", is_count).get<std::uint64_t>();
  s.data = field(j, "data", is_string).get<std::string>();
  for (const auto& st : field(j, "stages", [](const nlohmann::json& v) { return v.is_array(); }))
    s.stages.emplace_back(field(st, "name", is_string).get<std::string>(),
                          field(st, "what", is_string).get<std::string>());
  const char* inputs = version >= 3 ? "inputs" : "shuffle_inputs";
  for (const auto& [name, n] : field(j, inputs, [](const nlohmann::json& v) { return v.is_object(); }).items()) {
    if (!n.is_number_unsigned()) throw StateError(origin + ": " + inputs + "['" + name + "'] is not a count");
    s.inputs[name] = n.get<std::uint64_t>();
  }
  if (!s.deterministic) {
    const auto& t = field(j, "taken", [](const nlohmann::json& v) { return v.is_object(); });
    // Assigned, not emplace()d: clang judges Taken (default member initialisers, nested)
    // not default-constructible for std::optional.
    auto& taken = *(s.taken = PipelineState::Taken{});
    taken.queue = field(t, "queue", is_string).get<std::string>();
    taken.below = field(t, "below", is_count).get<std::uint64_t>();
    const auto& except = field(t, "except", [](const nlohmann::json& v) { return v.is_array(); });
    if (except.size() > taken.below) throw StateError(origin + ": taken.except lists more items than lie below");
    taken.except.reserve(except.size());
    std::uint64_t o = 0;
    for (const auto& d : except) {
      if (!d.is_number_unsigned()) throw StateError(origin + ": taken.except holds something that is not a count");
      const auto step = d.get<std::uint64_t>();
      if ((!taken.except.empty() && step == 0) || step >= taken.below - o)
        throw StateError(origin + ": taken.except is not ascending below " + std::to_string(taken.below));
      taken.except.push_back(o += step);
    }
  } else if (j.contains("taken")) {
    throw StateError(origin + ": a deterministic state with the free-order field 'taken'");
  }
  return s;
}

void PipelineState::save(const std::filesystem::path& path) const { write_file_atomically(path, to_json() + "\n"); }

PipelineState PipelineState::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw StateError(path.string() + ": cannot open: " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path.string());
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::string name = path.string(), temp = name + ".partial";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(temp + ": cannot create: " + errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const auto why = errno_text();
      ::close(fd);
      throw std::runtime_error(temp + ": cannot write: " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  // On disk before the rename, so that the name never points at a file the disk lacks.
  const bool synced = ::fsync(fd) == 0;
  if (!synced || ::close(fd) != 0) {
    const auto why = errno_text();
    if (!synced) ::close(fd);
    throw std::runtime_error(temp + ": cannot write: " + why);
  }
  if (::rename(temp.c_str(), name.c_str()) != 0)
    throw std::runtime_error(name + ": cannot rename " + temp + " to it: " + errno_text());
}

}  // namespace stoker
