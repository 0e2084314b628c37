// SPDX-License-Identifier: Apache-2.0
#include "stoker/cluster/elastic.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace stoker::cluster {

namespace {

// Sorts and merges ranges that touch or overlap.
UnitRanges merged(UnitRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  UnitRanges out;
  for (const auto& r : ranges) {
    if (r.first >= r.second) continue;
    if (!out.empty() && r.first <= out.back().second)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

}  // namespace

std::uint64_t unit_count(const UnitRanges& ranges) noexcept {
  std::uint64_t n = 0;
  for (const auto& [begin, end] : ranges) n += end - begin;
  return n;
}

std::uint64_t units_per_sample(const PipelineState& state) {
  if (state.deterministic || !state.taken)
    throw StateError(
        "a deterministic pipeline state does not list the items its consumer took; elastic resume needs free "
        "order");
  std::uint64_t units = 1;
  for (const auto& [name, what] : state.stages) {
    if (what.starts_with("batch")) break;
    if (!what.starts_with("flat_map")) continue;
    const std::string prefix = "flat_map fanout ";
    if (!what.starts_with(prefix))
      throw StateError("flat_map '" + name + "' has no fanout: its outputs per input are not known");
    units *= std::stoull(what.substr(prefix.size()));
  }
  return units;
}

EpochPlan EpochPlan::fresh(std::uint32_t epoch, std::uint64_t samples, std::uint64_t fanout, std::uint32_t world) {
  if (world == 0 || fanout == 0) throw std::invalid_argument("EpochPlan: world and fanout must be at least 1");
  EpochPlan p;
  p.epoch_ = epoch;
  p.samples_ = samples;
  p.fanout_ = fanout;
  p.world_ = world;
  return p;
}

EpochPlan EpochPlan::of_rest(std::uint32_t epoch, std::uint64_t samples, std::uint64_t fanout, UnitRanges rest,
                             std::uint32_t world, std::uint64_t batch) {
  if (batch == 0) throw std::invalid_argument("EpochPlan: batch must be at least 1");
  EpochPlan p = fresh(epoch, samples, fanout, world);
  p.rest_ = merged(std::move(rest));
  const std::uint64_t total = unit_count(*p.rest_), each = total / world, extra = total % world;
  // One more unit for the first `extra` ranks, unless it would make them one step more.
  const bool keep_extra = extra != 0 && each % batch != 0;
  p.bounds_.resize(world + 1);
  for (std::uint32_t r = 0; r <= world; ++r)
    p.bounds_[r] = r * each + (keep_extra ? std::min<std::uint64_t>(r, extra) : 0);
  return p;
}

std::uint64_t EpochPlan::units() const noexcept {
  return rest_ ? bounds_.back() : samples_ / world_ * world_ * fanout_;
}

std::uint64_t EpochPlan::left_out() const noexcept {
  return rest_ ? unit_count(*rest_) - bounds_.back() : samples_ % world_ * fanout_;
}

UnitRanges EpochPlan::units_of(std::uint32_t rank) const {
  if (rank >= world_)
    throw std::out_of_range("EpochPlan: rank " + std::to_string(rank) + " is not of a world of " +
                            std::to_string(world_));
  UnitRanges out;
  if (!rest_) {
    for (std::uint64_t c = 0; c < samples_ / world_; ++c) {
      const std::uint64_t position = c * world_ + rank;
      out.emplace_back(position * fanout_, (position + 1) * fanout_);
    }
    return out;
  }
  // The units [lo, hi) of the rest, in unit order.
  const std::uint64_t lo = bounds_[rank], hi = bounds_[rank + 1];
  std::uint64_t seen = 0;
  for (const auto& [begin, end] : *rest_) {
    const std::uint64_t n = end - begin;
    const std::uint64_t from = std::max(lo, seen), to = std::min(hi, seen + n);
    if (from < to) out.emplace_back(begin + (from - seen), begin + (to - seen));
    seen += n;
    if (seen >= hi) break;
  }
  return out;
}

Share EpochPlan::share(std::uint32_t rank) const {
  Share s;
  if (!rest_) {
    for (const auto& [begin, end] : units_of(rank)) s.positions.push_back(begin / fanout_);
    return s;
  }
  // Grouped by sample: those with only some of their units first, in order of position.
  std::vector<std::uint64_t> whole;
  std::vector<std::vector<std::uint64_t>> partial_units;
  std::uint64_t current = UINT64_MAX;
  std::vector<std::uint64_t> units_of_current;
  const auto close_sample = [&] {
    if (current == UINT64_MAX) return;
    if (units_of_current.size() == fanout_) {
      whole.push_back(current);
    } else {
      s.positions.push_back(current);
      partial_units.push_back(units_of_current);
    }
    units_of_current.clear();
  };
  for (const auto& [begin, end] : units_of(rank))
    for (std::uint64_t u = begin; u < end; ++u) {
      if (u / fanout_ != current) {
        close_sample();
        current = u / fanout_;
      }
      units_of_current.push_back(u % fanout_);
    }
  close_sample();
  s.partial = s.positions.size();
  s.positions.insert(s.positions.end(), whole.begin(), whole.end());
  for (std::uint64_t c = 0; c < partial_units.size(); ++c)
    for (const std::uint64_t j : partial_units[c]) s.make.push_back(c * fanout_ + j);
  return s;
}

UnitRanges EpochPlan::rest(const std::vector<PipelineState>& states) const {
  if (states.size() != world_)
    throw StateError("the plan of epoch " + std::to_string(epoch_) + " is for " + std::to_string(world_) +
                     " ranks, and there are states of " + std::to_string(states.size()));
  UnitRanges left;
  for (std::uint32_t r = 0; r < world_; ++r) {
    const PipelineState& st = states[r];
    const std::string whose = "rank " + std::to_string(r) + "'s pipeline state: ";
    std::uint64_t fanout = 0;
    try {
      fanout = units_per_sample(st);
    } catch (const StateError& e) {
      throw StateError(whose + e.what());
    }
    if (fanout != fanout_)
      throw StateError(whose + "its pipeline makes " + std::to_string(fanout) + " units of a sample, the plan " +
                       std::to_string(fanout_));
    if (st.epoch != epoch_)
      throw StateError(whose + "it is of epoch " + std::to_string(st.epoch) + ", the plan of epoch " +
                       std::to_string(epoch_));
    const Share s = share(r);
    const std::uint64_t end = s.positions.size() * fanout_;
    const auto unit = [&](std::uint64_t origin) { return s.positions[origin / fanout_] * fanout_ + origin % fanout_; };
    for (const std::uint64_t o : st.taken->except)
      if (o < end) left.emplace_back(unit(o), unit(o) + 1);
    for (std::uint64_t o = std::min(st.taken->below, end); o < end;) {  // the rest of the share, sample by sample
      const std::uint64_t to = std::min(end, (o / fanout_ + 1) * fanout_);
      left.emplace_back(unit(o), unit(o) + (to - o));
      o = to;
    }
  }
  return merged(std::move(left));
}

PipelineState EpochPlan::resume_state(std::uint32_t rank, PipelineState blank) const {
  if (blank.deterministic || !blank.taken)
    throw StateError("elastic resume needs a free-order pipeline: its state lists the items to make");
  const Share s = share(rank);
  blank.epoch = epoch_;
  blank.consumed = 0;
  blank.taken->below = s.partial * fanout_;
  blank.taken->except = s.make;
  return blank;
}

std::string EpochPlan::to_json() const {
  nlohmann::json j = {{"epoch", epoch_}, {"samples", samples_}, {"fanout", fanout_}, {"world", world_}};
  if (rest_) {
    // Ranges as (gap from the last one's end, length): small numbers for a rest that is mostly
    // one range with a few holes.
    nlohmann::json ranges = nlohmann::json::array();
    std::uint64_t last = 0;
    for (const auto& [begin, end] : *rest_) {
      ranges.push_back({begin - last, end - begin});
      last = end;
    }
    j["rest"] = std::move(ranges);
    j["bounds"] = bounds_;
  }
  return j.dump();
}

EpochPlan EpochPlan::from_json(std::string_view text, const std::string& origin) {
  try {
    const auto j = nlohmann::json::parse(text);
    EpochPlan p = fresh(j.at("epoch").get<std::uint32_t>(), j.at("samples").get<std::uint64_t>(),
                        j.at("fanout").get<std::uint64_t>(), j.at("world").get<std::uint32_t>());
    if (j.contains("rest")) {
      UnitRanges rest;
      std::uint64_t last = 0;
      for (const auto& r : j.at("rest")) {
        const std::uint64_t begin = last + r.at(0).get<std::uint64_t>();
        last = begin + r.at(1).get<std::uint64_t>();
        rest.emplace_back(begin, last);
      }
      p.bounds_ = j.at("bounds").get<std::vector<std::uint64_t>>();
      if (p.bounds_.size() != p.world_ + 1ull || !std::is_sorted(p.bounds_.begin(), p.bounds_.end()) ||
          p.bounds_.front() != 0 || p.bounds_.back() > unit_count(rest))
        throw StateError(origin + ": the plan's 'bounds' do not share its rest among its " + std::to_string(p.world_) +
                         " ranks");
      p.rest_ = std::move(rest);
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw StateError(origin + ": not an epoch plan (" + e.what() + ")");
  } catch (const std::invalid_argument& e) {
    throw StateError(origin + ": " + e.what());
  }
}

ElasticShard::ElasticShard(std::shared_ptr<const Reader> reader, ShardOptions options,
                           std::optional<std::pair<std::uint32_t, Share>> first)
    : reader_(reader), shard_(reader, options), order_(reader, {.rank = 0, .world = 1}) {
  if (first) first_.emplace(first->first, std::make_shared<const Share>(std::move(first->second)));
}

std::optional<Sample> ElasticShard::operator()(const StageContext& ctx) const {
  if (!first_ || ctx.epoch != first_->first) return shard_(ctx);
  const Share& s = *first_->second;
  if (ctx.index >= s.positions.size()) return std::nullopt;
  return reader_->read(order_.id_at(ctx.seed, ctx.epoch, s.positions[ctx.index]));
}

}  // namespace stoker::cluster
