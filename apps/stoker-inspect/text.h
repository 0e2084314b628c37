// SPDX-License-Identifier: Apache-2.0
// Text helpers the report, the plot and the job's report share. Private to stoker-inspect.
#pragma once

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "format.h"

namespace stoker::inspect {

using apps::fixed;

/// "42%": a percentage without decimals.
inline std::string percent(double pct) { return fixed(pct, 0) + "%"; }
/// A share of 0..1 as a percentage: "42%".
inline std::string share(double fraction) { return percent(100 * fraction); }

inline std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

/// `x` rounded to `decimals` places, for JSON a person reads.
inline double rounded(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

/// A table whose columns are as wide as their widest cell; the first `text_columns` are
/// left-aligned, the numbers after them right-aligned.
inline void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                        std::size_t text_columns) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (widths.size() <= c) widths.push_back(0);
      widths[c] = std::max(widths[c], row[c].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string fill(widths[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c >= text_columns ? fill + row[c] : row[c] + fill);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  }
}

}  // namespace stoker::inspect
