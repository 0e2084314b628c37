// SPDX-License-Identifier: Apache-2.0
#include "plot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "plot_page.h"
#include "text.h"

namespace stoker::inspect {

using Json = nlohmann::json;

// The verdict on top; below it one lane per queue, source at the top, and between two lanes
// the row of the stage that empties the lane above and fills the lane below, with its busy,
// starved and blocked shares level with it on the right. The bottleneck is the row where the
// lanes change from full (above it) to empty (below it). The HTML page holds the same SVG and
// a script (plot_page.h) that redraws the lanes, the time axis and the epochs for a time range
// from a finer binning of the samples.

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 allows no control characters but tab and newline, not even as references.
        out += static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? '?' : c;
    }
  }
  return out;
}

std::string num(double v) {
  std::string s = fixed(v, 1);
  if (s.ends_with(".0")) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

namespace {

// 1, 2 or 5 times a power of ten, giving about `ticks` ticks over `range`. The page's script
// has the same rule, so that the axis reads the same before and after a zoom.
double nice_step(double range, int ticks) {
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10 * power;
}

// The samples of one queue within a stretch of time: the lowest, the mean and the highest fill,
// and how many found its producer waiting for room.
struct Bin {
  double lo = 0, hi = 0, sum = 0;
  std::size_t n = 0, waiting = 0;

  void add(const FillSample& s) {
    lo = n == 0 ? s.fill : std::min(lo, s.fill);
    hi = n == 0 ? s.fill : std::max(hi, s.fill);
    sum += s.fill;
    waiting += s.waiting > 0;
    ++n;
  }
  double mean() const { return n == 0 ? 0 : sum / static_cast<double>(n); }
  double waited() const { return n == 0 ? 0 : static_cast<double>(waiting) / static_cast<double>(n); }
};

// `count` bins of equal length over [t0, t1]; each sample goes into the one its time falls in.
std::vector<Bin> bin_samples(const QueueSeries& q, double t0, double t1, std::size_t count) {
  std::vector<Bin> bins(count);
  const double per_second = static_cast<double>(count) / (t1 - t0);
  for (const FillSample& s : q.samples) {
    const double i = std::clamp(std::floor((s.t - t0) * per_second), 0.0, static_cast<double>(count - 1));
    bins[static_cast<std::size_t>(i)].add(s);
  }
  return bins;
}

// `text` in lines of at most `width` characters, broken at spaces.
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string word, line;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) lines.push_back(std::exchange(line, ""));
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// "h2d_bytes 1652747624 (1.65 GB)": a byte count gets its size in units people read.
std::string describe_counter(const std::string& name, std::uint64_t value) {
  std::string out = name + " " + std::to_string(value);
  if (!name.ends_with("_bytes") || value < 1000) return out;
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(value) / 1000;
  std::size_t unit = 0;
  for (; v >= 1000 && unit + 1 < std::size(kUnits); ++unit) v /= 1000;
  return out + " (" + fixed(v, v < 10 ? 2 : v < 100 ? 1 : 0) + " " + kUnits[unit] + ")";
}

// Attributes that outline a text in `colour`, its background, so that lines crossing it stop
// short of the letters.
std::string halo(const std::string& colour) {
  return " stroke=\"" + colour + "\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\"";
}

constexpr const char* kArea = "#deebf7";  // under a lane's mean fill: a full lane reads as a block
constexpr const char* kBand = "#9ecae1";  // a lane's lowest to highest fill
constexpr const char* kMean = "#08519c";  // its mean fill
constexpr const char* kLaneBackground = "#f1f3f5";
constexpr const char* kBusy = "#1b9e77";     // Dark2's green, orange and purple: apart for most
constexpr const char* kStarved = "#d95f02";  // colour-blind readers too
constexpr const char* kBlocked = "#7570b3";
constexpr const char* kBottleneck = "#c0392b";
constexpr const char* kBottleneckRow = "#fdecea";
constexpr const char* kQuiet = "#666666";  // secondary text

// Lines of the verdict over the lanes; `label` is set in bold before the first line of a paragraph.
struct TextLine {
  std::string label, text;
  double size = 12;
  std::string attributes;

  double height() const { return size + (size > 12 ? 6 : 3); }  // from the baseline above to its own
};

// Liberation Sans and Arial (kFonts) share their metrics, in which a line of kWrapChars
// characters of 12 px text fits the picture's width.
constexpr std::size_t kWrapChars = 170;

// A lane's columns are 1 to 4 pixels wide: wide enough for about 4 samples where they are
// dense, so that a queue whose fill swings from one sample to the next draws a band from its
// lowest to its highest fill rather than a zigzag. The page's script has the same rule.
int column_width(double samples, int columns) {
  return static_cast<int>(std::clamp(std::ceil(4 * columns / std::max(samples, 1.0)), 1.0, 4.0));
}

class Plot {
 public:
  // Where everything goes, in SVG pixels. The lanes share one time axis; the column on their
  // right holds each stage's shares and each queue's figures, level with its row.
  static constexpr double kWidth = 1120;
  static constexpr double kLeft = 64;   // where the time axis starts; stage names sit left of it
  static constexpr int kColumns = 720;  // the lanes' width in pixels, a multiple of every column width
  static constexpr double kSide = kLeft + kColumns + 32;  // the column on the right
  static constexpr double kSideWidth = kWidth - kSide - 16;
  static constexpr double kStageRow = 30;    // a stage's name, with its bar on the right
  static constexpr double kLaneLabel = 16;   // a queue's name, over its lane
  static constexpr double kLaneHeight = 40;  // fill 0 at the bottom, 1 at the top
  static constexpr double kWaitStrip = 8;    // under the lane: the share of samples its producer waited
  static constexpr double kLaneGap = 4;
  static constexpr double kBlock = kStageRow + kLaneLabel + kLaneHeight + kWaitStrip + kLaneGap;
  static constexpr double kHeaderTop = 16;
  static constexpr double kEpochRow = 30;  // the epochs' labels over the first row, and the bars' legend

  Plot(const OccupancyLog& log, const Report& report) : log_(log), report_(report) {
    if (report.queues.size() != log.queues.size())
      throw std::invalid_argument(log.source + ": the report to plot with the log is not analyze() of it");
    for (const QueueSeries& q : log.queues)
      for (const FillSample& s : q.samples) t1_ = std::max(t1_, s.t);
    for (const EpochMark& e : log.epochs) t1_ = std::max(t1_, e.t);
    for (const TuningMove& m : log.moves) t1_ = std::max(t1_, m.t);
    if (t1_ <= t0_) t1_ = t0_ + 1;  // a single instant still needs an axis
    for (const QueueSeries& q : log.queues) samples_ = std::max(samples_, q.samples.size());
    column_width_ = column_width(static_cast<double>(samples_), kColumns);

    // The chain of stages as the verdict sees it: each queue's producer, then the training loop.
    for (const QueueSeries& q : log.queues) stages_.push_back(q.producer);
    if (!log.queues.empty()) stages_.push_back(log.queues.back().consumer);

    header_.push_back({"",
                       report.source + ": " + std::to_string(log.queues.size()) +
                           (log.queues.size() == 1 ? " queue" : " queues") + " over " + fixed(report.duration_s, 2) +
                           " s, " + std::to_string(samples_) + " samples per queue" +
                           (log.epochs.empty() ? "" : ", " + apps::plural(log.epochs.size(), "epoch")),
                       14, "font-weight=\"bold\""});
    header_.push_back({"bottleneck: ", report.verdict.headline + " (fit " + fixed(report.verdict.fit, 2) + ")", 16,
                       std::string("fill=\"") + kBottleneck + "\""});
    paragraph("evidence: ", join(report.verdict.evidence, "; "));
    paragraph("suggestion: ", report.verdict.suggestion);
    if (!report.counters.empty()) {
      std::vector<std::string> counters;
      for (const auto& [name, value] : report.counters) counters.push_back(describe_counter(name, value));
      paragraph("counters: ", join(counters, ", "));
    }
    top_ = kHeaderTop + kEpochRow + 8;
    for (const TextLine& line : header_) top_ += line.height();
  }

  std::string svg() const;
  // The finer bins, the epochs and the geometry, for the page's script.
  Json page_data() const;

 private:
  double x(double t) const { return kLeft + kColumns * (t - t0_) / (t1_ - t0_); }
  double stage_top(std::size_t k) const { return top_ + kBlock * static_cast<double>(k); }
  double lane_top(std::size_t i) const { return stage_top(i) + kStageRow + kLaneLabel; }
  double y(std::size_t lane, double fill) const { return lane_top(lane) + kLaneHeight * (1 - fill); }
  double axis_y() const { return stage_top(log_.queues.size()) + kStageRow; }
  double height() const { return axis_y() + 99; }

  void paragraph(const std::string& label, const std::string& text) {
    const std::vector<std::string> lines = wrap(label + text, kWrapChars);
    for (std::size_t i = 0; i < lines.size(); ++i)
      header_.push_back(i == 0 && lines[i].starts_with(label) ? TextLine{label, lines[i].substr(label.size()), 12, ""}
                                                              : TextLine{"", lines[i], 12, ""});
  }

  // Whether the row of chain stage `k` is the verdict's: a stage's, or the training loop's.
  bool is_bottleneck(std::size_t k) const {
    const Verdict& v = report_.verdict;
    if (k + 1 == stages_.size()) return v.kind == Bottleneck::training;
    return (v.kind == Bottleneck::stage || v.kind == Bottleneck::source) && stages_[k] == v.part;
  }

  const StageSummary* counters_of(const std::string& stage) const {
    for (const StageSummary& s : report_.stages)
      if (s.counters.name == stage) return &s;
    return nullptr;
  }

  void write_header(std::ostream& svg) const;
  void write_stage_row(std::ostream& svg, std::size_t k) const;
  void write_lane_plot(std::ostream& svg, std::size_t i) const;
  void write_lane(std::ostream& svg, std::size_t i) const;
  void write_time_axis(std::ostream& svg) const;
  // Vertical marks across the lanes: the epochs' starts, the autotuner's moves.
  struct Mark {
    double t;
    std::string label, title;
  };
  struct MarkGroup {
    std::string cls, stroke, dash;
    double label_y;
    std::vector<Mark> marks;
  };
  std::vector<MarkGroup> marks() const;
  void write_marks(std::ostream& svg) const;

  const OccupancyLog& log_;
  const Report& report_;
  double t0_ = 0, t1_ = 0;   // the time axis: from the start of the pipeline to its last record
  std::size_t samples_ = 0;  // of the queue with the most
  int column_width_ = 1;     // pixels
  std::vector<std::string> stages_;
  std::vector<TextLine> header_;
  double top_ = 0;  // of the first stage row
};

void Plot::write_header(std::ostream& svg) const {
  double y = kHeaderTop;
  for (const TextLine& line : header_) {
    y += line.height();
    svg << "<text x=\"8\" y=\"" << num(y) << "\" font-size=\"" << num(line.size) << "\""
        << (line.attributes.empty() ? "" : " ") << line.attributes << ">";
    if (!line.label.empty()) svg << "<tspan font-weight=\"bold\">" << escape_xml(line.label) << "</tspan>";
    svg << escape_xml(line.text) << "</text>\n";
  }
}

// A stage's name on the left, between the lane it empties and the lane it fills, and its
// shares of the run as one stacked bar on the right.
void Plot::write_stage_row(std::ostream& svg, std::size_t k) const {
  const std::string& name = stages_[k];
  const bool trainer = k + 1 == stages_.size();
  const bool bottleneck = is_bottleneck(k);
  const StageSummary* s = trainer ? nullptr : counters_of(name);
  const double top = stage_top(k);
  svg << "<g class=\"stage" << (bottleneck ? " bottleneck" : "") << "\" data-stage=\"" << escape_xml(name) << "\">\n";

  std::string role = trainer ? "the training loop" : k == 0 ? "source" : "";
  if (s) {
    const int threads = s->counters.threads;
    role += (role.empty() ? "" : ", ") + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  }
  svg << "<text x=\"8\" y=\"" << num(top + 20) << "\" font-size=\"13\"" << halo(bottleneck ? kBottleneckRow : "#ffffff")
      << "><tspan font-weight=\"bold\"" << (bottleneck ? std::string(" fill=\"") + kBottleneck + "\"" : "") << ">"
      << escape_xml(name) << "</tspan>";
  if (!role.empty()) svg << "<tspan fill=\"" << kQuiet << "\"> \xc2\xb7 " << role << "</tspan>";
  if (bottleneck) svg << "<tspan font-weight=\"bold\" fill=\"" << kBottleneck << "\"> \xc2\xb7 the bottleneck</tspan>";
  svg << "</text>\n";

  if (!s) {
    std::string why = trainer               ? "no counters: the training loop keeps none"
                      : log_.stages.empty() ? "no counters: the log has no stage records"
                                            : "no counters in the log for this stage";
    if (trainer && report_.consumer.recorded)  // the pipeline's record of its consumer
      why = "took " + std::to_string(report_.consumer.items) + " items, waiting for them " +
            fixed(report_.consumer.waited_pct, 1) + "% of the run";
    svg << "<text x=\"" << num(kSide) << "\" y=\"" << num(top + 19) << "\" font-size=\"11\" fill=\"" << kQuiet << "\">"
        << why << "</text>\n</g>\n";
    return;
  }
  // Busy is a share of threads x run, starved and blocked shares of the run: with several
  // threads they can add up to more than the run, and are then drawn to scale of their sum.
  const double parts[] = {s->busy_pct, s->starved_pct, s->blocked_pct};
  const char* colours[] = {kBusy, kStarved, kBlocked};
  const char* names[] = {"busy", "starved", "blocked"};
  const double scale = kSideWidth / std::max(100.0, parts[0] + parts[1] + parts[2]);
  svg << "<rect x=\"" << num(kSide) << "\" y=\"" << num(top + 5) << "\" width=\"" << num(kSideWidth)
      << "\" height=\"10\" fill=\"#e5e5e5\"/>\n";
  double at = kSide;
  for (int p = 0; p < 3; ++p) {
    svg << "<rect class=\"" << names[p] << "\" x=\"" << num(at) << "\" y=\"" << num(top + 5) << "\" width=\""
        << fixed(parts[p] * scale, 2) << "\" height=\"10\" fill=\"" << colours[p] << "\"><title>" << names[p] << " "
        << fixed(parts[p], 1) << "%</title></rect>\n";
    at += parts[p] * scale;
  }
  svg << "<text x=\"" << num(kSide) << "\" y=\"" << num(top + 27) << "\" font-size=\"11\">busy " << percent(parts[0])
      << " \xc2\xb7 starved " << percent(parts[1]) << " \xc2\xb7 blocked " << percent(parts[2]) << "</text>\n</g>\n";
}

// A queue's fill: the band from the lowest to the highest fill in each column, the line
// through the means and the area under it. The page's script redraws them on a zoom.
void Plot::write_lane_plot(std::ostream& svg, std::size_t i) const {
  // Columns without a sample are passed over: their neighbours join.
  std::vector<std::pair<std::string, const Bin*>> points;  // "x," and the column's samples
  const std::vector<Bin> columns = bin_samples(log_.queues[i], t0_, t1_, kColumns / column_width_);
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c].n > 0)
      points.emplace_back(num(kLeft + (static_cast<double>(c) + 0.5) * column_width_) + ",", &columns[c]);
  std::string area, band, mean;
  for (const auto& [at, b] : points) {
    area += " " + at + num(y(i, b->mean()));
    band += " " + at + num(y(i, b->hi));
    mean += (mean.empty() ? "M" : " ") + at + num(y(i, b->mean()));
  }
  for (auto p = points.rbegin(); p != points.rend(); ++p) band += " " + p->first + num(y(i, p->second->lo));
  if (!points.empty()) {
    area = "M" + points.front().first + num(y(i, 0)) + area + " " + points.back().first + num(y(i, 0)) + "Z";
    band = "M" + band.substr(1) + "Z";
  }
  // The strip under the lane: the share of each column's samples that found the producer waiting.
  std::string waiting;
  const double strip = lane_top(i) + kLaneHeight + kWaitStrip - 1;
  for (const auto& [at, b] : points) waiting += " " + at + num(strip - (kWaitStrip - 2) * b->waited());
  if (!points.empty())
    waiting = "M" + points.front().first + num(strip) + waiting + " " + points.back().first + num(strip) + "Z";
  svg << "<g class=\"lane-plot\" clip-path=\"url(#plot-area)\">\n"
      << "<path class=\"area\" fill=\"" << kArea << "\" d=\"" << area << "\"/>\n"
      << "<path class=\"band\" fill=\"" << kBand << "\" d=\"" << band << "\"/>\n"
      << "<path class=\"mean\" fill=\"none\" stroke=\"" << kMean
      << "\" stroke-width=\"1.25\" stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"" << mean << "\"/>\n"
      << "<path class=\"waiting\" fill=\"" << kBlocked << "\" d=\"" << waiting << "\"/>\n</g>\n";
}

// A queue's name over its lane, and its figures over the whole run on the right (the page's
// script puts the fill under the pointer there).
void Plot::write_lane(std::ostream& svg, std::size_t i) const {
  const QueueSeries& q = log_.queues[i];
  const QueueSummary& summary = report_.queues[i];
  const double top = lane_top(i);
  svg << "<g class=\"lane\" data-queue=\"" << escape_xml(q.name) << "\">\n"
      << "<text x=\"" << num(kLeft + 4) << "\" y=\"" << num(top - 4) << "\"" << halo("#ffffff") << ">"
      << escape_xml(q.producer + " -> " + q.consumer + " (" + q.name + ", capacity " + std::to_string(q.capacity) +
                    (q.floor ? ", " + std::to_string(q.floor) + " kept back" : "") + ")")
      << "</text>\n";
  svg << "<text class=\"readout\" x=\"" << num(kSide) << "\" y=\"" << num(top + 15) << "\">mean fill "
      << fixed(summary.mean_fill, 2) << ", p95 " << fixed(summary.p95_fill, 2) << "</text>\n"
      << "<text class=\"readout\" x=\"" << num(kSide) << "\" y=\"" << num(top + 31) << "\" font-size=\"11\" fill=\""
      << kQuiet << "\">full " << percent(summary.full_pct) << " \xc2\xb7 empty " << percent(summary.empty_pct)
      << " \xc2\xb7 producer waiting " << percent(summary.waiting_pct) << " of samples</text>\n</g>\n";
}

// The ticks and the grid lines across the lanes; the page's script redraws them on a zoom.
void Plot::write_time_axis(std::ostream& svg) const {
  const double step = nice_step(t1_ - t0_, 6);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::ostringstream grid, ticks;
  for (double k = std::ceil(t0_ / step - 1e-9); k * step <= t1_ + step * 1e-9; ++k) {
    const double t = k * step + 0.0;  // not "-0" for the first tick
    const std::string at = num(x(t));
    grid << "<line x1=\"" << at << "\" y1=\"" << num(stage_top(0)) << "\" x2=\"" << at << "\" y2=\"" << num(axis_y())
         << "\"/>\n";
    ticks << "<line x1=\"" << at << "\" y1=\"" << num(axis_y()) << "\" x2=\"" << at << "\" y2=\"" << num(axis_y() + 5)
          << "\"/>\n<text x=\"" << at << "\" y=\"" << num(axis_y() + 18) << "\" stroke=\"none\">" << fixed(t, decimals)
          << "</text>\n";
  }
  svg << "<g class=\"time-grid\" stroke=\"#d0d4d9\" stroke-width=\"0.75\">\n"
      << grid.str() << "</g>\n<g class=\"time-axis\" stroke=\"black\" text-anchor=\"middle\">\n"
      << ticks.str() << "</g>\n";
}

// Fewer labels than marks when they would crowd: each is at least this far from the last.
constexpr double kMarkLabelGap = 56;

void Plot::write_marks(std::ostream& svg) const {
  for (const MarkGroup& group : marks()) {
    // The lines first, so that none crosses a label.
    std::string labels;
    double last_label = -INFINITY;
    svg << "<g class=\"" << group.cls << "\" clip-path=\"url(#plot-area)\">\n";
    for (const Mark& m : group.marks) {
      const std::string at = num(x(m.t));
      svg << "<line x1=\"" << at << "\" y1=\"" << num(stage_top(0) - 14) << "\" x2=\"" << at << "\" y2=\""
          << num(axis_y()) << "\" stroke=\"" << group.stroke << "\" stroke-dasharray=\"" << group.dash << "\">"
          << (m.title.empty() ? "" : "<title>" + escape_xml(m.title) + "</title>") << "</line>\n";
      if (x(m.t) - last_label < kMarkLabelGap) continue;
      last_label = x(m.t);
      labels += "<text x=\"" + num(x(m.t) + 3) + "\" y=\"" + num(group.label_y) + "\" font-size=\"11\" fill=\"" +
                group.stroke + "\"" + halo("#ffffff") + ">" + escape_xml(m.label) + "</text>\n";
    }
    svg << labels << "</g>\n";
  }
}

std::vector<Plot::MarkGroup> Plot::marks() const {
  MarkGroup epochs{"epochs", "#333333", "4 3", stage_top(0) - 6, {}};
  for (const EpochMark& e : log_.epochs)
    epochs.marks.push_back({e.t, "epoch " + std::to_string(e.epoch + 1), ""});  // the log counts from 0, people from 1
  MarkGroup moves{"moves", "#d95f02", "2 2", axis_y() - 4, {}};
  for (const TuningMove& m : log_.moves) moves.marks.push_back({m.t, "autotune", m.what + " (" + m.evidence + ")"});
  return {epochs, moves};
}

std::string Plot::svg() const {
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"occupancy\" width=\"" << num(kWidth) << "\" height=\""
      << num(height()) << "\" viewBox=\"0 0 " << num(kWidth) << ' ' << num(height()) << "\" font-family=\"" << kFonts
      << "\" font-size=\"12\">\n"
      << "<title>queue fill over time: " << escape_xml(log_.source) << "</title>\n"
      << "<defs><clipPath id=\"plot-area\"><rect x=\"" << num(kLeft) << "\" y=\"0\" width=\"" << kColumns
      << "\" height=\"" << num(height()) << "\"/></clipPath></defs>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  write_header(svg);

  // The bars' legend, over the column on the right.
  const double legend_y = stage_top(0) - 8;
  double at = kSide;
  for (const auto& [name, colour] :
       {std::pair{"busy", kBusy}, {"starved: input empty", kStarved}, {"blocked: output full", kBlocked}}) {
    svg << "<rect x=\"" << num(at) << "\" y=\"" << num(legend_y - 9) << "\" width=\"10\" height=\"10\" fill=\""
        << colour << "\"/><text x=\"" << num(at + 13) << "\" y=\"" << num(legend_y) << "\" font-size=\"11\">" << name
        << "</text>\n";
    at += 13 + 5.6 * static_cast<double>(std::strlen(name)) + 12;
  }

  for (std::size_t i = 0; i < log_.queues.size(); ++i) {
    svg << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(lane_top(i)) << "\" width=\"" << kColumns << "\" height=\""
        << num(kLaneHeight) << "\" fill=\"" << kLaneBackground << "\"/>\n"
        << "<text x=\"" << num(kLeft - 4) << "\" y=\"" << num(lane_top(i) + 8) << "\" font-size=\"10\" fill=\""
        << kQuiet << "\" text-anchor=\"end\">full</text>\n"
        << "<text x=\"" << num(kLeft - 4) << "\" y=\"" << num(lane_top(i) + kLaneHeight)
        << "\" font-size=\"10\" fill=\"" << kQuiet << "\" text-anchor=\"end\">empty</text>\n"
        << "<text x=\"" << num(kLeft - 4) << "\" y=\"" << num(lane_top(i) + kLaneHeight + kWaitStrip)
        << "\" font-size=\"8\" fill=\"" << kBlocked << "\" text-anchor=\"end\">waiting</text>\n";
  }
  for (std::size_t k = 0; k < stages_.size(); ++k)
    if (is_bottleneck(k))
      svg << "<rect x=\"4\" y=\"" << num(stage_top(k) + 2) << "\" width=\"" << num(kWidth - 8) << "\" height=\""
          << num(kStageRow - 4) << "\" rx=\"3\" fill=\"" << kBottleneckRow << "\"/>\n";
  write_time_axis(svg);
  for (std::size_t i = 0; i < log_.queues.size(); ++i) write_lane_plot(svg, i);
  write_marks(svg);
  // The names over the lines, each with a halo of its background, top to bottom as the pipeline runs.
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    write_stage_row(svg, k);
    if (k < log_.queues.size()) write_lane(svg, k);
  }

  svg << "<line x1=\"" << num(kLeft) << "\" y1=\"" << num(axis_y()) << "\" x2=\"" << num(kLeft + kColumns) << "\" y2=\""
      << num(axis_y()) << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << num(kLeft + kColumns / 2.0) << "\" y=\"" << num(axis_y() + 34)
      << "\" text-anchor=\"middle\">time (s)</text>\n"
      << "<text x=\"8\" y=\"" << num(axis_y() + 56) << "\" font-size=\"11\" fill=\"" << kQuiet
      << "\">Each lane is a queue's fill (what its consumer could take, of the most it could): the band spans the "
         "lowest to the highest sample in each column of pixels, the line is their mean.</text>\n"
      << "<text x=\"8\" y=\"" << num(axis_y() + 71) << "\" font-size=\"11\" fill=\"" << kQuiet
      << "\">The purple strip under a lane is the share of its samples that found its producer waiting with items "
         "it had no room for.</text>\n"
      << "<text x=\"8\" y=\"" << num(axis_y() + 86) << "\" font-size=\"11\" fill=\"" << kQuiet
      << "\">A stage's bar: busy is its threads at work (of threads x run); starved and blocked are the time none "
         "ran because its input was empty or its output full.</text>\n"
      << "</svg>\n";
  return svg.str();
}

// The page keeps the queues' fill in finer bins than the picture, this many over all queues
// together: enough to zoom into a minute of an hour's run, in a page of about a MiB.
constexpr std::size_t kPageBins = 80'000;

Json Plot::page_data() const {
  const std::size_t per_queue =
      std::max<std::size_t>(kColumns, kPageBins / std::max<std::size_t>(log_.queues.size(), 1));
  const std::size_t count = std::clamp<std::size_t>(samples_, 1, per_queue);

  Json lanes = Json::array();
  for (std::size_t i = 0; i < log_.queues.size(); ++i) {
    // Fills in thousandths: finer than a pixel of any lane, and a third of the text of a fraction.
    std::vector<int> lo, mean, hi, wait;
    std::vector<std::size_t> n;
    for (const Bin& b : bin_samples(log_.queues[i], t0_, t1_, count)) {
      lo.push_back(static_cast<int>(std::lround(1000 * b.lo)));
      mean.push_back(static_cast<int>(std::lround(1000 * b.mean())));
      hi.push_back(static_cast<int>(std::lround(1000 * b.hi)));
      wait.push_back(static_cast<int>(std::lround(1000 * b.waited())));
      n.push_back(b.n);
    }
    lanes.push_back({{"top", lane_top(i)}, {"lo", lo}, {"mean", mean}, {"hi", hi}, {"wait", wait}, {"n", n}});
  }
  Json marks = Json::array();
  for (const MarkGroup& g : this->marks()) {
    Json items = Json::array();
    for (const Mark& m : g.marks) items.push_back({m.t, m.label, m.title});
    marks.push_back(
        {{"cls", g.cls}, {"stroke", g.stroke}, {"dash", g.dash}, {"labelY", g.label_y}, {"marks", std::move(items)}});
  }
  return {{"t0", t0_},
          {"t1", t1_},
          {"bins", count},
          {"left", kLeft},
          {"columns", kColumns},
          {"laneHeight", kLaneHeight},
          {"waitStrip", kWaitStrip},
          {"top", stage_top(0)},
          {"bottom", axis_y()},
          {"markLabelGap", kMarkLabelGap},
          {"lanes", std::move(lanes)},
          {"marks", std::move(marks)}};
}

// JSON to put inside a script element. '<', '>' and '&' appear in JSON only inside strings,
// where their \u escapes mean the same; without them the text cannot end the element or its
// CDATA section.
std::string script_json(const Json& j) {
  std::string out;
  for (char c : j.dump(-1, ' ', false, Json::error_handler_t::replace)) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string plot_svg(const OccupancyLog& log, const Report& report) { return Plot(log, report).svg(); }

std::string plot_html(const OccupancyLog& log, const Report& report) {
  const Plot plot(log, report);
  return std::string(kPageHead) + escape_xml("stoker-inspect: " + log.source) + kPageStyle + plot.svg() + kPageErrors +
         "const data = " + script_json(plot.page_data()) + ";\n" + kPageScript;
}

}  // namespace stoker::inspect
