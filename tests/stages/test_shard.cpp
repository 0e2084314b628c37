// SPDX-License-Identifier: Apache-2.0
// ShuffledShard: each epoch, every sample reaches exactly one rank, in a new order.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "stages/source_ids.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

using namespace stoker;

namespace {

// The ids each rank's pipeline yields, epoch by epoch.
std::vector<std::vector<std::uint64_t>> rank_run(std::shared_ptr<const Reader> reader, ShardOptions o,
                                                 std::uint64_t seed, std::uint32_t epochs) {
  return test::epoch_ids(ShuffledShard(std::move(reader), o), seed, epochs);
}

}  // namespace

TEST_CASE("Permutation is a bijection of 0..n-1 for every n, and depends on its key") {
  for (const std::uint64_t n : {1u, 2u, 3u, 5u, 64u, 100u, 1000u, 4097u}) {
    CAPTURE(n);
    std::vector<std::uint64_t> image;
    const Permutation p(n, 42);
    for (std::uint64_t i = 0; i < n; ++i) image.push_back(p(i));
    std::vector<std::uint64_t> sorted = image;
    std::sort(sorted.begin(), sorted.end());
    for (std::uint64_t i = 0; i < n; ++i) REQUIRE(sorted[i] == i);
    if (n >= 64) {
      const Permutation q(n, 43);
      std::size_t same = 0;
      for (std::uint64_t i = 0; i < n; ++i) same += q(i) == image[i];
      CHECK(same < n / 8);  // another key, another order
    }
  }
}

TEST_CASE("ShuffledShard: over 1 to 4 ranks, every sample reaches exactly one rank per epoch, in a new order" *
          doctest::timeout(60)) {
  const std::uint64_t n = 1003;  // divides by none of 2, 3, 4
  const auto reader = std::make_shared<SyntheticSource>(SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = n});
  for (const auto remainder : {Remainder::drop, Remainder::pad}) {
    for (std::uint32_t world = 1; world <= 4; ++world) {
      CAPTURE(world);
      CAPTURE(remainder == Remainder::drop);
      std::vector<std::map<std::uint64_t, int>> seen(2);  // per epoch: id -> times
      std::vector<std::vector<std::uint64_t>> order(2);   // per epoch: rank 0's ids
      for (std::uint32_t rank = 0; rank < world; ++rank) {
        const ShardOptions o{.rank = rank, .world = world, .remainder = remainder};
        const auto run = rank_run(reader, o, 9, 2);
        REQUIRE(run.size() == 2);
        CHECK(run == rank_run(reader, o, 9, 2));  // the same seed: the same run
        CHECK(run != rank_run(reader, o, 10, 2));
        for (std::size_t e = 0; e < 2; ++e) {
          // Every rank the same count: batches line up.
          CHECK(run[e].size() == (remainder == Remainder::drop ? n / world : (n + world - 1) / world));
          for (const auto id : run[e]) ++seen[e][id];
        }
        if (rank == 0) order = run;
      }
      CHECK(order[0] != order[1]);  // reshuffled every epoch
      for (std::size_t e = 0; e < 2; ++e) {
        std::size_t twice = 0, once = 0;
        for (const auto& [id, times] : seen[e]) {
          REQUIRE(id < n);
          REQUIRE(times <= 2);
          (times == 1 ? once : twice) += 1;
        }
        if (remainder == Remainder::drop) {
          CHECK(twice == 0);
          CHECK(once == n - n % world);  // the rest left out this epoch
        } else {
          CHECK(once + twice == n);  // every sample, and a few twice
          CHECK(twice == (world - n % world) % world);
        }
      }
      if (remainder == Remainder::drop && world > 1) {
        std::set<std::uint64_t> left_out[2];
        for (std::size_t e = 0; e < 2; ++e)
          for (std::uint64_t id = 0; id < n; ++id)
            if (!seen[e].contains(id)) left_out[e].insert(id);
        CHECK(left_out[0] != left_out[1]);  // not the same samples every epoch
      }
    }
  }
}

TEST_CASE("ShuffledShard refuses impossible ranks and a reader that is sharded already") {
  const auto reader = std::make_shared<SyntheticSource>(SyntheticOptions{.count = 10});
  CHECK_THROWS_WITH_AS(ShuffledShard(reader, {.rank = 2, .world = 2}), doctest::Contains("rank 2 is out of range"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ShuffledShard(reader, {.world = 0}), doctest::Contains("world must be at least 1"),
                       std::invalid_argument);
  const auto sharded = std::make_shared<SyntheticSource>(SyntheticOptions{.count = 10},
                                                         ReaderOptions{.shard_index = 0, .num_shards = 2});
  CHECK_THROWS_WITH_AS(ShuffledShard(sharded, {}), doctest::Contains("the reader is itself sharded"),
                       std::invalid_argument);
}

TEST_CASE("a pipeline reading a ShuffledShard resumes exactly") {
  const auto reader = std::make_shared<SyntheticSource>(SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = 500});
  auto build = [&](const std::optional<PipelineState>& resume) {
    auto b = PipelineBuilder{}
                 .seed(3)
                 .deterministic()
                 .epochs(1)
                 .source("read", ShuffledShard(reader, {.rank = 1, .world = 3}))
                 .map("id", [](Sample s) { return s.id; })
                 .shuffle("shuffle", {.capacity = 64, .min_after_dequeue = 32});
    if (resume) b.resume_from(*resume);
    return b.batch("batch", 8).build();
  };
  auto whole = build(std::nullopt);
  std::vector<std::vector<std::uint64_t>> all;
  for (auto& b : whole.epoch()) all.push_back(b);
  auto stopped = build(std::nullopt);
  for (int i = 0; i < 7; ++i) REQUIRE(stopped.next());
  auto resumed = build(stopped.state());
  for (std::size_t i = 7; i < all.size(); ++i) REQUIRE(resumed.next() == all[i]);
  CHECK(!resumed.next());
}
