// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>  // getpid

#include "inspect.h"
#include "stoker/core/pipeline.h"
#include "support.h"
#include "synthetic_log.h"

using namespace stoker;
using namespace stoker::inspect;
using namespace stoker::test;

namespace {

std::string write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string sample(double t, const std::string& queue, int size, int capacity, const std::string& producer,
                   const std::string& consumer) {
  return nlohmann::json{
      {"type", "sample"},    {"t", t}, {"queue", queue}, {"size", size}, {"capacity", capacity}, {"producer", producer},
      {"consumer", consumer}}
      .dump();
}

// A two-queue pipeline, a -> b -> consumer, sampled `n` times with the given sizes.
std::string two_queue_log(int n, int size_ab, int size_bc) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += sample(0.01 * i, "a->b", size_ab, 10, "a", "b") + "\n" +
           sample(0.01 * i, "b->consumer", size_bc, 10, "b", "consumer") + "\n";
  return out;
}

OccupancyLog parse_text(const std::string& text, ReadOptions options = {}) {
  std::istringstream in(text);
  return parse_log(in, "test.jsonl", options);
}

// Enough of an XML parser to prove that a document is well-formed: every tag closed in
// order, attribute values quoted, every '&' the start of an entity, and what is neither
// (the page's scripts) in CDATA sections.
struct Markup {
  std::vector<std::string> errors;
  std::vector<std::string> elements;  // names of the opening tags, in order

  explicit Markup(const std::string& doc) {
    std::vector<std::string> open;
    std::size_t i = 0;
    while (i < doc.size()) {
      if (doc[i] == '&') {
        check_entity(doc, i);
        ++i;
        continue;
      }
      if (doc[i] != '<') {
        ++i;
        continue;
      }
      if (doc.compare(i, 4, "<!--") == 0) {
        i = skip_past(doc, i, "-->");
        continue;
      }
      if (doc.compare(i, 9, "<![CDATA[") == 0) {  // the page's scripts
        i = skip_past(doc, i, "]]>");
        continue;
      }
      if (doc.compare(i, 2, "<!") == 0 || doc.compare(i, 2, "<?") == 0) {
        i = skip_past(doc, i, ">");
        continue;
      }
      const std::size_t end = tag_end(doc, i);
      if (end == std::string::npos) {
        errors.push_back("unterminated tag at " + std::to_string(i));
        return;
      }
      const std::string tag = doc.substr(i + 1, end - i - 1);
      i = end + 1;
      if (tag.empty()) {
        errors.push_back("empty tag");
      } else if (tag[0] == '/') {
        const std::string name = tag.substr(1);
        if (open.empty() || open.back() != name)
          errors.push_back("</" + name + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">"));
        else
          open.pop_back();
      } else {
        const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
        elements.push_back(name);
        if (tag.back() != '/') open.push_back(name);
      }
    }
    for (const std::string& name : open) errors.push_back("<" + name + "> is never closed");
  }

  std::size_t count(const std::string& name) const { return std::count(elements.begin(), elements.end(), name); }

 private:
  std::size_t skip_past(const std::string& doc, std::size_t from, const std::string& what) {
    const std::size_t at = doc.find(what, from);
    if (at == std::string::npos) {
      errors.push_back("no '" + what + "' after " + std::to_string(from));
      return doc.size();
    }
    return at + what.size();
  }

  // The '>' that ends the tag at `from`, outside quoted attribute values.
  std::size_t tag_end(const std::string& doc, std::size_t from) {
    char quote = 0;
    for (std::size_t j = from + 1; j < doc.size(); ++j) {
      const char c = doc[j];
      if (quote) {
        if (c == quote)
          quote = 0;
        else if (c == '<')
          errors.push_back("'<' inside an attribute value");
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '<') {
        errors.push_back("'<' inside a tag");
      } else if (c == '>') {
        return j;
      }
    }
    return std::string::npos;
  }

  void check_entity(const std::string& doc, std::size_t at) {
    for (const char* entity : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"})
      if (doc.compare(at, std::strlen(entity), entity) == 0) return;
    errors.push_back("bare '&' at " + std::to_string(at));
  }
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The values of every `name="..."` attribute, in the order of the document.
std::vector<std::string> attribute_values(const std::string& doc, const std::string& name) {
  std::vector<std::string> out;
  const std::string open = " " + name + "=\"";
  for (auto at = doc.find(open); at != std::string::npos; at = doc.find(open, at + 1)) {
    const auto begin = at + open.size();
    out.push_back(doc.substr(begin, doc.find('"', begin) - begin));
  }
  return out;
}

// The group `<g class="name" ...>...</g>` (holding no groups of its own).
std::string group(const std::string& svg, const std::string& name) {
  const auto begin = svg.find("<g class=\"" + name + "\"");
  if (begin == std::string::npos) return "";
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

// The y of the first text in the group whose opening tag holds `attribute`: where it sits in
// the picture.
double row_top(const std::string& svg, const std::string& attribute) {
  const auto group = svg.find(attribute);
  REQUIRE(group != std::string::npos);
  const auto text = svg.find("<text ", group);
  return std::stod(svg.substr(svg.find(" y=\"", text) + 4));
}

// The data the page's script draws from: `const data = {...};`.
nlohmann::json page_data(const std::string& html) {
  const std::string start = "const data = ";
  const auto begin = html.find(start);
  REQUIRE(begin != std::string::npos);
  const auto end = html.find(";\n", begin);
  return nlohmann::json::parse(html.substr(begin + start.size(), end - begin - start.size()));
}

// The y of every point of an SVG path written as "Mx,y x,y ... Z".
std::vector<double> path_ys(const std::string& d) {
  std::vector<double> ys;
  for (auto comma = d.find(','); comma != std::string::npos; comma = d.find(',', comma + 1))
    ys.push_back(std::stod(d.substr(comma + 1)));
  return ys;
}

}  // namespace

TEST_SUITE("stoker-inspect") {
  TEST_CASE("the rule works from queue fills alone when a log has no stage counters") {
    CHECK(analyze(parse_text(two_queue_log(10, 0, 0))).verdict.part == "a");
    CHECK(analyze(parse_text(two_queue_log(10, 0, 0))).verdict.kind == Bottleneck::source);
    CHECK(analyze(parse_text(two_queue_log(10, 9, 0))).verdict.part == "b");
    CHECK(analyze(parse_text(two_queue_log(10, 10, 10))).verdict.part == "consumer");
    const Report r = analyze(parse_text(two_queue_log(10, 10, 10)));
    CHECK(r.stages.empty());
    CHECK(r.queues[0].full_pct == doctest::Approx(100));
    CHECK(r.queues[1].empty_pct == doctest::Approx(0));
    CHECK(r.queues[0].p95_fill == doctest::Approx(1.0));
  }

  TEST_CASE("stage counters break the tie when the queue fills say nothing") {
    // Half-full queues fit every candidate equally; 'b' busy all the time, 'a' blocked, and the
    // training loop waited 80% of the run.
    std::string log = two_queue_log(10, 5, 5);
    log += R"({"type":"consumer","t":1.0,"items":100,"waited_s":0.8})"
           "\n";
    log +=
        R"({"type":"stage","t":1.0,"stage":"a","threads":1,"items_in":0,"items_out":100,"busy_s":0.1,"starved_s":0,"blocked_s":0.9})"
        "\n"
        R"({"type":"stage","t":1.0,"stage":"b","threads":4,"items_in":100,"items_out":100,"busy_s":3.9,"starved_s":0,"blocked_s":0})"
        "\n";
    const Report r = analyze(parse_text(log));
    CHECK(r.verdict.part == "b");
    CHECK(r.verdict.kind == Bottleneck::stage);
    REQUIRE(r.stages.size() == 2);
    CHECK(r.stages[1].busy_pct == doctest::Approx(97.5));
    CHECK(r.stages[0].blocked_pct == doctest::Approx(90));
    CHECK(r.verdict.suggestion.find("it has 4") != std::string::npos);
    CHECK(r.verdict.suggestion.find("the pipeline's") == std::string::npos);  // no pipeline record: not known

    // The pipeline has threads for 'b' to double: nothing about them.
    const Report roomy = analyze(parse_text(log + R"({"type":"pipeline","t":1.0,"threads":16,"cores":16})"
                                                  "\n"));
    CHECK(roomy.verdict.suggestion.find("the pipeline's") == std::string::npos);
    // Its 5 threads are all given (1 + 4): doubling 'b' needs 4 more; the machine has 16 cores.
    const Report full = analyze(parse_text(log + R"({"type":"pipeline","t":1.0,"threads":5,"cores":16})"
                                                 "\n"));
    CHECK(full.verdict.suggestion.find("try {.threads = 8} on stage 'b'") != std::string::npos);
    CHECK(full.verdict.suggestion.find("the pipeline's 5 threads are all given to its stages (5 in all)") !=
          std::string::npos);
    CHECK(full.verdict.suggestion.find("PipelineBuilder::threads(9)") != std::string::npos);
    // On 2 cores, where the stages compute (their threads' CPU time is their busy time), no
    // more threads than cores are asked for: it says why, and what helps instead.
    const Report cores = analyze(
        parse_text(log + R"({"type":"pipeline","t":1.0,"threads":2,"cores":2,"cpu_s":3.9,"machine_busy_pct":100})"
                         "\n"));
    CHECK(cores.verdict.suggestion.find("PipelineBuilder::threads(9)") == std::string::npos);
    CHECK(cores.verdict.suggestion.find("{.threads = 8}") == std::string::npos);
    CHECK(cores.verdict.suggestion.find("'b' has 4 threads, at least as many as the machine's 2 cores, and computes") !=
          std::string::npos);
    CHECK(cores.verdict.suggestion.find("add cores, or move its work to the GPU") != std::string::npos);
    // Where they wait (little CPU for their busy time, the machine idle), more threads than
    // cores are asked for, saying why.
    const Report waits = analyze(
        parse_text(log + R"({"type":"pipeline","t":1.0,"threads":2,"cores":2,"cpu_s":0.1,"machine_busy_pct":20})"
                         "\n"));
    CHECK(waits.verdict.suggestion.find("PipelineBuilder::threads(9)): more than the machine's 2 cores, which helps "
                                        "here because its stages wait") != std::string::npos);
  }

  TEST_CASE("a queue swinging between empty and full gets a larger capacity suggested") {
    std::string log;
    for (int i = 0; i < 20; ++i)
      log += sample(0.01 * i, "a->b", i % 2 ? 10 : 0, 10, "a", "b") + "\n" +
             sample(0.01 * i, "b->consumer", 10, 10, "b", "consumer") + "\n";
    const Report r = analyze(parse_text(log));
    CHECK(r.queues[0].empty_pct == doctest::Approx(50));
    CHECK(r.queues[0].full_pct == doctest::Approx(50));
    CHECK(r.verdict.suggestion.find("queue 'a->b' swings between empty") != std::string::npos);
    CHECK(r.verdict.suggestion.find("try {.queue = 20} on stage 'a'") != std::string::npos);
    CHECK(r.verdict.suggestion.find("'b->consumer' swings") == std::string::npos);
    CHECK(r.queues[0].swings == 19);

    // Filling at the start and draining at the end is one swing each way, not a queue too small.
    std::string fill_and_drain;
    for (int i = 0; i < 20; ++i)
      fill_and_drain += sample(0.01 * i, "a->b", i < 3 || i > 16 ? 0 : 10, 10, "a", "b") + "\n" +
                        sample(0.01 * i, "b->consumer", 10, 10, "b", "consumer") + "\n";
    const Report drained = analyze(parse_text(fill_and_drain));
    CHECK(drained.queues[0].empty_pct == doctest::Approx(30));
    CHECK(drained.queues[0].swings == 2);
    CHECK(drained.verdict.suggestion.find("swings") == std::string::npos);
  }

  TEST_CASE("queues come back in pipeline order even when the log lists them out of it") {
    const std::string log = sample(0, "b->consumer", 1, 10, "b", "consumer") + "\n" +
                            sample(0, "a->b", 1, 10, "a", "b") + "\n" + sample(0.1, "a->b", 1, 10, "a", "b") + "\n";
    const OccupancyLog parsed = parse_text(log);
    REQUIRE(parsed.queues.size() == 2);
    CHECK(parsed.queues[0].name == "a->b");
    CHECK(parsed.queues[0].samples.size() == 2);
    CHECK(parsed.queues[1].name == "b->consumer");
  }

  TEST_CASE("a missing file is an error naming it") {
    TempDir dir("missing");
    const std::string path = (dir / "no-such.jsonl").string();
    CHECK_THROWS_WITH_AS(read_log(path), doctest::Contains((path + ": cannot open").c_str()), LogError);
  }

  TEST_CASE("an empty log, or one without sample records, is an error naming the file") {
    TempDir dir("empty");
    const std::string empty = write_file(dir / "empty.jsonl", "");
    CHECK_THROWS_WITH_AS(read_log(empty), doctest::Contains((empty + ": no sample records").c_str()), LogError);
    const std::string stages_only = write_file(
        dir / "stages.jsonl",
        R"({"type":"stage","t":1,"stage":"a","threads":1,"items_in":0,"items_out":1,"busy_s":0,"starved_s":0,"blocked_s":0})"
        "\n\n");
    CHECK_THROWS_WITH_AS(read_log(stages_only), doctest::Contains("no sample records"), LogError);
  }

  TEST_CASE("a malformed line is an error naming the file, its line number and the problem") {
    const std::string good = sample(0, "a->consumer", 1, 4, "a", "consumer") + "\n";
    struct Case {
      std::string line, problem;
    };
    const std::vector<Case> cases = {
        {R"({"type":"sample","t":0.1,"queue":"a->consumer","size":1,)", "not JSON"},
        {"[1, 2]", "must be a JSON object"},
        {R"({"type":"sample","t":1e400})", "not JSON: number overflow parsing '1e400'"},
        {R"({"t":0})", "no string 'type'"},
        {R"({"type":"sample","t":0.1,"queue":"a->consumer","capacity":4,"producer":"a","consumer":"consumer"})",
         "sample record has no 'size'"},
        {R"({"type":"sample","t":0.1,"queue":"a->consumer","size":-1,"capacity":4,"producer":"a","consumer":"consumer"})",
         "'size' must be a non-negative integer, not -1"},
        {R"({"type":"sample","t":0.1,"queue":"a->consumer","size":1,"capacity":0,"producer":"a","consumer":"consumer"})",
         "'capacity' must be at least 1"},
        {R"({"type":"sample","t":"soon","queue":"a->consumer","size":1,"capacity":4,"producer":"a","consumer":"consumer"})",
         "'t' must be a non-negative number"},
        {R"({"type":"sample","t":0.1,"queue":"a->consumer","size":1,"capacity":4,"producer":"x","consumer":"consumer"})",
         "was between 'a' and 'consumer' earlier"},
        {R"({"type":"stage","t":1,"stage":"a","threads":0,"items_in":0,"items_out":1,"busy_s":0,"starved_s":0,"blocked_s":0})",
         "'threads' must be between 1"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.line);
      std::string message;
      try {
        parse_text(good + good + c.line + "\n" + good);
      } catch (const LogError& e) {
        message = e.what();
      }
      CHECK(message.rfind("test.jsonl:3: ", 0) == 0);
      CHECK(message.find(c.problem) != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);
    }
  }

  TEST_CASE("skip_bad_lines counts malformed lines and keeps the rest") {
    const std::string good = sample(0, "a->consumer", 2, 4, "a", "consumer") + "\n";
    const std::string log = good + "garbage\n" + good + R"({"type":"sample"})" + "\n" + good;
    const OccupancyLog parsed = parse_text(log, {.skip_bad_lines = true});
    CHECK(parsed.skipped_lines == 2);
    CHECK(parsed.first_skipped.find("line 2: not JSON") == 0);
    REQUIRE(parsed.queues.size() == 1);
    CHECK(parsed.queues[0].samples.size() == 3);
    CHECK(analyze(parsed).queues[0].mean_fill == doctest::Approx(0.5));

    // Nothing but bad lines is still an empty log, and says why.
    CHECK_THROWS_WITH_AS(parse_text("garbage\nmore garbage\n", {.skip_bad_lines = true}),
                         doctest::Contains("no sample records (2 malformed lines skipped)"), LogError);
  }

  TEST_CASE("a counters record is kept, printed and put in the JSON") {
    const std::string log = sample(0, "a->consumer", 2, 4, "a", "consumer") + "\n" +
                            R"({"type":"counters","t":1.0,"counters":{"h2d_copies":150,"d2h_copies":0}})" + "\n";
    const Report r = analyze(parse_text(log));
    REQUIRE(r.counters.size() == 2);
    CHECK(to_json(r).at("counters").at("h2d_copies") == 150);
    std::ostringstream text;
    print_report(text, r);
    CHECK(text.str().find("h2d_copies 150") != std::string::npos);
    CHECK_THROWS_WITH_AS(parse_text(log + R"({"type":"counters","t":1.0,"counters":{"x":-1}})" + "\n"),
                         doctest::Contains("test.jsonl:3: counter 'x' must be a non-negative integer"), LogError);
  }

  TEST_CASE("epoch records are read as the epochs' start times") {
    const std::string log = R"({"type":"epoch","t":0.001,"epoch":0})"
                            "\n" +
                            sample(0.5, "a->consumer", 2, 4, "a", "consumer") + "\n" +
                            R"({"type":"epoch","t":1.25,"epoch":1})"
                            "\n" +
                            sample(1.5, "a->consumer", 2, 4, "a", "consumer") + "\n";
    const OccupancyLog parsed = parse_text(log);
    REQUIRE(parsed.epochs.size() == 2);
    CHECK(parsed.epochs[0].t == doctest::Approx(0.001));
    CHECK(parsed.epochs[0].epoch == 0);
    CHECK(parsed.epochs[1].t == doctest::Approx(1.25));
    CHECK(parsed.epochs[1].epoch == 1);
    CHECK(parse_text(sample(0, "a->consumer", 2, 4, "a", "consumer") + "\n").epochs.empty());
    CHECK_THROWS_WITH_AS(parse_text(log + R"({"type":"epoch","t":2})" + "\n"),
                         doctest::Contains("test.jsonl:5: epoch record has no 'epoch'"), LogError);
    CHECK_THROWS_WITH_AS(parse_text(log + R"({"type":"epoch","t":2,"epoch":-1})" + "\n"),
                         doctest::Contains("test.jsonl:5: 'epoch' must be a non-negative integer, not -1"), LogError);
  }

  TEST_CASE("the autotuner's moves are read, listed in the report and the JSON, and marked on the plot") {
    const std::string move =
        R"({"type":"autotune","t":1.25,"changes":[{"stage":"crops","from":1,"to":2},{"stage":"collate","from":3,"to":2}],)"
        R"("evidence":"crops 98% busy on 1 thread; collate 20% busy on 3 threads"})";
    const std::string log = sample(0.5, "a->consumer", 2, 4, "a", "consumer") + "\n" + move + "\n" +
                            sample(1.5, "a->consumer", 2, 4, "a", "consumer") + "\n";
    const OccupancyLog parsed = parse_text(log);
    REQUIRE(parsed.moves.size() == 1);
    CHECK(parsed.moves[0].t == doctest::Approx(1.25));
    CHECK(parsed.moves[0].what == "crops 1 -> 2 threads, collate 3 -> 2");
    CHECK(parsed.moves[0].evidence == "crops 98% busy on 1 thread; collate 20% busy on 3 threads");

    const Report report = analyze(parsed);
    std::ostringstream text;
    print_report(text, report);
    CHECK(text.str().find("autotune: 1 move\n  at 1.25 s: crops 1 -> 2 threads, collate 3 -> 2 (crops 98% busy") !=
          std::string::npos);
    CHECK(to_json(report).at("autotune").at(0).at("what") == "crops 1 -> 2 threads, collate 3 -> 2");

    const std::string svg = plot_svg(parsed, report);
    CHECK(count(group(svg, "moves"), "<line") == 1);
    CHECK(group(svg, "moves").find("<title>crops 1 -&gt; 2 threads") != std::string::npos);
    CHECK(page_data(plot_html(parsed, report)).at("marks").at(1).at("marks").size() == 1);

    CHECK_THROWS_WITH_AS(parse_text(R"({"type":"autotune","t":1,"changes":[],"evidence":"x"})"
                                    "\n"),
                         doctest::Contains("'changes' must be a non-empty array"), LogError);
  }

  TEST_CASE("record types the inspector does not know are passed over") {
    const std::string log = R"({"type":"heartbeat","t":0.5,"beat":1})"
                            "\n" +
                            sample(0, "a->consumer", 2, 4, "a", "consumer") + "\n";
    CHECK(parse_text(log).queues.size() == 1);
  }

  TEST_CASE("the plot is well-formed SVG, and HTML, with one lane per queue and escaped names") {
    // Names with every character XML reserves, which a stage name may well hold.
    std::string log;
    for (int i = 0; i < 50; ++i)
      log += sample(0.02 * i, "read&<x>->decode", i % 8, 8, "read&<x>", "decode \"fast\"") + "\n" +
             sample(0.02 * i, "shuffle", 16, 32, "decode \"fast\"", "batch'") + "\n" +
             sample(0.02 * i, "batch'->consumer", 1, 4, "batch'", "consumer") + "\n";
    const OccupancyLog parsed = parse_text(log);
    const Report report = analyze(parsed);

    const std::string svg = plot_svg(parsed, report);
    CHECK(svg.rfind("<svg ", 0) == 0);
    const Markup svg_markup(svg);
    CHECK(svg_markup.errors.empty());
    for (const std::string& e : svg_markup.errors) MESSAGE(e);
    CHECK(count(svg, "<g class=\"lane\"") == 3);
    CHECK(count(svg, "<path class=\"band\"") == 3);
    CHECK(count(svg, "<path class=\"mean\"") == 3);
    CHECK(svg.find("<script") == std::string::npos);
    CHECK(svg.find("read&amp;&lt;x&gt; -&gt; decode &quot;fast&quot;") != std::string::npos);
    CHECK(svg.find("decode &quot;fast&quot; -&gt; batch&apos;") != std::string::npos);
    CHECK(svg.find("batch&apos; -&gt; consumer") != std::string::npos);
    CHECK(svg.find("time (s)") != std::string::npos);

    const std::string html = plot_html(parsed, report);
    CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
    const Markup html_markup(html);
    CHECK(html_markup.errors.empty());
    for (const std::string& e : html_markup.errors) MESSAGE(e);
    CHECK(html_markup.count("html") == 1);
    CHECK(html_markup.count("svg") == 1);
    CHECK(html.find(svg) != std::string::npos);  // the same picture

    // A control character, which XML cannot carry at all, comes out replaced.
    const OccupancyLog control = parse_text(sample(0, "a\u0001b", 1, 2, "a\u0001b", "consumer") + "\n");
    const std::string control_svg = plot_svg(control, analyze(control));
    CHECK(control_svg.find("a?b -&gt; consumer") != std::string::npos);
    CHECK(control_svg.find('\x01') == std::string::npos);

    // The checker itself catches what it is there to catch.
    CHECK(!Markup("<svg><g></svg>").errors.empty());
    CHECK(!Markup("<svg><text>a & b</text></svg>").errors.empty());
    CHECK(!Markup("<svg><text>a <b> c</text></svg>").errors.empty());
    CHECK(!Markup("<script>if (a < b && c) f();</script>").errors.empty());
    CHECK(Markup("<script>//<![CDATA[\nif (a < b && c) f();\n//]]></script>").errors.empty());
  }

  TEST_CASE(
      "the plot shows the lanes in pipeline order, the stages' shares, the bottleneck, the epochs and the "
      "counters") {
    const OccupancyLog log = parse_text(to_jsonl(synthetic_log({.seconds = 60, .epochs = 3, .bottleneck = 3})));
    const Report report = analyze(log);
    REQUIRE(report.verdict.part == "collate");
    const std::string svg = plot_svg(log, report);
    CHECK(Markup(svg).errors.empty());

    // Source at the top, and each stage's row between the lane it empties and the lane it fills.
    CHECK(attribute_values(svg, "data-queue") == std::vector<std::string>{"read-&gt;crops", "shuffle",
                                                                          "batch-&gt;collate", "collate-&gt;h2d",
                                                                          "h2d-&gt;consumer"});
    CHECK(attribute_values(svg, "data-stage") == synthetic_stages());
    std::vector<std::string> rows;  // stages and queues as they come down the picture
    for (const std::string& g : attribute_values(svg, "class"))
      if (g == "stage" || g == "stage bottleneck" || g == "lane") rows.push_back(g);
    CHECK(rows == std::vector<std::string>{"stage", "lane", "stage", "lane", "stage", "lane", "stage bottleneck",
                                           "lane", "stage", "lane", "stage"});
    for (std::size_t k = 0; k + 1 < synthetic_stages().size(); ++k) {
      CAPTURE(k);
      const double stage = row_top(svg, "data-stage=\"" + synthetic_stages()[k] + "\"");
      const double lane = row_top(svg, "data-queue=\"" + attribute_values(svg, "data-queue")[k] + "\"");
      const double next = row_top(svg, "data-stage=\"" + synthetic_stages()[k + 1] + "\"");
      CHECK(stage < lane);
      CHECK(lane < next);
    }
    CHECK(svg.find("read -&gt; crops (read-&gt;crops, capacity 64)") != std::string::npos);

    // The verdict, its evidence and its suggestion; the bottleneck's row is marked.
    CHECK(svg.find("bottleneck: </tspan>stage &apos;collate&apos; (fit ") != std::string::npos);
    CHECK(svg.find("the stages before it were blocked: read 75%, crops 75%, batch 75%") != std::string::npos);
    CHECK(svg.find("give &apos;collate&apos; more threads") != std::string::npos);
    CHECK(count(svg, "class=\"stage bottleneck\"") == 1);
    CHECK(svg.find("class=\"stage bottleneck\" data-stage=\"collate\"") != std::string::npos);
    CHECK(count(svg, "the bottleneck</tspan>") == 1);

    // A bar per stage with counters (the training loop keeps none), in shares of the run.
    CHECK(count(svg, "<rect class=\"busy\"") == 5);
    CHECK(count(svg, "<rect class=\"starved\"") == 5);
    CHECK(count(svg, "<rect class=\"blocked\"") == 5);
    CHECK(svg.find("busy 96% \xc2\xb7 starved 1% \xc2\xb7 blocked 1%") != std::string::npos);
    CHECK(svg.find("the training loop keeps none") != std::string::npos);

    // One mark per epoch across the lanes, labelled, and the counters.
    const std::string epochs = group(svg, "epochs");
    CHECK(count(epochs, "<line") == 3);
    for (const char* label : {">epoch 1<", ">epoch 2<", ">epoch 3<"}) CHECK(epochs.find(label) != std::string::npos);
    CHECK(svg.find(">counters: </tspan>") != std::string::npos);
    CHECK(svg.find("h2d_bytes 1652747624 (1.65 GB)") != std::string::npos);
    CHECK(svg.find("h2d_copies 2356") != std::string::npos);
    CHECK(svg.find("mean fill 0.03") != std::string::npos);  // collate->h2d, after the bottleneck
  }

  TEST_CASE("the page carries the picture, its data and its script, and loads nothing from elsewhere") {
    const OccupancyLog log = synthetic_log({.seconds = 60, .epochs = 3});
    const std::string html = plot_html(log, analyze(log));
    CHECK(Markup(html).errors.empty());
    CHECK(count(html, "<script>") == 2);
    CHECK(html.find("window.onerror") < html.find("const data = "));
    CHECK(html.find("<body data-plot=\"loading\">") != std::string::npos);
    for (const char* outside : {" src=", " href=", "<link", "@import", "url(http", "fetch(", "XMLHttpRequest"}) {
      CAPTURE(outside);
      CHECK(html.find(outside) == std::string::npos);
    }

    const nlohmann::json data = page_data(html);
    REQUIRE(data.at("lanes").size() == 5);
    const nlohmann::json& epochs = data.at("marks").at(0);
    CHECK(epochs.at("cls") == "epochs");
    CHECK(epochs.at("marks").size() == 3);
    CHECK(epochs.at("marks").at(1).at(1) == "epoch 2");  // the second, counted from 1 for people
    CHECK(data.at("marks").at(1).at("marks").empty());  // no autotune moves
    const std::size_t bins = data.at("bins");
    CHECK(bins == 1200);  // as many as the samples: nothing to merge yet
    for (const nlohmann::json& lane : data.at("lanes")) {
      for (const char* key : {"lo", "mean", "hi", "n"}) CHECK(lane.at(key).size() == bins);
      std::size_t samples = 0;
      for (std::size_t n : lane.at("n")) samples += n;
      CHECK(samples == 1200);
    }
    // The first queue swings between half full and full, so its bins span that.
    const nlohmann::json& first = data.at("lanes").at(0);
    CHECK(*std::max_element(first.at("hi").begin(), first.at("hi").end()) == 1000);
    CHECK(*std::min_element(first.at("lo").begin(), first.at("lo").end()) <= 500);

    // Names cannot end the script or its CDATA section: the data holds no '<', '>' or '&'.
    std::string hostile;
    for (int i = 0; i < 5; ++i) hostile += sample(0.1 * i, "]]></script><!--&", 1, 2, "</script>", "consumer") + "\n";
    const OccupancyLog parsed = parse_text(hostile);
    const std::string page = plot_html(parsed, analyze(parsed));
    CHECK(Markup(page).errors.empty());
    const std::string script = page.substr(page.find("const data = "));
    CHECK(script.find("</script>") == script.rfind("</script>"));  // only the script's own end
  }

  TEST_CASE("a log without stage records, epochs or counters still plots") {
    const OccupancyLog log = parse_text(two_queue_log(10, 9, 0));
    const Report report = analyze(log);
    const std::string svg = plot_svg(log, report);
    CHECK(Markup(svg).errors.empty());
    CHECK(count(svg, "<g class=\"lane\"") == 2);
    CHECK(count(svg, "<rect class=\"busy\"") == 0);
    CHECK(count(svg, "the log has no stage records") == 2);  // a and b; the training loop keeps none anyway
    CHECK(count(group(svg, "epochs"), "<line") == 0);
    CHECK(svg.find(">counters: </tspan>") == std::string::npos);
    CHECK(svg.find("class=\"stage bottleneck\" data-stage=\"b\"") != std::string::npos);
    const std::string html = plot_html(log, report);
    CHECK(Markup(html).errors.empty());
    const nlohmann::json data = page_data(html);
    for (const nlohmann::json& group : data.at("marks")) CHECK(group.at("marks").empty());

    CHECK(count(svg, "the training loop keeps none") == 1);
    // The pipeline's record of its consumer: the training loop's row says what it took and waited.
    const OccupancyLog with_consumer =
        parse_text(two_queue_log(10, 9, 0) + R"({"type":"consumer","t":2.0,"items":300,"waited_s":0.5})" + "\n");
    const std::string consumer_svg = plot_svg(with_consumer, analyze(with_consumer));
    CHECK(count(consumer_svg, "the training loop keeps none") == 0);
    CHECK(count(consumer_svg, "took 300 items, waiting for them 25.0% of the run") == 1);

    // A single sample: one instant, still an axis and a lane.
    const OccupancyLog one = parse_text(sample(0, "a->consumer", 1, 2, "a", "consumer") + "\n");
    CHECK(Markup(plot_svg(one, analyze(one))).errors.empty());
    CHECK(Markup(plot_html(one, analyze(one))).errors.empty());
  }

  TEST_CASE("an hour's log makes a page under 4 MiB that keeps its swings") {
    // 5 queues sampled every 50 ms for an hour: 72,000 samples each.
    const OccupancyLog log = synthetic_log({.seconds = 3600, .epochs = 20});
    REQUIRE(log.queues.front().samples.size() == 72000);
    const Report report = analyze(log);
    const std::string html = plot_html(log, report);
    MESSAGE("the page of an hour's log: " << html.size() << " bytes");
    CHECK(html.size() < 4u * 1024 * 1024);
    CHECK(plot_svg(log, report).size() < 512u * 1024);

    const nlohmann::json data = page_data(html);
    const std::size_t bins = data.at("bins");
    CHECK(bins >= 10000);  // a zoom into a minute still has ~170 bins
    CHECK(bins <= 20000);
    const nlohmann::json& first = data.at("lanes").at(0);
    std::size_t samples = 0;
    for (std::size_t n : first.at("n")) samples += n;
    CHECK(samples == 72000);
    CHECK(*std::max_element(first.at("hi").begin(), first.at("hi").end()) == 1000);
    CHECK(count(group(plot_svg(log, report), "epochs"), "<line") == 20);
  }

  TEST_CASE("a long log is binned to a point per pixel column, keeping the extremes") {
    // One sample in a hundred shows the queue full, the others a quarter full.
    std::string text;
    for (int i = 0; i < 20000; ++i)
      text += sample(0.001 * i, "a->consumer", i % 100 == 0 ? 4 : 1, 4, "a", "consumer") + "\n";
    const OccupancyLog log = parse_text(text);
    const std::string svg = plot_svg(log, analyze(log));

    const std::vector<double> band = path_ys(attribute_values(svg, "d").at(1));  // area, band, mean
    const std::vector<double> mean = path_ys(attribute_values(svg, "d").at(2));
    CHECK(mean.size() <= 720);
    CHECK(mean.size() >= 700);
    // Where the lane's fill 1 and 0 are: its background, 40 pixels high.
    const auto top = svg.find("height=\"40\"");
    const double lane_top = std::stod(svg.substr(svg.rfind("y=\"", top) + 3));
    const double lane_bottom = lane_top + 40;
    // Every full sample is kept by the band (200 of them, 0.1 s apart: each in a column of its
    // own); the means stay near a quarter.
    CHECK(*std::min_element(band.begin(), band.end()) == doctest::Approx(lane_top));
    CHECK(std::count_if(band.begin(), band.end(), [&](double y) { return y == doctest::Approx(lane_top); }) >= 190);
    const auto [low, high] = std::minmax_element(mean.begin(), mean.end());
    CHECK((lane_bottom - *high) / 40 == doctest::Approx(0.25).epsilon(0.02));
    CHECK((lane_bottom - *low) / 40 <= 0.3);
  }
}

TEST_CASE("the logs of a job's ranks: the rank whose training loop waits for input is named, with why") {
  auto rank_log = [](int rank, std::size_t bottleneck, double waited_s) {
    auto log = stoker::test::synthetic_log({.seconds = 20, .epochs = 2, .bottleneck = bottleneck});
    log.rank = std::to_string(rank);
    log.consumer = stoker::inspect::ConsumerCounters{1000, waited_s, 20};
    return log;
  };
  // Ranks 0 and 2 keep ahead of their training loops (which wait for rank 1 in each step's
  // allreduce); rank 1's crops are slow and its loop waits for them.
  const auto job = stoker::inspect::analyze_job({rank_log(0, 5, 0.1), rank_log(1, 1, 8.0), rank_log(2, 5, 0.2)});
  REQUIRE(job.ranks.size() == 3);
  CHECK(job.ranks[1].name == "rank 1");
  CHECK(job.ranks[1].wait == doctest::Approx(0.4));
  CHECK(job.straggler == "rank 1");
  CHECK_MESSAGE(job.evidence.at(0).find("rank 1's training loop waited for its input 40.0% of its run, the other 2 "
                                        "ranks 0.5% to 1.0%") != std::string::npos,
                job.evidence.at(0));
  CHECK(job.evidence.at(1).find("its own pipeline: stage 'crops'") != std::string::npos);
  CHECK(job.suggestion.find("speed up rank 1's input") != std::string::npos);
  std::ostringstream text;
  stoker::inspect::print_job(text, job);
  CHECK(text.str().find("straggler:  rank 1") != std::string::npos);
  CHECK(stoker::inspect::to_json(job)["straggler"] == "rank 1");

  // Ranks that all keep ahead: none stands out.
  const auto even = stoker::inspect::analyze_job({rank_log(0, 5, 0.1), rank_log(1, 5, 0.3)});
  CHECK(even.straggler.empty());
  CHECK(even.evidence.at(0).find("no rank stands out") != std::string::npos);
}

TEST_CASE("a log's rank label and consumer record are read; a record of another rank is refused") {
  std::istringstream good(
      R"({"type":"sample","t":0.1,"queue":"q","size":1,"capacity":4,"producer":"a","consumer":"b","rank":"2"})"
      "\n"
      R"({"type":"consumer","t":3.0,"items":120,"waited_s":0.6,"rank":"2"})"
      "\n");
  const auto log = stoker::inspect::parse_log(good, "r2.jsonl");
  CHECK(log.rank == "2");
  REQUIRE(log.consumer.has_value());
  CHECK(log.consumer->items == 120);
  CHECK(log.consumer->waited_s == doctest::Approx(0.6));
  std::istringstream mixed(
      R"({"type":"sample","t":0.1,"queue":"q","size":1,"capacity":4,"producer":"a","consumer":"b","rank":"2"})"
      "\n"
      R"({"type":"sample","t":0.2,"queue":"q","size":1,"capacity":4,"producer":"a","consumer":"b","rank":"3"})"
      "\n");
  CHECK_THROWS_WITH_AS(stoker::inspect::parse_log(mixed, "r2.jsonl"),
                       doctest::Contains("r2.jsonl:2: a record of rank 3 in the log of rank 2"),
                       stoker::inspect::LogError);
}

TEST_CASE("the job's plot: every rank's plot side by side, each with clip paths of its own, the straggler framed") {
  std::vector<stoker::inspect::OccupancyLog> logs;
  for (int rank = 0; rank < 3; ++rank) {
    auto log = stoker::test::synthetic_log({.seconds = 5, .epochs = 1, .bottleneck = rank == 2 ? 1u : 5u});
    log.rank = std::to_string(rank);
    log.consumer = stoker::inspect::ConsumerCounters{100, rank == 2 ? 3.0 : 0.05, 5};
    logs.push_back(std::move(log));
  }
  const auto job = stoker::inspect::analyze_job(logs);
  REQUIRE(job.straggler == "rank 2");
  const std::string svg = stoker::inspect::plot_job_svg(logs, job);
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = 0; (at = svg.find(what, at)) != std::string::npos; at += what.size()) ++n;
    return n;
  };
  CHECK(count("<svg ") == 4);  // the job's and one per rank
  CHECK(count("</svg>") == 4);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string id = "plot-area-" + std::to_string(rank);
    CHECK(count("id=\"" + id + "\"") == 1);
    CHECK(count("url(#" + id + ")") >= 1);
  }
  CHECK(count("id=\"plot-area\"") == 0);
  CHECK(count("stroke=\"#c62828\" stroke-width=\"4\"") == 1);  // one frame: the straggler's
  CHECK(svg.find("the job: 3 ranks; straggler: rank 2") != std::string::npos);
  CHECK(stoker::inspect::plot_job_html(logs, job).find(svg) != std::string::npos);
}
