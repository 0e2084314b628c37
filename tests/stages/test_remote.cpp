// SPDX-License-Identifier: Apache-2.0
// Tar shards read over HTTP(S) from a real nginx, and through a fault proxy that fails requests
// the ways networks and servers do. Runs under tests/remote/serve.py, which starts the servers
// and says where they are (STOKER_TEST_ROOT, _HTTP, _HTTPS, _CA, _PROXY); see its docstring.
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stages/image_support.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/thread_budget.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/remote.h"
#include "stoker/stages/tar.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set: run this test under tests/remote/serve.py");
  return v;
}

std::string text_of(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

// Three shards of 4 samples each under the servers' root, in folder `name`: the first two with
// an index beside them, the third without (its headers are read). Made once per folder, unless
// `write` is false: then only their images' bytes are made, the same again.
struct Shards {
  std::string folder;
  std::vector<std::vector<std::byte>> bytes;  // by id
  std::uint64_t label_bytes = 0;
  static constexpr int kShards = 3, kPer = 4;

  explicit Shards(std::string name, bool write = true) : folder(std::move(name)) {
    const fs::path dir = fs::path(env("STOKER_TEST_ROOT")) / folder;
    fs::create_directories(dir);
    auto pool = BufferPool::create();
    for (int s = 0; s < kShards; ++s) {
      const fs::path path = dir / ("part-" + std::to_string(s) + ".tar");
      std::optional<TarWriter> tar;
      if (write) tar.emplace(path);
      for (int i = 0; i < kPer; ++i) {
        const auto id = static_cast<std::uint32_t>(s * kPer + i);
        bytes.push_back(encode_png(noise_image(*pool, 6 + id % 3, 5, 3, id)));
        const std::string key = "k" + std::to_string(100 + id);
        const std::string label = std::to_string(id % 5);
        label_bytes += label.size();
        if (!tar) continue;
        tar->add(key + ".png", bytes.back());
        tar->add(key + ".cls", label);
      }
      if (!tar) continue;
      tar->finish();
      if (s < 2) write_wds_index(wds_index_path(path), tar->members());
    }
  }
  // The shards' URLs under `base` (the path's first part may name a fault), as braces.
  std::string url(const std::string& base) const { return base + "/" + folder + "/part-{0..2}.tar"; }
  // The images' bytes, each to the end of its last 512-byte block.
  std::uint64_t padded_image_bytes() const {
    return std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0},
                           [](std::uint64_t sum, const auto& b) { return sum + (b.size() + 511) / 512 * 512; });
  }
};

// Every image of `data`, read once: its bytes must be shards' image `id`, its label id % 5.
void check_reads(const ImageDataset& data, const Shards& shards) {
  REQUIRE(data.size() == shards.bytes.size());
  auto pool = BufferPool::create();
  for (std::uint64_t id = 0; id < data.size(); ++id) {
    const EncodedImage image = data.read(id, *pool);
    CHECK(text_of({image.data.data(), image.data.size()}) == text_of(shards.bytes[id]));
    CHECK(image.label == static_cast<std::int32_t>(id % 5));
  }
}

// A DataError's message from `f`, which must throw one.
template <class F>
std::string data_error(F f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  FAIL("no DataError");
  return {};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The files of a cache directory: its shards (locks and fetches in flight left out), and their bytes.
struct CacheFiles {
  std::set<std::string> shards;
  std::uint64_t bytes = 0;
  bool parts = false;  // a fetch's file, .part
};
CacheFiles cache_files(const fs::path& dir) {
  CacheFiles out;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    out.parts |= name.ends_with(".part");
    if (name.starts_with(".") || name.ends_with(".lock") || name.ends_with(".txt")) continue;  // .txt: the user's
    out.bytes += fs::file_size(f.path());
    if (!name.ends_with(".part")) out.shards.insert(name.substr(name.find('-') + 1));  // after the URL's hash
  }
  return out;
}

RemoteOptions cached(const fs::path& dir, std::uint64_t bytes) {
  RemoteOptions o;
  o.cache_dir = dir;
  o.cache_bytes = bytes;
  return o;
}

RemoteOptions quick() {
  RemoteOptions o;
  o.timeout = 1000ms;
  o.retries = 3;
  o.backoff = 1ms;
  o.max_backoff = 20ms;
  return o;
}

}  // namespace

TEST_SUITE("remote shards") {
  TEST_CASE("brace ranges and lists expand as WebDataset's names use them") {
    CHECK(expand_braces("a-{000..002}.tar") == std::vector<std::string>{"a-000.tar", "a-001.tar", "a-002.tar"});
    CHECK(expand_braces("{8..10}") == std::vector<std::string>{"8", "9", "10"});
    CHECK(expand_braces("{a,b}-{0..1}") == std::vector<std::string>{"a-0", "a-1", "b-0", "b-1"});
    CHECK(expand_braces("plain.tar") == std::vector<std::string>{"plain.tar"});
    CHECK(expand_braces("x{}.tar") == std::vector<std::string>{"x{}.tar"});
    CHECK_THROWS_WITH_AS(expand_braces("a-{3..1}.tar"), doctest::Contains("ends below its start"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(expand_braces("a-{0..1.tar"), doctest::Contains("not closed"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(expand_braces("a-0..1}.tar"), doctest::Contains("no '{'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(expand_braces("{0..999}{0..9999}"), doctest::Contains("million"), std::invalid_argument);
    CHECK(is_url("http://h/x.tar"));
    CHECK(is_url("https://h/x.tar"));
    CHECK(is_url("s3://b/x.tar"));
    CHECK_FALSE(is_url("/data/x.tar"));
    CHECK_FALSE(is_url("shards/http://x"));
  }

  TEST_CASE("shards over http and https: the same images, labels and names as on disk, each byte fetched once") {
    const Shards shards("same");
    for (const std::string& base : {env("STOKER_TEST_HTTP"), env("STOKER_TEST_HTTPS")}) {
      CAPTURE(base);
      RemoteOptions o;
      o.ca_file = env("STOKER_TEST_CA");
      const auto data = ImageDataset::open(shards.url(base), o);
      CHECK(data->shards() == 3);
      CHECK(data->name(5) == base + "/same/part-1.tar:k105.png");
      const RemoteCounts listed = data->remote_counts();
      // Per shard a HEAD and a request for its index; the third's 8 headers and its end marker.
      CHECK(listed.requests == 3 * 2 + 2 * Shards::kPer + 1);
      CHECK(listed.retries == 0);
      check_reads(*data, shards);
      const RemoteCounts read = data->remote_counts();
      // One request an image, for its bytes, its label's and what lies between them: the image's
      // last block's padding and the label's header.
      CHECK(read.requests - listed.requests == shards.bytes.size());
      CHECK(read.bytes - listed.bytes == shards.padded_image_bytes() + 512 * shards.bytes.size() + shards.label_bytes);
      // The same data set from the local files: one fingerprint but for the names.
      const auto local = ImageDataset::open(fs::path(env("STOKER_TEST_ROOT")) / "same/part-{0..2}.tar");
      CHECK(local->size() == data->size());
    }
  }

  TEST_CASE("a pipeline over remote shards reads every image of an epoch once, and decodes them") {
    const Shards shards("pipeline");
    const auto data = ImageDataset::open(shards.url(env("STOKER_TEST_HTTP")));
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(2)
                    .source("read", ImageSource(data))
                    .map("decode", ImageDecoder(), {.threads = 2})
                    .build();
    for (auto epoch : pipe.epochs()) {
      std::multiset<std::uint64_t> ids;
      for (auto& image : epoch) {
        ids.insert(image.id);
        CHECK(image.shape.height == 6 + image.id % 3);
      }
      CHECK(ids.size() == shards.bytes.size());
      CHECK(std::set<std::uint64_t>(ids.begin(), ids.end()).size() == shards.bytes.size());
    }
  }

  TEST_CASE("under on_error = skip, images whose reads fail for good are skipped and counted, the rest read") {
    const Shards shards("skipped");
    RemoteOptions o = quick();
    o.retries = 1;
    // Shard 0 through a proxy that answers every range request with half of it: its 4 images fail;
    // shards 1 and 2 straight from nginx.
    const std::string http = env("STOKER_TEST_HTTP"), proxy = env("STOKER_TEST_PROXY");
    const auto data = ImageDataset::from_tars(
        {proxy + "/rangehalf/skipped/part-0.tar", http + "/skipped/part-1.tar", http + "/skipped/part-2.tar"}, o);
    auto pipe = PipelineBuilder{}
                    .epochs(2)
                    .source("read", ImageSource(data), {.on_error = OnError::skip})
                    .map("decode", ImageDecoder())
                    .build();
    std::multiset<std::uint64_t> ids;
    for (auto epoch : pipe.epochs())
      for (auto& image : epoch) ids.insert(image.id);
    CHECK(ids.size() == 2 * 8);
    for (std::uint64_t id = 4; id < 12; ++id) CHECK(ids.count(id) == 2);
    const auto summary = pipe.summary();
    CHECK(summary.stages.front().name == "read");
    CHECK(summary.stages.front().skipped == 2 * 4);
  }

  TEST_CASE("a pipeline whose source waits on a server that does not answer stops within about a second") {
    const Shards shards("stalled");
    RemoteOptions o;
    o.timeout = 30s;  // past the proxy's stall of 3 s: only the stop ends the wait
    const auto data = ImageDataset::from_tars({env("STOKER_TEST_PROXY") + "/rangestall/stalled/part-0.tar"}, o);
    auto pipe = PipelineBuilder{}.source("read", ImageSource(data)).build();
    std::this_thread::sleep_for(300ms);  // the source's first read is in its request
    const auto t0 = std::chrono::steady_clock::now();
    pipe.stop();
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // libcurl asks whether to go on once a second
    CHECK(data->remote_counts().requests == 3);         // the HEAD, the index, the read given up
  }

  TEST_CASE("shards in S3 (s3rver): signed requests, credentials from the environment or ~/.aws files") {
    const Shards shards("s3");
    const std::string endpoint = env("STOKER_TEST_S3");
    // s3rver takes unsigned uploads; the shards and their indexes go to bucket stoker-test.
    const fs::path dir = fs::path(env("STOKER_TEST_ROOT")) / "s3";
    for (const auto& file : fs::directory_iterator(dir)) {
      const std::string put = "curl -sf -T '" + file.path().string() + "' '" + endpoint + "/stoker-test/s3/" +
                              file.path().filename().string() + "' > /dev/null";
      REQUIRE_MESSAGE(std::system(put.c_str()) == 0, put);
    }
    stoker::test::ScopedEnv environment({{"AWS_ENDPOINT_URL", endpoint},
                                         {"AWS_REGION", "us-east-1"},
                                         {"AWS_ACCESS_KEY_ID", "S3RVER"},
                                         {"AWS_SECRET_ACCESS_KEY", "S3RVER"}});
    const auto data = ImageDataset::open("s3://stoker-test/s3/part-{0..2}.tar");
    CHECK(data->name(5) == "s3://stoker-test/s3/part-1.tar:k105.png");
    check_reads(*data, shards);

    // A key id the server does not know: 403, not retried, the s3:// URL named.
    environment.set("AWS_ACCESS_KEY_ID", "NOBODY");
    const std::string e = data_error([&] { ImageDataset::from_tars({"s3://stoker-test/s3/part-0.tar"}, quick()); });
    CHECK(e == "s3://stoker-test/s3/part-0.tar: the server answered HTTP 403 Forbidden (1 attempt; not retried)");

    // The same from the AWS tools' files, for a profile.
    stoker::test::TempDir aws("aws");
    {
      std::ofstream(aws / "credentials") << "[default]\naws_access_key_id = NOBODY\n\n[stoker]\n"
                                            "aws_access_key_id = S3RVER\naws_secret_access_key = S3RVER\n";
      std::ofstream(aws / "config") << "[profile stoker]\nregion = us-east-1\nendpoint_url = " << endpoint << "\n";
    }
    environment.unset("AWS_ACCESS_KEY_ID");
    environment.unset("AWS_SECRET_ACCESS_KEY");
    environment.unset("AWS_ENDPOINT_URL");
    environment.set("AWS_SHARED_CREDENTIALS_FILE", (aws / "credentials").string());
    environment.set("AWS_CONFIG_FILE", (aws / "config").string());
    environment.set("AWS_PROFILE", "stoker");
    check_reads(*ImageDataset::open("s3://stoker-test/s3/part-{0..2}.tar"), shards);
  }

  TEST_CASE("an https server whose certificate is not trusted is refused at once, naming the URL") {
    const Shards shards("untrusted");
    RemoteOptions o = quick();
    o.ca_file = "/etc/ssl/certs/ca-certificates.crt";  // the system's: not the test's own certificate
    const std::string url = env("STOKER_TEST_HTTPS") + "/untrusted/part-0.tar";
    const std::string e = data_error([&] { ImageDataset::from_tars({url}, o); });
    CHECK(has(e, url + ": "));
    CHECK(has(e, "certificate"));
    CHECK(has(e, "(1 attempt; not retried)"));
  }

  TEST_CASE("a shard the server does not have: HTTP 404 naming its URL, not retried") {
    const std::string url = env("STOKER_TEST_HTTP") + "/nowhere/part-0.tar";
    const std::string e = data_error([&] { ImageDataset::from_tars({url}, quick()); });
    CHECK(e == url + ": the server answered HTTP 404 Not Found (1 attempt; not retried)");
  }

  TEST_CASE("faults the retries absorb: 503s, connections dropped mid-body, a stalled request") {
    const Shards shards("absorbed");
    const std::string proxy = env("STOKER_TEST_PROXY");
    for (const std::string fault : {"503x2", "dropx1"}) {
      CAPTURE(fault);
      const auto data = ImageDataset::open(shards.url(proxy + "/" + fault), quick());
      check_reads(*data, shards);
      const RemoteCounts c = data->remote_counts();
      CHECK(c.retries > 0);
      // Each request failed as often as the fault says (a HEAD has no body to drop), and every
      // request succeeded once: a HEAD and an index request a shard, the third's 8 headers and
      // end marker, one read an image.
      CHECK(c.requests - c.retries == 3 * 2 + 2 * Shards::kPer + 1 + shards.bytes.size());
    }
    // The proxy holds a stalled request for 3 s; the timeout gives up on it after 0.3 s. One shard:
    // each of its requests stalls once.
    RemoteOptions o = quick();
    o.timeout = 300ms;
    const auto data = ImageDataset::from_tars({proxy + "/stallx1/absorbed/part-0.tar"}, o);
    auto pool = BufferPool::create();
    for (std::uint64_t id = 0; id < data->size(); ++id)
      CHECK(text_of(data->read(id, *pool).bytes()) == text_of(shards.bytes[id]));
    const RemoteCounts c = data->remote_counts();
    CHECK(c.requests == 2 * (2 + Shards::kPer));  // a HEAD, the index, and a read an image: each twice
    CHECK(c.retries == c.requests / 2);
  }

  TEST_CASE("faults that do not pass: named with the URL, the answer and the attempts; never a short read") {
    const Shards shards("failing");
    const std::string proxy = env("STOKER_TEST_PROXY");
    RemoteOptions o = quick();
    o.retries = 2;
    const std::string url503 = proxy + "/always503/failing/part-0.tar";
    CHECK(data_error([&] { ImageDataset::from_tars({url503}, o); }) ==
          url503 + ": the server answered HTTP 503 Service Unavailable (3 attempts: RemoteOptions::retries = 2)");

    // A body cut short of its length every time: the index, in the listing. Then a well-formed
    // answer with half the bytes asked for (the shard's HEAD and its index pass).
    const std::string idx = proxy + "/short/failing/part-0.idx";
    const std::string listing = data_error([&] { ImageDataset::from_tars({proxy + "/short/failing/part-0.tar"}, o); });
    CHECK(has(listing, idx + ": "));
    CHECK(has(listing, "(3 attempts: RemoteOptions::retries = 2)"));
    const std::string cut = proxy + "/rangehalf/failing/part-0.tar";
    const auto data = ImageDataset::from_tars({cut}, o);
    auto pool = BufferPool::create();
    const std::string e = data_error([&] { data->read(0, *pool); });
    CHECK(has(e, cut + ": "));
    CHECK(has(e, "(3 attempts: RemoteOptions::retries = 2)"));

    // A server that ignores ranges: the whole shard where a member was asked for.
    const auto whole = ImageDataset::from_tars({proxy + "/norange/failing/part-0.tar"}, o);
    CHECK(has(data_error([&] { whole->read(1, *pool); }), "it does not take range requests (1 attempt; not retried)"));

    // The retry budget: once spent, the next failure is final.
    o.retries = 5;
    o.retry_budget = 1;
    CHECK(has(data_error([&] { ImageDataset::from_tars({url503}, o); }),
              "(2 attempts; the data set's retry budget, RemoteOptions::retry_budget = 1, is spent)"));
  }

  TEST_CASE("a cache: each shard fetched whole once, then every read, in this epoch and the next, from disk") {
    const Shards shards("cache");
    TempDir dir("cache");
    const std::string http = env("STOKER_TEST_HTTP");
    const auto data = ImageDataset::open(shards.url(http), cached(dir.path(), 1 << 30));
    // Shards 0 and 1: a HEAD and the index; shard 2, which has no index, is fetched whole and
    // listed from its copy: a HEAD, the index's 404, one request for its bytes.
    const RemoteCounts listed = data->remote_counts();
    CHECK(listed.requests == 2 * 2 + 3);
    CHECK(listed.cache_fetches == 1);
    check_reads(*data, shards);
    const RemoteCounts read = data->remote_counts();
    CHECK(read.requests - listed.requests == 2);  // shards 0 and 1, fetched at their first reads
    CHECK(read.cache_fetches == 3);
    CHECK(read.cache_hits == shards.bytes.size() - 2);
    check_reads(*data, shards);  // a second epoch: all from the disk
    CHECK(data->remote_counts().requests == read.requests);
    CHECK(data->remote_counts().cache_hits == read.cache_hits + shards.bytes.size());
    const CacheFiles files = cache_files(dir.path());
    CHECK(files.shards == std::set<std::string>{"part-0.tar", "part-1.tar", "part-2.tar"});
    CHECK_FALSE(files.parts);

    // Another data set on the same cache (as another process would be): its listing asks the
    // server for sizes and indexes only, and no read is a request.
    const auto again = ImageDataset::open(shards.url(http), cached(dir.path(), 1 << 30));
    check_reads(*again, shards);
    CHECK(again->remote_counts().requests == 3 * 2);
    CHECK(again->remote_counts().cache_fetches == 0);
    CHECK(again->remote_counts().cache_hits == shards.bytes.size() + 1);
  }

  TEST_CASE("the cache's byte budget: least recently used shards make room, and the directory never holds more") {
    const Shards shards("budget");
    TempDir dir("cache");
    const std::string http = env("STOKER_TEST_HTTP");
    std::vector<std::uint64_t> sizes;
    for (int s = 0; s < 3; ++s)
      sizes.push_back(fs::file_size(fs::path(env("STOKER_TEST_ROOT")) / ("budget/part-" + std::to_string(s) + ".tar")));
    // Room for two shards, not three; shard 2's is given by its index here, so all three are read
    // alike.
    const std::uint64_t budget = std::max({sizes[0] + sizes[1], sizes[1] + sizes[2], sizes[0] + sizes[2]}) +
                                 std::min({sizes[0], sizes[1], sizes[2]}) - 1;
    write_wds_index(wds_index_path(fs::path(env("STOKER_TEST_ROOT")) / "budget/part-2.tar"),
                    list_tar(fs::path(env("STOKER_TEST_ROOT")) / "budget/part-2.tar"));
    // A file of the user's own in the directory, older than any shard: never counted, never removed.
    std::ofstream(dir.path() / "notes.txt") << std::string(10'000, 'n');
    fs::last_write_time(dir.path() / "notes.txt", fs::file_time_type::clock::now() - std::chrono::hours(24));
    const auto data = ImageDataset::open(shards.url(http), cached(dir.path(), budget));
    auto pool = BufferPool::create();
    const auto read_shard = [&](int s) {  // its first image: fetches the shard, or reads its copy
      const auto id = static_cast<std::uint64_t>(s * Shards::kPer);
      CHECK(text_of(data->read(id, *pool).bytes()) == text_of(shards.bytes[id]));
      CHECK(cache_files(dir.path()).bytes <= budget);
    };
    read_shard(0);
    read_shard(1);
    std::this_thread::sleep_for(1100ms);  // a use is marked once a second at most
    read_shard(0);                        // now used after shard 1
    CHECK(data->remote_counts().cache_evictions == 0);
    read_shard(2);  // evicts shard 1, the least recently used, not shard 0, the first fetched
    CHECK(data->remote_counts().cache_evictions == 1);
    CHECK(cache_files(dir.path()).shards == std::set<std::string>{"part-0.tar", "part-2.tar"});
    const auto fetches = data->remote_counts().cache_fetches;
    read_shard(0);
    CHECK(data->remote_counts().cache_fetches == fetches);  // a hit
    read_shard(1);
    CHECK(data->remote_counts().cache_fetches == fetches + 1);
    CHECK(fs::file_size(dir.path() / "notes.txt") == 10'000);
    CHECK(data->remote_counts().cache_skipped == 0);

    // A budget below one shard: the cache keeps nothing, and every read is a request.
    TempDir small("cache");
    const auto direct = ImageDataset::open(shards.url(http), cached(small.path(), 100));
    check_reads(*direct, shards);
    CHECK(direct->remote_counts().cache_fetches == 0);
    CHECK(direct->remote_counts().cache_skipped == shards.bytes.size());
    CHECK(direct->remote_counts().requests == 3 * 2 + shards.bytes.size());
    CHECK(cache_files(small.path()).shards.empty());
  }

  TEST_CASE(
      "the cache after failures: a stale copy is fetched again, a failed fetch leaves nothing, a dead fetch's file "
      "goes") {
    const Shards shards("stale");
    TempDir dir("cache");
    const std::string http = env("STOKER_TEST_HTTP"), proxy = env("STOKER_TEST_PROXY");
    const auto data = ImageDataset::open(shards.url(http), cached(dir.path(), 1 << 30));
    check_reads(*data, shards);
    // A copy whose size is not the shard's (the object changed, or the file was damaged): the
    // next reader fetches the shard again.
    fs::path copy;
    for (const auto& f : fs::directory_iterator(dir.path()))
      if (f.path().filename().string().ends_with("-part-1.tar")) copy = f.path();
    REQUIRE_FALSE(copy.empty());
    fs::resize_file(copy, 100);
    const auto fetched = data->remote_counts().cache_fetches;
    check_reads(*data, shards);
    CHECK(data->remote_counts().cache_fetches == fetched + 1);
    CHECK(fs::file_size(copy) > 100);

    // A fetch that fails for good (every range answered with half of it): a DataError naming the
    // URL, and no file of it left in the cache.
    TempDir other("cache");
    const std::string cut = proxy + "/rangehalf/stale/part-0.tar";
    RemoteOptions o = quick();
    o.cache_dir = other.path();
    o.cache_bytes = 1 << 30;
    const auto failing = ImageDataset::from_tars({cut}, o);
    auto pool = BufferPool::create();
    CHECK(has(data_error([&] { failing->read(0, *pool); }), cut + ": "));
    CHECK(cache_files(other.path()).bytes == 0);
    CHECK_FALSE(cache_files(other.path()).parts);

    // A fetch's file that no fetch holds (its process died): removed when the next fetch counts.
    std::ofstream(other.path() / "0123456789abcdef-lost.tar.part") << std::string(5000, 'x');
    const auto fresh = ImageDataset::from_tars({http + "/stale/part-0.tar"}, o);
    CHECK(text_of(fresh->read(0, *pool).bytes()) == text_of(shards.bytes[0]));
    CHECK_FALSE(cache_files(other.path()).parts);
    CHECK(cache_files(other.path()).shards == std::set<std::string>{"part-0.tar"});
  }

  TEST_CASE("processes that share a cache fetch each shard once on the host") {
    const Shards shards("shared");
    TempDir dir("cache");
    // Four processes (this program, run for the case below) read every image at once, through a
    // proxy that answers range requests 0.5 s late: their fetches overlap.
    std::vector<pid_t> children;
    for (int i = 0; i < 4; ++i) {
      const std::string out = (dir.path() / ("child-" + std::to_string(i))).string();
      stoker::test::ScopedEnv child({{"STOKER_TEST_CACHE_CHILD", dir.path().string() + "/cache," + out}});
      std::string self = fs::read_symlink("/proc/self/exe").string(), filter = "-tc=a reader of a shared cache*";
      std::string quiet = "--minimal=true";  // its failures only
      char* argv[] = {self.data(), filter.data(), quiet.data(), nullptr};
      pid_t pid = 0;
      REQUIRE(::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, environ) == 0);
      children.push_back(pid);
    }
    for (const pid_t pid : children) {
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
    std::uint64_t fetches = 0, hits = 0;
    for (int i = 0; i < 4; ++i) {
      std::ifstream in(dir.path() / ("child-" + std::to_string(i)));
      std::uint64_t f = 0, h = 0;
      REQUIRE(static_cast<bool>(in >> f >> h));
      fetches += f;
      hits += h;
    }
    CHECK(fetches == 3);  // each shard once, by one of the four
    CHECK(hits == 4 * (shards.bytes.size() + 1) - 3);
    CHECK(cache_files(dir.path() / "cache").shards == std::set<std::string>{"part-0.tar", "part-1.tar", "part-2.tar"});
  }

  TEST_CASE("a reader of a shared cache (run by the case above, in processes of its own)") {
    const char* child = std::getenv("STOKER_TEST_CACHE_CHILD");
    if (!child) return;  // run alone, this case has nothing to do
    const std::string spec = child;
    const Shards shards("shared", /*write=*/false);  // the parent's
    const auto data = ImageDataset::open(shards.url(env("STOKER_TEST_PROXY") + "/rangeslow"),
                                         cached(spec.substr(0, spec.find(',')), 1 << 30));
    check_reads(*data, shards);
    std::ofstream(spec.substr(spec.find(',') + 1))
        << data->remote_counts().cache_fetches << ' ' << data->remote_counts().cache_hits << '\n';
  }

  TEST_CASE("remote and cache options that cannot work are refused, naming the option") {
    TempDir dir("cache");
    RemoteOptions o = cached(dir.path(), 0);
    CHECK_THROWS_WITH_AS(ImageDataset::open(env("STOKER_TEST_HTTP") + "/x/part-0.tar", o),
                         doctest::Contains("RemoteOptions::cache_bytes must be above 0"), std::invalid_argument);
    std::ofstream(dir.path() / "file") << "x";
    o = cached(dir.path() / "file", 1000);
    const std::string named = "RemoteOptions::cache_dir '" + (dir.path() / "file").string() + "'";
    CHECK_THROWS_WITH_AS(ImageDataset::open(env("STOKER_TEST_HTTP") + "/x/part-0.tar", o),
                         doctest::Contains(named.c_str()), std::invalid_argument);
    o = cached(dir.path(), 1000);
    o.prefetch = 65;
    CHECK_THROWS_WITH_AS(ImageDataset::open(env("STOKER_TEST_HTTP") + "/x/part-0.tar", o),
                         doctest::Contains("RemoteOptions::prefetch must be at most 64"), std::invalid_argument);
    o = RemoteOptions{};
    o.max_bytes_in_flight = 0;
    CHECK_THROWS_WITH_AS(ImageDataset::open(env("STOKER_TEST_HTTP") + "/x/part-0.tar", o),
                         doctest::Contains("RemoteOptions::max_bytes_in_flight must be above 0"),
                         std::invalid_argument);
  }

  TEST_CASE("in shard order, the epoch's next shards are fetched into the cache while the current one is read") {
    const Shards shards("prefetch");
    TempDir dir("cache");
    RemoteOptions o = cached(dir.path(), 1 << 30);
    o.prefetch = 1;
    // Range requests 0.5 s late: a fetch is slow enough to be seen under way. Shard 2, which has
    // no index, is fetched to be listed; shards 0 and 1 are not in the cache.
    const auto data = ImageDataset::open(shards.url(env("STOKER_TEST_PROXY") + "/rangeslow"), o);
    CHECK(data->prefetch_depth() == 1);
    CHECK(cache_files(dir.path()).shards == std::set<std::string>{"part-2.tar"});
    ImageSource source(data, {.order = ImageOrder::shards});
    const StageContext ctx{.seed = 11};
    std::vector<std::uint32_t> order;  // the epoch's shards, in its order
    for (std::uint64_t k = 0; k < data->size(); ++k)
      if (const auto s = data->shard_of(source.id_at(11, 0, k)); order.empty() || order.back() != s) order.push_back(s);
    REQUIRE(order.size() == 3);
    CAPTURE(order[0]);
    CAPTURE(order[1]);
    // The first read: its own shard, fetched by the reader; the next one in the plan, fetched
    // meanwhile, and there while nothing has read it.
    CHECK(source(ctx)->id == source.id_at(11, 0, 0));
    const auto named = [](std::uint32_t s) { return "part-" + std::to_string(s) + ".tar"; };
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!cache_files(dir.path()).shards.contains(named(order[1])) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    CHECK(cache_files(dir.path()).shards.contains(named(order[1])));
    CHECK(data->remote_counts().cache_hits == (order[0] == 2 ? 1u : 0u));  // the first read's, if listed: none of it
    // The rest of the epoch: every image right, no read waits for a fetch of its own.
    auto pool = BufferPool::create();
    for (std::uint64_t k = 1; k < data->size(); ++k) {
      const StageContext next{.seed = 11, .index = k};
      const auto image = source(next);
      REQUIRE(image.has_value());
      CHECK(text_of(image->bytes()) == text_of(shards.bytes[image->id]));
    }
    CHECK(data->remote_counts().cache_fetches == 3);  // each shard once: listed, read, prefetched
  }

  TEST_CASE("the bytes in flight stay within RemoteOptions::max_bytes_in_flight, readers waiting their turn") {
    const Shards shards("flight");
    std::uint64_t largest = 0;  // an image, its label and what lies between
    for (const auto& b : shards.bytes)
      largest = std::max<std::uint64_t>(largest, (b.size() + 511) / 512 * 512 + 512 + 2);
    for (const bool tight : {false, true}) {
      CAPTURE(tight);
      RemoteOptions o;
      if (tight) o.max_bytes_in_flight = largest;  // room for one read at a time
      const auto data = ImageDataset::open(shards.url(env("STOKER_TEST_PROXY") + "/rangeslow"), o);
      // Four threads read three images each at once; each request takes 0.5 s.
      std::vector<std::string> got(shards.bytes.size());
      {
        std::vector<std::jthread> readers;
        for (int t = 0; t < 4; ++t)
          readers.emplace_back([&, t] {
            auto pool = BufferPool::create();
            for (std::uint64_t id = static_cast<std::uint64_t>(t); id < got.size(); id += 4)
              got[id] = text_of(data->read(id, *pool).bytes());
          });
      }
      for (std::uint64_t id = 0; id < got.size(); ++id) CHECK(got[id] == text_of(shards.bytes[id]));
      const std::uint64_t peak = data->remote_counts().peak_bytes_in_flight;
      if (tight)
        CHECK(peak <= largest);
      else
        CHECK(peak > largest);  // the same readers, unbounded: several reads at once
    }
  }

  TEST_CASE("a source waiting for the network holds no turn of its pipeline's ThreadBudget") {
    const Shards shards("turns");
    // Every range request 0.5 s late: the source is mostly waiting.
    const auto data = ImageDataset::open(shards.url(env("STOKER_TEST_PROXY") + "/rangeslow"));
    auto budget = std::make_shared<ThreadBudget>(2);
    auto pipe = PipelineBuilder{}.budget(budget).source("read", ImageSource(data)).build();
    int idle = 0;  // moments at which no body held a turn
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(50ms);
      idle += budget->running() == 0;
    }
    pipe.stop();
    CHECK(idle >= 15);  // a held turn would make it 0
  }

  TEST_CASE("a list file at a URL, and URLs in a list: each image read whole with one request") {
    const Shards shards("lists");  // the images' bytes; the files below are written beside the shards
    const fs::path dir = fs::path(env("STOKER_TEST_ROOT")) / "lists";
    const std::string http = env("STOKER_TEST_HTTP");
    std::ofstream list(dir / "train.txt"), urls(dir / "urls.txt");
    for (std::size_t id = 0; id < shards.bytes.size(); ++id) {
      const std::string file = "img" + std::to_string(id) + ".png";
      std::ofstream(dir / file, std::ios::binary) << text_of(shards.bytes[id]);
      // The list at the server: relative paths, and every third image by its whole URL.
      list << (id % 3 == 0 ? http + "/lists/" + file : file) << ' ' << id % 5 << '\n';
      urls << http << "/lists/" << file << ' ' << id % 5 << '\n';  // a local list of URLs
    }
    list.close();
    urls.close();
    for (const std::string where : {http + "/lists/train.txt", (dir / "urls.txt").string()}) {
      CAPTURE(where);
      const auto data = ImageDataset::open(where);
      CHECK(data->name(1) == http + "/lists/img1.png");
      const RemoteCounts listed = data->remote_counts();
      check_reads(*data, shards);
      CHECK(data->remote_counts().requests - listed.requests == shards.bytes.size());
    }
    // An image the server does not have: a DataError naming its URL; a folder at a URL; an absolute
    // path in a list at a URL.
    std::ofstream(dir / "missing.txt") << "nowhere.png 1\n";
    auto pool = BufferPool::create();
    const auto missing = ImageDataset::open(http + "/lists/missing.txt");
    CHECK(data_error([&] { missing->read(0, *pool); }) ==
          http + "/lists/nowhere.png: the server answered HTTP 404 Not Found (1 attempt; not retried)");
    CHECK(
        has(data_error([&] { ImageDataset::open(http + "/lists/"); }), "is a folder at a URL, which cannot be listed"));
    std::ofstream(dir / "absolute.txt") << "/etc/passwd 1\n";
    CHECK(has(data_error([&] { ImageDataset::open(http + "/lists/absolute.txt"); }),
              "line 1: '/etc/passwd': a path in a list at a URL is a URL or relative to the list's folder"));
  }
}
