// SPDX-License-Identifier: Apache-2.0
// MixedImageSource: the drawn proportions against the weights (a chi-square test), each stop
// rule, every image's count, resume at another number of ranks, and a pipeline that reads the
// mixture's images from their data sets.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "stages/image_support.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/mix.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;
namespace fs = std::filesystem;

namespace {

// A list file of `n` images named "<tag>-<i>.png" with label i % 7; the files themselves are
// written only when `write` (the draws need the list alone).
std::shared_ptr<const ImageDataset> list_of(const TempDir& dir, const std::string& tag, std::uint32_t n,
                                            bool write = false) {
  std::string list;
  auto pool = BufferPool::create();
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string file = tag + "-" + std::to_string(i) + ".png";
    list += file + " " + std::to_string(i % 7) + "\n";
    if (write) write_bytes(dir / file, encode_png(noise_image(*pool, 4 + i % 3, 5, 3, i)));
  }
  const std::string text = list;
  write_bytes(dir / (tag + ".txt"), std::as_bytes(std::span(text.data(), text.size())));
  return ImageDataset::from_list(dir / (tag + ".txt"));
}

// Pearson's chi-square of the counts against the weights' shares of their sum.
double chi_square(const std::vector<std::uint64_t>& counts, const std::vector<double>& weights) {
  double total = 0, weight = 0, chi = 0;
  for (auto c : counts) total += static_cast<double>(c);
  for (auto w : weights) weight += w;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double expected = total * weights[i] / weight;
    chi += (static_cast<double>(counts[i]) - expected) * (static_cast<double>(counts[i]) - expected) / expected;
  }
  return chi;
}

// Every draw of an epoch, all ranks together (one rank), as (data set, id) in order.
std::vector<std::pair<std::size_t, std::uint64_t>> draws(const MixedImageSource& mix, std::uint64_t seed,
                                                         std::uint32_t epoch) {
  std::vector<std::pair<std::size_t, std::uint64_t>> out;
  for (std::uint64_t k = 0; k < mix.size_of(seed, epoch); ++k) out.push_back(mix.draw_at(seed, epoch, k));
  return out;
}

}  // namespace

TEST_SUITE("mixing data sets") {
  TEST_CASE("the drawn proportions follow the weights: a chi-square test over 20 seeds") {
    TempDir dir("mix");
    const auto a = list_of(dir, "a", 6000), b = list_of(dir, "b", 6000), c = list_of(dir, "c", 6000);
    const std::vector<double> weights{0.5, 0.3, 0.2};
    for (const MixStop stop : {MixStop::first_exhausted, MixStop::resample}) {
      CAPTURE(static_cast<int>(stop));
      const MixedImageSource mix({a, b, c}, {.weights = weights, .stop = stop, .epoch_images = 6000});
      // Chi-square with 2 degrees of freedom: P(> 9.21) = 0.01 for draws that follow the weights.
      // Over 20 seeds, more than 3 above it has a chance of about 1e-3; a bias of a few percent
      // would put most of them above.
      int above = 0;
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        const auto counts = mix.counts(seed, 0);
        above += chi_square(counts, weights) > 9.21;
      }
      CHECK(above <= 3);
      // Weights of another scale are the same weights.
      const MixedImageSource scaled({a, b, c}, {.weights = {5, 3, 2}, .stop = stop, .epoch_images = 6000});
      CHECK(scaled.counts(7, 1) == mix.counts(7, 1));
    }
  }

  TEST_CASE("each stop rule: where the epoch ends, and which images it holds how often") {
    TempDir dir("mix");
    const auto big = list_of(dir, "big", 900), small = list_of(dir, "small", 30);

    // first_exhausted: it ends at the draw that takes a data set's last image; no image twice.
    const MixedImageSource first({big, small}, {.weights = {0.5, 0.5}, .stop = MixStop::first_exhausted});
    const auto f = draws(first, 3, 0);
    CHECK(f.size() == first.epoch_draws(3, 0));
    CHECK(std::set(f.begin(), f.end()).size() == f.size());
    const auto f_counts = first.counts(3, 0);
    CHECK(f_counts[1] == 30);  // the small one ran out, at the last draw
    CHECK(f.back().first == 1);
    CHECK(f_counts[0] < 100);

    // all_exhausted: every image once.
    const MixedImageSource all({big, small}, {.weights = {0.5, 0.5}, .stop = MixStop::all_exhausted});
    const auto e = draws(all, 3, 0);
    CHECK(e.size() == 930);
    CHECK(std::set(e.begin(), e.end()).size() == 930);

    // resample: 600 draws, half of them the small one's, each of its passes every image once.
    const MixedImageSource again({big, small}, {.weights = {0.5, 0.5}, .stop = MixStop::resample, .epoch_images = 600});
    const auto r = draws(again, 3, 0);
    CHECK(r.size() == 600);
    std::vector<std::uint64_t> small_ids;
    for (const auto& [part, id] : r)
      if (part == 1) small_ids.push_back(id);
    CHECK(small_ids.size() > 250);
    CHECK(small_ids.size() < 350);
    for (std::size_t pass = 0; (pass + 1) * 30 <= small_ids.size(); ++pass) {
      const std::set<std::uint64_t> ids(small_ids.begin() + static_cast<std::ptrdiff_t>(pass * 30),
                                        small_ids.begin() + static_cast<std::ptrdiff_t>((pass + 1) * 30));
      CHECK(ids.size() == 30);  // a pass: every image once
    }
    CHECK(std::vector(small_ids.begin(), small_ids.begin() + 30) !=
          std::vector(small_ids.begin() + 30, small_ids.begin() + 60));  // another order each pass

    // Another epoch, other draws; the same seed and epoch, the same ones.
    CHECK(draws(again, 3, 1) != r);
    CHECK(draws(again, 3, 0) == r);
  }

  TEST_CASE("ranks share an epoch's draws, and a resume at another number of ranks goes on where it stopped") {
    TempDir dir("mix");
    const auto a = list_of(dir, "a", 500), b = list_of(dir, "b", 200);
    for (const MixStop stop : {MixStop::first_exhausted, MixStop::all_exhausted, MixStop::resample}) {
      CAPTURE(static_cast<int>(stop));
      const MixOptions base{.weights = {2, 1}, .stop = stop, .epoch_images = 1000};
      const auto whole = draws(MixedImageSource({a, b}, base), 11, 2);
      // Two ranks take 100 draws each, then three ranks take the rest of the epoch.
      std::multiset<std::pair<std::size_t, std::uint64_t>> seen;
      for (std::uint32_t rank = 0; rank < 2; ++rank) {
        MixOptions o = base;
        o.shard = {.rank = rank, .world = 2};
        const MixedImageSource mix({a, b}, o);
        for (std::uint64_t k = 0; k < 100; ++k) seen.insert(mix.draw_at(11, 2, k));
      }
      std::uint64_t resumed = 0;
      for (std::uint32_t rank = 0; rank < 3; ++rank) {
        MixOptions o = base;
        o.shard = {.rank = rank, .world = 3, .remainder = Remainder::drop};
        o.resume_at = EpochCut{.epoch = 2, .taken = 200};
        const MixedImageSource mix({a, b}, o);
        for (std::uint64_t k = 0; k < mix.size_of(11, 2); ++k, ++resumed) seen.insert(mix.draw_at(11, 2, k));
        CHECK(mix.size_of(11, 3) == mix.epoch_draws(11, 3) / 3);  // the next epoch: whole
      }
      // What the five ranks took is the epoch's first 200 + 3 * resumed / 3 draws, each once.
      CHECK(resumed == (whole.size() - 200) / 3 * 3);
      const std::multiset<std::pair<std::size_t, std::uint64_t>> want(
          whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(200 + resumed));
      CHECK(seen == want);
    }
  }

  TEST_CASE("a pipeline reads the mixture's images from their data sets, with their names and labels") {
    TempDir dir("mix");
    const auto a = list_of(dir, "a", 20, true), b = list_of(dir, "b", 10, true);
    auto pipe = PipelineBuilder{}
                    .seed(5)
                    .epochs(2)
                    .threads(2)
                    .source("read", MixedImageSource({a, b}, {.weights = {1, 1}, .stop = MixStop::all_exhausted}))
                    .map("decode", ImageDecoder(), {.threads = 2})
                    .build();
    for (auto epoch : pipe.epochs()) {
      std::multiset<std::uint64_t> ids;
      for (auto& image : epoch) {
        ids.insert(image.id);
        const std::uint64_t local = image.id < 20 ? image.id : image.id - 20;
        CHECK(image.label == static_cast<std::int32_t>(local % 7));
        CHECK(image.shape.height == 4 + local % 3);
      }
      CHECK(ids.size() == 30);
      CHECK(std::set(ids.begin(), ids.end()).size() == 30);
    }
  }

  TEST_CASE("impossible mixtures are refused naming the option") {
    TempDir dir("mix");
    const auto a = list_of(dir, "a", 5), b = list_of(dir, "b", 5);
    CHECK_THROWS_WITH_AS(MixedImageSource({}, {}), doctest::Contains("no data set"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(MixedImageSource({a, b}, {.weights = {1}}), doctest::Contains("MixOptions::weights has 1"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(MixedImageSource({a, b}, {.weights = {1, 0}}),
                         doctest::Contains("MixOptions::weights[1] is 0"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(MixedImageSource({a, b}, {.weights = {1, -2}}), doctest::Contains("MixOptions::weights[1]"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        MixedImageSource({a, b}, {.weights = {1, 1}, .stop = MixStop::all_exhausted, .resume_at = EpochCut{0, 10}}),
        doctest::Contains("resume_at.taken (10) leaves no draw"), std::invalid_argument);
  }
}
