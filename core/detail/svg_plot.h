#pragma once
// Line plots (and labelled scatter plots) written as standalone SVG images (loss curves, lr_find); no plotting library
// needed.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;  ///< same length; non-finite points are left out
  bool markers = false;      ///< draw points instead of a line
  /// With markers: each point's name, written beside it (empty: none).
  std::vector<std::string> point_labels;
};

struct PlotOptions {
  std::string title, xlabel, ylabel;
  bool log_x = false;  ///< logarithmic x axis (x must be > 0)
  int width = 720;
  int height = 450;
};

/// `text` with SVG's (XML's) special characters escaped, for text and attribute values.
std::string svg_escape(std::string_view text);

/// Renders the series as one SVG document.
std::string svg_plot(const std::vector<PlotSeries>& series, const PlotOptions& options);
/// Writes svg_plot(...) to `file` atomically, creating its directory.
void write_svg_plot(const std::filesystem::path& file, const std::vector<PlotSeries>& series,
                    const PlotOptions& options);

}  // namespace fastlearn
