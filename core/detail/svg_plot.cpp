#include <fastlearn/core/detail/svg_plot.h>

#include <fastlearn/core/atomic_file.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace fastlearn {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return !(lo <= hi); }
};

// Tick positions 1, 2 or 5 times a power of ten apart, about `target` of them across the range.
std::vector<double> linear_ticks(double lo, double hi, int target = 5) {
  const double span = hi - lo;
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (span / step <= target) break;
  }
  std::vector<double> ticks;
  // Bounded: a step below the resolution of lo would otherwise never advance.
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && ticks.size() < 50; t += step)
    ticks.push_back(t);
  return ticks;
}

}  // namespace

std::string svg_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
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
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_plot(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const double left = 70, right = 20, top = options.title.empty() ? 20 : 40, bottom = 50;
  const double w = options.width - left - right, h = options.height - top - bottom;
  auto tx = [&](double x) { return options.log_x ? std::log10(x) : x; };
  auto usable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!options.log_x || x > 0); };

  Range xr, yr;
  for (const auto& s : series) {
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (usable(s.x[i], s.y[i])) xr.add(tx(s.x[i])), yr.add(s.y[i]);
    }
  }
  if (xr.empty()) xr = {0, 1};
  if (yr.empty()) yr = {0, 1};
  if (xr.hi == xr.lo) xr.lo -= 0.5, xr.hi += 0.5;
  if (yr.hi == yr.lo) yr.lo -= 0.5, yr.hi += 0.5;
  const double pad = 0.05 * (yr.hi - yr.lo);
  yr.lo -= pad, yr.hi += pad;
  auto px = [&](double x) { return left + (tx(x) - xr.lo) / (xr.hi - xr.lo) * w; };
  auto py = [&](double y) { return top + (yr.hi - y) / (yr.hi - yr.lo) * h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      options.width, options.height);
  if (!options.title.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", options.width / 2,
                       svg_escape(options.title));
  }
  // Axes, grid and tick labels.
  for (double t : linear_ticks(yr.lo, yr.hi)) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.4g}</text>\n",
        left, py(t), left + w, py(t), left - 6, py(t) + 4, t);
  }
  std::vector<double> xticks;
  if (options.log_x) {
    for (double d = std::ceil(xr.lo); d <= xr.hi + 1e-9; d += 1) xticks.push_back(d);
  } else {
    xticks = linear_ticks(xr.lo, xr.hi);
  }
  for (double t : xticks) {
    const double x = left + (t - xr.lo) / (xr.hi - xr.lo) * w;
    const std::string label = options.log_x ? fmt::format("1e{:g}", t) : fmt::format("{:.4g}", t);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        x, top, x, top + h, x, top + h + 18, label);
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", left, top,
                     w, h);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", left + w / 2, top + h + 40,
                     svg_escape(options.xlabel));
  svg +=
      fmt::format("<text x=\"16\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1f})\">{}</text>\n",
                  top + h / 2, top + h / 2, svg_escape(options.ylabel));

  for (std::size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* color = kColors[k % std::size(kColors)];
    std::string points;
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      if (s.markers) {
        svg +=
            fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"/>\n", px(s.x[i]), py(s.y[i]), color);
        if (i < s.point_labels.size() && !s.point_labels[i].empty())
          svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", px(s.x[i]) + 6,
                             py(s.y[i]) + 4, svg_escape(s.point_labels[i]));
      } else {
        points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
      }
    }
    if (!points.empty()) {
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, points);
    }
    if (!s.label.empty()) {
      const double ly = top + 16 + 16 * static_cast<double>(k);
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"3\" fill=\"{}\"/>"
          "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
          left + w - 150, ly - 4, color, left + w - 132, ly, svg_escape(s.label));
    }
  }
  svg += "</svg>\n";
  return svg;
}

void write_svg_plot(const std::filesystem::path& file, const std::vector<PlotSeries>& series,
                    const PlotOptions& options) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  const auto svg = svg_plot(series, options);
  write_file_atomically(file, [&](std::ostream& out) { out << svg; });
}

}  // namespace fastlearn
