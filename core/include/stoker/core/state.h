// SPDX-License-Identifier: Apache-2.0
// Where a deterministic pipeline stands in its run, to resume it exactly after a restart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker {

/// A pipeline state that cannot be taken, read or resumed from: the message says why, naming
/// the file, the field, the stage or the option.
class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where a pipeline stands in its run, to go on from there after a restart
/// (PipelineBuilder::resume_from; docs/resume.md says how).
///
/// Deterministic mode: the epoch, and how many items of it the consumer has taken. Nothing of
/// the data or of the queues' contents is kept: a few hundred bytes, whatever the data set and
/// the buffers. Resuming derives every stage's position from these, rebuilds each shuffle
/// buffer by reading again only the items it held, and then yields exactly the items, bit for
/// bit, that the run would have yielded next, with any thread counts.
///
/// Free order: also which items the consumer had not taken yet among those the pipeline had
/// made (`taken`): about a byte or two for each item in flight, bounded by the queues'
/// capacities. Resuming yields every item of the epoch the consumer had not taken, once each,
/// in another order.
///
/// Also kept, to refuse a state from another pipeline with the difference named: the seed, the
/// source's data set (its function's `fingerprint()`), and the stages and what decides their
/// outputs (kind, fanout, batch size, shuffle window and seed).
struct PipelineState {
  static constexpr std::uint32_t kVersion = 3;  ///< reads 1 and 2 too

  /// Free order: the consumer's items traced back to the items of one queue (what the batch
  /// stage takes, or the last queue when there is none), by their origins (StageContext::index).
  struct Taken {
    std::string queue;
    std::uint64_t below = 0;            ///< every item whose origin is lower had been made...
    std::vector<std::uint64_t> except;  ///< ...and taken, but for these (ascending)
    bool operator==(const Taken&) const = default;
  };

  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;     ///< the epoch the consumer is in
  std::uint64_t consumed = 0;  ///< items of it the consumer has taken
  std::string data;            ///< the source's data set, as its fingerprint() describes it
  /// Every stage and shuffle in pipeline order: its name, and what decides what it yields.
  std::vector<std::pair<std::string, std::string>> stages;
  /// Deterministic mode: for every queue whose producer had ended the epoch when the state was
  /// taken, the items it got in the epoch. A resume asks no stage for more of its input than its
  /// input queue got (a short last batch took fewer than a full one), and a shuffle's last draws
  /// come from fewer than its window. (Versions 1 and 2 named it shuffle_inputs, shuffles only.)
  std::map<std::string, std::uint64_t> inputs;
  bool deterministic = true;   ///< the pipeline's mode
  std::optional<Taken> taken;  ///< free order only

  /// The state as one line of JSON.
  std::string to_json() const;
  /// Reads to_json()'s text; throws StateError naming `origin` and what is wrong.
  static PipelineState from_json(std::string_view text, const std::string& origin = "pipeline state");

  /// Writes to_json() to `path` through a file beside it that is then renamed over it: a crash
  /// while writing leaves the previous file whole.
  void save(const std::filesystem::path& path) const;
  /// Reads a file save() wrote; throws StateError naming the file.
  static PipelineState load(const std::filesystem::path& path);

  bool operator==(const PipelineState&) const = default;
};

/// Writes `bytes` to `path` atomically: to a file beside it, flushed to disk, then renamed over
/// `path`. Throws std::runtime_error naming the file.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace stoker
