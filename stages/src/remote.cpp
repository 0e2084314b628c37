// SPDX-License-Identifier: Apache-2.0
#include <curl/curl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "remote_io.h"
#include "stoker/core/stage.h"
#include "stoker/stages/reader.h"

namespace stoker {

bool is_url(std::string_view where) noexcept {
  return where.starts_with("http://") || where.starts_with("https://") || where.starts_with("s3://");
}

namespace {

constexpr std::size_t kMaxNames = 1'000'000;

// The names one brace group stands for: a range "lo..hi" of whole numbers, or a list "a,b";
// anything else stands for itself, braces and all.
std::vector<std::string> brace_group(std::string_view inner, std::string_view pattern) {
  const auto dots = inner.find("..");
  const auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (dots != std::string_view::npos && digits(inner.substr(0, dots)) && digits(inner.substr(dots + 2))) {
    const std::string lo(inner.substr(0, dots)), hi(inner.substr(dots + 2));
    const std::uint64_t a = std::stoull(lo), b = std::stoull(hi);
    if (b < a)
      throw std::invalid_argument("expand_braces: '" + std::string(pattern) + "': the range {" + lo + ".." + hi +
                                  "} ends below its start");
    if (b - a >= kMaxNames)
      throw std::invalid_argument("expand_braces: '" + std::string(pattern) + "' stands for more than a million names");
    const std::size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
    std::vector<std::string> out;
    for (std::uint64_t n = a; n <= b; ++n) {
      std::string s = std::to_string(n);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
    }
    return out;
  }
  if (inner.find(',') != std::string_view::npos) {
    std::vector<std::string> out;
    for (std::size_t at = 0;;) {
      const auto comma = inner.find(',', at);
      out.emplace_back(inner.substr(at, comma - at));
      if (comma == std::string_view::npos) return out;
      at = comma + 1;
    }
  }
  return {"{" + std::string(inner) + "}"};
}

}  // namespace

std::vector<std::string> expand_braces(std::string_view pattern) {
  std::vector<std::string> names{""};
  for (std::size_t at = 0; at < pattern.size();) {
    const auto open = pattern.find('{', at);
    const auto stray = pattern.find('}', at);
    if (stray < open)
      throw std::invalid_argument("expand_braces: '" + std::string(pattern) + "' has a '}' with no '{' before it");
    const std::string_view literal = pattern.substr(at, open - at);
    for (auto& n : names) n += literal;
    if (open == std::string_view::npos) break;
    const auto close = pattern.find('}', open);
    if (close == std::string_view::npos || pattern.find('{', open + 1) < close)
      throw std::invalid_argument("expand_braces: '" + std::string(pattern) +
                                  "' has a '{' that is not closed before the next brace");
    const auto group = brace_group(pattern.substr(open + 1, close - open - 1), pattern);
    if (names.size() * group.size() > kMaxNames)
      throw std::invalid_argument("expand_braces: '" + std::string(pattern) + "' stands for more than a million names");
    std::vector<std::string> next;
    next.reserve(names.size() * group.size());
    for (const auto& n : names)
      for (const auto& g : group) next.push_back(n + g);
    names = std::move(next);
    at = close + 1;
  }
  return names;
}

namespace detail {

namespace {

// One libcurl handle per thread, reset before each request: it keeps its open connections (and
// what it resolved) from one request to the next.
CURL* thread_handle() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  struct Handle {
    CURL* curl = curl_easy_init();
    ~Handle() { curl_easy_cleanup(curl); }
  };
  thread_local Handle handle;
  if (!handle.curl) throw std::runtime_error("libcurl: curl_easy_init failed");
  curl_easy_reset(handle.curl);
  return handle.curl;
}

// Where a response's body goes: a fixed span (a range read: a byte past it is an error), or a
// vector that grows up to a limit.
struct Sink {
  CURL* curl = nullptr;  // set by perform(): the body of an answer other than 2xx is dropped
  std::span<std::byte> fixed;
  std::vector<std::byte>* grow = nullptr;
  std::uint64_t limit = 0;
  std::uint64_t got = 0;
  bool overflow = false;
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto& sink = *static_cast<Sink*>(user);
  const std::size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(sink.curl, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300) return len;  // an error's page, not the object
  const std::uint64_t room = sink.grow ? sink.limit : sink.fixed.size();
  if (len > room - sink.got) {
    sink.overflow = true;
    return 0;  // libcurl stops the transfer: CURLE_WRITE_ERROR
  }
  if (sink.grow)
    sink.grow->insert(sink.grow->end(), reinterpret_cast<const std::byte*>(data),
                      reinterpret_cast<const std::byte*>(data) + len);
  else
    std::memcpy(sink.fixed.data() + sink.got, data, len);
  sink.got += len;
  return len;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// `key` of section `section` of an INI file as ~/.aws files are written; empty when not there.
std::string ini_value(const std::string& path, const std::string& section, const std::string& key) {
  std::ifstream in(path);
  std::string line, current;
  const auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (current == section && eq != std::string::npos && trim(line.substr(0, eq)) == key)
      return trim(line.substr(eq + 1));
  }
  return "";
}

std::string percent_encode_path(std::string_view key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string status_text(long status) {
  const char* what = status == 400   ? " Bad Request"
                     : status == 401 ? " Unauthorized"
                     : status == 403 ? " Forbidden"
                     : status == 404 ? " Not Found"
                     : status == 416 ? " Range Not Satisfiable"
                     : status == 429 ? " Too Many Requests"
                     : status == 500 ? " Internal Server Error"
                     : status == 502 ? " Bad Gateway"
                     : status == 503 ? " Service Unavailable"
                     : status == 504 ? " Gateway Timeout"
                                     : "";
  return "HTTP " + std::to_string(status) + what;
}

// Failures of the transfer itself that another attempt may not meet: the network's and the
// server's, not the request's or the certificate's.
bool transient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct Remote::Outcome {
  enum Kind { ok, again, final } kind = ok;
  std::string why;
};

// S3 as the AWS tools configure it: the environment first, then ~/.aws/credentials and
// ~/.aws/config (or the files AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE name), for the
// profile AWS_PROFILE names ("default" when none).
struct S3Settings {
  std::string endpoint;  // a custom one (an S3 compatible): path-style requests to it
  std::string region, key_id, secret, token, ca_file;

  S3Settings() {
    const std::string home = env("HOME");
    const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
    const std::string credentials =
        !env("AWS_SHARED_CREDENTIALS_FILE").empty() ? env("AWS_SHARED_CREDENTIALS_FILE") : home + "/.aws/credentials";
    const std::string config = !env("AWS_CONFIG_FILE").empty() ? env("AWS_CONFIG_FILE") : home + "/.aws/config";
    const std::string section = profile == "default" ? profile : "profile " + profile;
    const auto pick = [&](const char* var, const std::string& file, const std::string& in, const char* key) {
      const std::string v = env(var);
      return !v.empty() ? v : ini_value(file, in, key);
    };
    key_id = pick("AWS_ACCESS_KEY_ID", credentials, profile, "aws_access_key_id");
    secret = pick("AWS_SECRET_ACCESS_KEY", credentials, profile, "aws_secret_access_key");
    token = pick("AWS_SESSION_TOKEN", credentials, profile, "aws_session_token");
    region = pick("AWS_REGION", config, section, "region");
    if (region.empty()) region = env("AWS_DEFAULT_REGION");
    if (region.empty()) region = "us-east-1";
    endpoint = pick("AWS_ENDPOINT_URL_S3", config, section, "endpoint_url");
    if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
    while (endpoint.ends_with('/')) endpoint.pop_back();
    ca_file = env("AWS_CA_BUNDLE");
  }

  // "s3://bucket/key" as an HTTP(S) URL: path-style to a custom endpoint, virtual-hosted to AWS.
  std::string url(const std::string& s3_url) const {
    const std::string_view rest = std::string_view(s3_url).substr(5);
    const auto slash = rest.find('/');
    if (slash == 0 || slash == std::string_view::npos || slash + 1 == rest.size())
      throw DataError(s3_url, "is not an S3 object's URL: expected s3://bucket/key");
    const std::string bucket(rest.substr(0, slash));
    const std::string key = percent_encode_path(rest.substr(slash + 1));
    if (!endpoint.empty()) return endpoint + "/" + bucket + "/" + key;
    return "https://" + bucket + ".s3." + region + ".amazonaws.com/" + key;
  }
};

Remote::Remote(RemoteOptions options) : options_(options), budget_left_(options.retry_budget) {
  if (options_.retries < 0) throw std::invalid_argument("RemoteOptions::retries must be 0 or more");
  if (options_.timeout.count() <= 0) throw std::invalid_argument("RemoteOptions::timeout must be above 0");
  if (options_.backoff.count() < 0 || options_.max_backoff < options_.backoff)
    throw std::invalid_argument("RemoteOptions::backoff must be 0 or more, and max_backoff no less than it");
  if (options_.prefetch > 64) throw std::invalid_argument("RemoteOptions::prefetch must be at most 64 (shards ahead)");
  if (options_.max_bytes_in_flight == 0)
    throw std::invalid_argument("RemoteOptions::max_bytes_in_flight must be above 0");
  if (!options_.cache_dir.empty())
    cache_ = std::make_unique<const ShardCache>(options_.cache_dir, options_.cache_bytes);
}

Remote::~Remote() {
  for (auto& t : prefetchers_) t.request_stop();  // all at once; the members' destruction joins them
}

const S3Settings* Remote::s3_of(const std::string& url) const {
  if (!url.starts_with("s3://")) return nullptr;
  std::call_once(s3_once_, [&] { s3_ = std::make_unique<S3Settings>(); });
  return s3_.get();
}

RemoteCounts Remote::counts() const noexcept {
  const CacheCounts c = cache_ ? cache_->counts() : CacheCounts{};
  std::uint64_t peak = 0;
  {
    std::lock_guard lock(flight_mutex_);
    peak = peak_in_flight_;
  }
  return {requests_.load(), retries_.load(), bytes_.load(), c.hits, c.fetches, c.evictions, c.skipped, peak};
}

void Remote::admit(std::uint64_t bytes, const std::stop_token& stop) const {
  std::unique_lock lock(flight_mutex_);
  flight_changed_.wait(lock, stop, [&] {
    return in_flight_ == 0 ||
           (in_flight_ <= options_.max_bytes_in_flight && bytes <= options_.max_bytes_in_flight - in_flight_);
  });
  if (stop.stop_requested()) throw PipelineStopped();
  in_flight_ += bytes;
  peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
}

void Remote::release(std::uint64_t bytes) const {
  {
    std::lock_guard lock(flight_mutex_);
    in_flight_ -= bytes;
  }
  flight_changed_.notify_all();
}

void Remote::prefetch(const std::string& url, std::uint64_t size) const {
  if (!prefetches()) return;
  {
    std::lock_guard lock(prefetch_mutex_);
    if (!prefetch_pending_.insert(url).second) return;
    prefetch_queue_.emplace_back(url, size);
    if (prefetchers_.empty())
      for (std::uint32_t i = 0; i < options_.prefetch; ++i)
        prefetchers_.emplace_back([this](std::stop_token stop) { prefetcher(stop); });
  }
  prefetch_asked_.notify_one();
}

void Remote::prefetcher(std::stop_token stop) const {
  for (;;) {
    std::pair<std::string, std::uint64_t> job;
    {
      std::unique_lock lock(prefetch_mutex_);
      if (!prefetch_asked_.wait(lock, stop, [&] { return !prefetch_queue_.empty(); })) return;  // stopped
      job = std::move(prefetch_queue_.front());
      prefetch_queue_.pop_front();
    }
    try {
      cache_->open(job.first, job.second, *this, stop, /*read=*/false);
    } catch (...) {  // a stop, or a failure the reads will meet and report
    }
    std::lock_guard lock(prefetch_mutex_);
    prefetch_pending_.erase(job.first);
  }
}

void Remote::with_retries(const std::string& url, const std::function<Outcome()>& once, std::stop_token stop) const {
  thread_local std::minstd_rand jitter(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    const Outcome o = once();
    if (o.kind == Outcome::ok) return;
    const std::string tries = std::to_string(attempt + 1) + (attempt == 0 ? " attempt" : " attempts");
    if (o.kind == Outcome::final) throw DataError(url, o.why + " (" + tries + "; not retried)");
    if (attempt == options_.retries)
      throw DataError(url,
                      o.why + " (" + tries + ": RemoteOptions::retries = " + std::to_string(options_.retries) + ")");
    std::uint64_t left = budget_left_.load();
    do {
      if (left == 0)
        throw DataError(url, o.why + " (" + tries + "; the data set's retry budget, RemoteOptions::retry_budget = " +
                                 std::to_string(options_.retry_budget) + ", is spent)");
    } while (!budget_left_.compare_exchange_weak(left, left - 1));
    retries_.fetch_add(1, std::memory_order_relaxed);
    const long long cap = std::min<long long>(
        options_.max_backoff.count(), static_cast<long long>(options_.backoff.count()) << std::min(attempt, 30));
    const std::chrono::milliseconds wait(std::uniform_int_distribution<long long>(0, cap)(jitter));
    std::mutex m;
    std::condition_variable_any woken;
    std::unique_lock lock(m);
    woken.wait_for(lock, stop, wait, [] { return false; });  // nothing but a stop wakes it early
    if (stop.stop_requested()) throw PipelineStopped();
  }
}

namespace {

struct Request {
  bool head = false;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> range;  // its first and last byte
};

struct Answer {
  CURLcode code = CURLE_OK;
  long status = 0;
  curl_off_t length = -1;  // Content-Length, where given
  std::string error;       // libcurl's words for a failed transfer
};

// The S3 request's empty payload's SHA-256, which S3 wants in a header of every signed request.
constexpr const char* kEmptySha256 =
    "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// One attempt of `request` for `url`, its body into `sink`.
// libcurl asks about once a second, and on every chunk: a request gives up when its reader stops.
int on_progress(void* stop, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::stop_token*>(stop)->stop_requested() ? 1 : 0;
}

Answer perform(const std::string& url, const Request& request, Sink& sink, const RemoteOptions& options,
               const S3Settings* s3, const std::stop_token& stop = {}) {
  CURL* c = thread_handle();
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  std::string target = url, range, user, sigv4, token, ca = options.ca_file;
  if (ca.empty() && s3) ca = s3->ca_file;
  if (ca.empty()) ca = env("CURL_CA_BUNDLE");
  if (ca.empty()) ca = env("SSL_CERT_FILE");
  if (s3) {
    target = s3->url(url);
    if (!s3->key_id.empty()) {  // no credentials: unsigned requests, as for a public bucket
      sigv4 = "aws:amz:" + s3->region + ":s3";
      user = s3->key_id + ":" + s3->secret;
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERPWD, user.c_str());
      headers = curl_slist_append(headers, kEmptySha256);
      if (!s3->token.empty()) {
        token = "x-amz-security-token: " + s3->token;
        headers = curl_slist_append(headers, token.c_str());
      }
    }
  }
  curl_easy_setopt(c, CURLOPT_URL, target.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min<long long>(options.timeout.count(), 10'000)));
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "stoker");
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  if (!ca.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca.c_str());
  if (request.head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (request.range) {
    range = std::to_string(request.range->first) + "-" + std::to_string(request.range->second);
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  sink.curl = c;
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (stop.stop_possible()) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &stop);
  }
  Answer a;
  a.code = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (a.code == CURLE_ABORTED_BY_CALLBACK) throw PipelineStopped();
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &a.length);
  if (a.code != CURLE_OK)
    a.error = std::string(curl_easy_strerror(a.code)) + (error[0] ? std::string(": ") + error : "");
  return a;
}

// What an answer other than the one wanted means: a transfer that failed, or a status; whether
// another attempt may go otherwise.
std::pair<bool, std::string> failure(const Answer& a) {
  if (a.code != CURLE_OK) return {transient(a.code), a.error};
  return {a.status == 429 || a.status >= 500, "the server answered " + status_text(a.status)};
}

}  // namespace

std::uint64_t Remote::size(const std::string& url) const {
  const S3Settings* s3s = s3_of(url);
  std::uint64_t size = 0;
  with_retries(url, [&]() -> Outcome {
    Sink sink;
    const Answer a = perform(url, {.head = true, .range = {}}, sink, options_, s3s);
    if (a.code == CURLE_OK && a.status == 200) {
      if (a.length < 0) return {Outcome::final, "the server gave no Content-Length for it"};
      size = static_cast<std::uint64_t>(a.length);
      return {};
    }
    const auto [retry, why] = failure(a);
    return {retry ? Outcome::again : Outcome::final, why};
  });
  return size;
}

void Remote::read(const std::string& url, std::uint64_t offset, std::span<std::byte> out, std::stop_token stop) const {
  if (out.empty()) return;
  admit(out.size(), stop);
  struct Release {
    const Remote& remote;
    std::uint64_t bytes;
    ~Release() { remote.release(bytes); }
  } release{*this, out.size()};
  const S3Settings* s3s = s3_of(url);
  const std::string what = std::to_string(out.size()) + " bytes at offset " + std::to_string(offset);
  with_retries(
      url,
      [&]() -> Outcome {
        Sink sink{.fixed = out};
        const Answer a = perform(url, {.range = std::pair{offset, offset + out.size() - 1}}, sink, options_, s3s, stop);
        if (sink.overflow)  // more than the range: a server that ignores ranges sends the whole object
          return {Outcome::final, a.status == 200
                                      ? "the server answered a request for " + what +
                                            " with the whole object (HTTP 200): it does not take range requests"
                                      : "the server sent more than the " + what + " asked for"};
        if (a.code == CURLE_OK && (a.status == 206 || (a.status == 200 && offset == 0))) {
          if (sink.got == out.size()) return {};
          return {Outcome::again,
                  "the answer to a request for " + what + " ended after " + std::to_string(sink.got) + " bytes"};
        }
        if (a.code == CURLE_OK && a.status == 416)
          return {Outcome::final, "the server answered HTTP 416 Range Not Satisfiable to a request for " + what +
                                      ": the object is shorter (was it changed after it was listed?)"};
        auto [retry, why] = failure(a);
        return {retry ? Outcome::again : Outcome::final, why + " to a request for " + what};
      },
      stop);
  bytes_.fetch_add(out.size(), std::memory_order_relaxed);
}

std::optional<std::vector<std::byte>> Remote::read_all(const std::string& url, std::uint64_t limit, bool missing_ok,
                                                       std::stop_token stop) const {
  const S3Settings* s3s = s3_of(url);
  std::vector<std::byte> body;
  bool missing = false;
  with_retries(
      url,
      [&]() -> Outcome {
        body.clear();
        Sink sink{.fixed = {}, .grow = &body, .limit = limit};
        const Answer a = perform(url, {}, sink, options_, s3s, stop);
        if (sink.overflow) return {Outcome::final, "holds more than " + std::to_string(limit) + " bytes"};
        if (a.code == CURLE_OK && a.status == 200) {
          if (a.length >= 0 && static_cast<std::uint64_t>(a.length) != body.size())
            return {Outcome::again, "the answer ended after " + std::to_string(body.size()) + " of its " +
                                        std::to_string(a.length) + " bytes"};
          return {};
        }
        if (a.code == CURLE_OK && a.status == 404 && missing_ok) {
          missing = true;
          return {};
        }
        const auto [retry, why] = failure(a);
        return {retry ? Outcome::again : Outcome::final, why};
      },
      stop);
  if (missing) return std::nullopt;
  bytes_.fetch_add(body.size(), std::memory_order_relaxed);
  return body;
}

RemoteFile::RemoteFile(std::shared_ptr<const Remote> remote, std::string url)
    : remote_(std::move(remote)), url_(std::move(url)), size_(remote_->size(url_)) {}

}  // namespace detail
}  // namespace stoker
