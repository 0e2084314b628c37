// SPDX-License-Identifier: Apache-2.0
// What every communicator shares, and the one of a single process.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "communicator_impl.h"

namespace stoker::cluster {

void Communicator::allreduce_mean(std::span<float> data) {
  allreduce_sum(data);
  const float scale = 1.0f / static_cast<float>(size());
  for (float& v : data) v *= scale;
}

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string engine() const override { return "one process"; }
  void barrier() override {}
  void broadcast(std::span<std::byte>, int root) override { check_root(root); }
  void allreduce_sum(std::span<float>) override {}
  std::vector<std::string> gather(std::string_view record, int root) override {
    check_root(root);
    return {std::string(record)};
  }
  void set_timeout(std::chrono::milliseconds) override {}  // a collective of one never waits
  void set_status(std::string_view) override {}
  [[noreturn]] void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "rank 0: %s\n", why.c_str());
    std::_Exit(1);
  }

 private:
  static void check_root(int root) {
    if (root != 0) throw ClusterError("rank 0: root " + std::to_string(root) + " is not a rank of a world of 1");
  }
};

}  // namespace

std::unique_ptr<Communicator> single_process() { return std::make_unique<SingleProcess>(); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i != 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// A rank's facts on the wire: name, unit separator, value, record separator, for each.
std::string encode(const Facts& facts) {
  std::string out;
  for (const auto& [name, value] : facts) (((out += name) += '\x1f') += value) += '\x1e';
  return out;
}
std::map<std::string, std::string> decode(std::string_view text, std::vector<std::string>& names) {
  std::map<std::string, std::string> facts;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\x1e', at), text.size());
    const std::string_view record = text.substr(at, end - at);
    const std::size_t split = std::min(record.find('\x1f'), record.size());
    std::string name(record.substr(0, split));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    facts[std::move(name)] = std::string(record.substr(std::min(split + 1, record.size())));
    at = end + 1;
  }
  return facts;
}

// What differs among the ranks' records, for a person; empty when nothing does.
std::string differences(const std::vector<std::string>& records) {
  std::vector<std::string> names;  // in the order the ranks give them, rank 0's first
  std::vector<std::map<std::string, std::string>> facts;
  for (const auto& r : records) facts.push_back(decode(r, names));
  std::string out;
  for (const auto& name : names) {
    std::vector<std::pair<std::string, std::vector<int>>> values;  // in the order of their first rank
    for (std::size_t r = 0; r < facts.size(); ++r) {
      const auto it = facts[r].find(name);
      const std::string value = it == facts[r].end() ? "nothing" : "'" + it->second + "'";
      auto v = std::find_if(values.begin(), values.end(), [&](const auto& p) { return p.first == value; });
      if (v == values.end()) v = values.insert(values.end(), {value, {}});
      v->second.push_back(static_cast<int>(r));
    }
    if (values.size() < 2) continue;
    out += (out.empty() ? "" : "; ") + name + ": ";
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto& [value, ranks] = values[i];
      out += (i == 0 ? "" : ", ") + rank_list(ranks) + (ranks.size() == 1 ? " has " : " have ") + value;
    }
  }
  return out.empty() ? out : "the ranks differ: " + out;
}

}  // namespace

void agree(Communicator& comm, const Facts& facts) {
  if (comm.size() == 1) return;
  const auto records = comm.gather(encode(facts), 0);
  std::string verdict = comm.rank() == 0 ? differences(records) : std::string();
  std::uint64_t length = verdict.size();
  comm.broadcast(std::as_writable_bytes(std::span(&length, 1)), 0);
  verdict.resize(length);
  comm.broadcast(std::as_writable_bytes(std::span(verdict.data(), verdict.size())), 0);
  if (!verdict.empty()) throw RankMismatch(verdict);
}

namespace {
std::mutex unresponsive_mutex;
std::vector<int> unresponsive_ranks;
}  // namespace

void note_unresponsive(int rank) {
  std::lock_guard lock(unresponsive_mutex);
  if (std::find(unresponsive_ranks.begin(), unresponsive_ranks.end(), rank) == unresponsive_ranks.end()) {
    unresponsive_ranks.push_back(rank);
    std::sort(unresponsive_ranks.begin(), unresponsive_ranks.end());
  }
}

std::vector<int> unresponsive() {
  std::lock_guard lock(unresponsive_mutex);
  return unresponsive_ranks;
}

int run_guarded(Communicator& comm, const std::function<int(Communicator&)>& main) {
  try {
    return main(comm);
  } catch (const std::exception& e) {
    if (comm.size() == 1) throw;  // one process: the caller reports it as it would any other
    comm.abort(std::string("error: ") + e.what());
  } catch (...) {
    if (comm.size() == 1) throw;
    comm.abort("error: an unknown exception");
  }
  return 1;  // not reached: abort() ends the process (GCC does not see that through a virtual call)
}

}  // namespace stoker::cluster
