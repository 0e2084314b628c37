// SPDX-License-Identifier: Apache-2.0
// The plot in a real browser: headless Chromium loads the HTML page, which must draw without
// a script error, zoom to the range in its address, and answer the pointer; both the page and
// the SVG must render to PNG. Without chromium (Debian's package chromium) the program says so
// and exits 77, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "inspect.h"
#include "support.h"
#include "synthetic_log.h"

using namespace stoker;
using namespace stoker::inspect;
using namespace stoker::test;

namespace {

constexpr int kSkipped = 77;

// The browser on PATH: Debian names it chromium, some other distributions chromium-browser.
std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::filesystem::path candidate = std::filesystem::path(dir.empty() ? "." : dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  return "";
}

std::string& chromium() {
  static std::string binary;
  return binary;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Runs headless Chromium on `file` (with `fragment`, e.g. "#t=10,20") and `arguments`, with a
// profile of its own in `dir` and at most 60 s; returns what it printed on stdout. As root it
// needs --no-sandbox.
std::string run_chromium(const TempDir& dir, const std::filesystem::path& file, const std::string& arguments,
                         const std::string& fragment = "") {
  static int runs = 0;
  const std::string run = std::to_string(runs++);
  const auto out = dir / ("chromium-" + run + ".out"), err = dir / ("chromium-" + run + ".err");
  const std::string command =
      "timeout 60 '" + chromium() + "' --headless --no-sandbox --disable-gpu --hide-scrollbars" + " --user-data-dir='" +
      (dir / ("profile-" + run)).string() + "' --window-size=1200,900 " + arguments + " 'file://" + file.string() +
      fragment + "' >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(command.c_str());
  INFO("command: ", command);
  INFO("its stderr: ", read_file(err));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);  // 124: it ran past 60 s
  return read_file(out);
}

// The page after its scripts ran, as Chromium serializes it.
std::string dump_dom(const TempDir& dir, const std::filesystem::path& file, const std::string& fragment = "") {
  return run_chromium(dir, file, "--dump-dom", fragment);
}

// The page's error box: empty unless window.onerror caught something.
std::string script_errors(const std::string& dom) {
  const std::string open = "<pre id=\"errors\"";
  const auto begin = dom.find('>', dom.find(open)) + 1;
  return dom.substr(begin, dom.find("</pre>", begin) - begin);
}

void check_drawn(const std::string& dom) {
  INFO("the page's script errors: ", script_errors(dom));
  INFO("the page as Chromium left it begins: ", dom.substr(0, 300));
  CHECK(dom.find("data-plot=\"ready\"") != std::string::npos);
  CHECK(dom.find("data-plot=\"error\"") == std::string::npos);
  CHECK(script_errors(dom).empty());
}

// The text of the element with id `id`.
std::string text_of(const std::string& dom, const std::string& id) {
  const auto at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const auto begin = dom.find('>', at) + 1;
  return dom.substr(begin, dom.find('<', begin) - begin);
}

// Plays a user at the page: a pointer over the middle of the lanes, then away, a drag from a
// quarter to half of the time axis, and a double-click; what the page showed after each step
// goes into <pre id="probe">, one line each.
constexpr const char* kProbe = R"js(<script>//<![CDATA[
(function () {
  const lines = [];
  const svg = document.querySelector("svg.occupancy");
  const hit = svg.querySelector("rect[cursor=crosshair]");
  const box = hit.getBoundingClientRect();
  function fire(type, fraction) {
    hit.dispatchEvent(new MouseEvent(type, { bubbles: true, cancelable: true, button: 0,
                                             clientX: box.left + box.width * fraction,
                                             clientY: box.top + box.height / 2 }));
  }
  function readout() { return svg.querySelector("g.lane text.readout").textContent; }
  function view() { return document.getElementById("view").textContent; }
  function epochs() { return svg.querySelectorAll("g.epochs line").length; }
  fire("mousemove", 0.5);
  lines.push("hover: " + readout());
  fire("mouseleave", 0.5);
  lines.push("away: " + readout());
  fire("mousedown", 0.25);
  fire("mousemove", 0.5);
  fire("mouseup", 0.5);
  lines.push("dragged: " + view() + " epochs " + epochs());
  fire("dblclick", 0.5);
  lines.push("reset: " + view() + " epochs " + epochs());
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = lines.join("\n");
  document.body.appendChild(out);
})();
//]]></script>
)js";

std::string probe_line(const std::string& probe, const std::string& name) {
  const auto begin = probe.find(name + ": ");
  if (begin == std::string::npos) return "";
  return probe.substr(begin + name.size() + 2, probe.find('\n', begin) - begin - name.size() - 2);
}

}  // namespace

TEST_SUITE("stoker-inspect in a browser") {
  TEST_CASE("the page draws without a script error, zooms to the range in its address and answers the pointer") {
    TempDir dir("browser-page");
    const OccupancyLog log = synthetic_log({.seconds = 60, .epochs = 3});  // epochs at 0, 20 and 40 s
    const std::string html = plot_html(log, analyze(log));
    write_file(dir / "plot.html", html);

    check_drawn(dump_dom(dir, dir / "plot.html"));

    const std::string zoomed = dump_dom(dir, dir / "plot.html", "#t=10,25");
    check_drawn(zoomed);
    CHECK(text_of(zoomed, "view").find("Showing 10.00 s to 25.00 s") == 0);

    // The same page with a user's moves played at it, after its own script.
    std::string played = html;
    played.insert(played.rfind("</body>"), kProbe);
    write_file(dir / "played.html", played);
    const std::string dom = dump_dom(dir, dir / "played.html");
    check_drawn(dom);
    const std::string probe = text_of(dom, "probe");
    INFO("probe:\n", probe);
    double at = 0, fill = -1;
    CHECK(std::sscanf(probe_line(probe, "hover").c_str(), "at %lf s: fill %lf", &at, &fill) == 2);
    CHECK(at == doctest::Approx(30).epsilon(0.01));  // the middle of the run
    CHECK(fill >= 0.5);                              // the first queue, before the bottleneck
    CHECK(probe_line(probe, "away").find("mean fill 0.") == 0);
    double from = 0, to = 0;
    CHECK(std::sscanf(probe_line(probe, "dragged").c_str(), "Showing %lf s to %lf s", &from, &to) == 2);
    CHECK(from == doctest::Approx(15).epsilon(0.01));
    CHECK(to == doctest::Approx(30).epsilon(0.01));
    CHECK(probe_line(probe, "dragged").find("epochs 1") != std::string::npos);  // only the one at 20 s
    CHECK(probe_line(probe, "reset").find("Showing the whole run") == 0);
    CHECK(probe_line(probe, "reset").find("epochs 3") != std::string::npos);
  }

  TEST_CASE("a log without stage records or epochs draws too") {
    TempDir dir("browser-bare");
    const OccupancyLog log = synthetic_log({.seconds = 5, .epochs = 0, .stage_records = false, .counters = false});
    write_file(dir / "plot.html", plot_html(log, analyze(log)));
    check_drawn(dump_dom(dir, dir / "plot.html"));
  }

  TEST_CASE("the plot of a job's ranks renders, side by side") {
    TempDir dir("browser-job");
    std::vector<OccupancyLog> logs;
    for (int rank = 0; rank < 3; ++rank) {
      auto log = synthetic_log({.seconds = 5, .epochs = 1, .bottleneck = rank == 1 ? 1u : 5u});
      log.rank = std::to_string(rank);
      log.consumer = ConsumerCounters{100, rank == 1 ? 3.0 : 0.05, 5};
      logs.push_back(std::move(log));
    }
    const auto job = analyze_job(logs);
    write_file(dir / "job.svg", plot_job_svg(logs, job));
    const std::string dom = dump_dom(dir, dir / "job.svg");
    CHECK(dom.find("parsererror") == std::string::npos);
    CHECK(dom.find("straggler: rank 1") != std::string::npos);
    const auto png = dir / "job.png";
    run_chromium(dir, dir / "job.svg", "--screenshot='" + png.string() + "'");
    CHECK(read_file(png).size() > 20'000);
  }

  TEST_CASE("the SVG and the page render to PNG") {
    TempDir dir("browser-png");
    const OccupancyLog log = synthetic_log({.seconds = 60, .epochs = 3});
    const Report report = analyze(log);
    write_file(dir / "plot.svg", plot_svg(log, report));
    write_file(dir / "plot.html", plot_html(log, report));

    // An SVG that is not well-formed XML shows as Chromium's parser error instead.
    const std::string svg_dom = dump_dom(dir, dir / "plot.svg");
    CHECK(svg_dom.find("parsererror") == std::string::npos);
    CHECK(svg_dom.find("data-stage=\"collate\"") != std::string::npos);

    for (const char* name : {"plot.svg", "plot.html"}) {
      CAPTURE(name);
      const auto png = dir / (std::string(name) + ".png");
      run_chromium(dir, dir / name, "--screenshot='" + png.string() + "'");
      const std::string image = read_file(png);
      REQUIRE(image.size() > 8);
      CHECK(image.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
      CHECK(image.size() > 20'000);  // lanes, bars and text, not a blank page
    }
  }
}

int main(int argc, char** argv) {
  chromium() = find_chromium();
  if (chromium().empty()) {
    std::cout << "SKIPPED: chromium is not installed (Debian package chromium), so the plot's page was not "
                 "checked in a browser\n";
    return kSkipped;
  }
  std::cout << "using " << chromium() << '\n';
  doctest::Context context(argc, argv);
  return context.run();
}
