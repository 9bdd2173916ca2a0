#include <fastlearn/learner/top_losses_grid.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/svg_plot.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_encode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {
namespace {

std::string base64(std::string_view bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t v = 0;
    for (std::size_t j = 0; j < 3; ++j) v = v << 8 | (j < n ? static_cast<std::uint8_t>(bytes[i + j]) : 0u);
    for (std::size_t j = 0; j < 4; ++j) out += j <= n ? kDigits[(v >> (18 - 6 * j)) & 63] : '=';
  }
  return out;
}

// The image of item `index` as the dataset gives it: (C, H, W) uint8.
at::Tensor item_image(const Dataset& items, std::int64_t index) {
  if (index < 0 || index >= items.size()) {
    throw DataError(
        fmt::format("save_top_losses_grid: item {} is outside the dataset of {} items; pass the "
                    "dataset the predictions were made on",
                    index, items.size()));
  }
  auto rng = at::make_generator<at::CPUGeneratorImpl>(0);
  const std::int64_t one[] = {index};
  const auto batch = items.load_batch(one, rng);
  if (batch.inputs.empty()) throw DataError("save_top_losses_grid: the dataset's items have no input");
  const auto& x = batch.inputs.front();
  if (x.dim() != 4 || x.scalar_type() != at::kByte || (x.size(1) != 1 && x.size(1) != 3)) {
    throw DataError(
        fmt::format("save_top_losses_grid: items must be uint8 images (C, H, W) with 1 or 3 channels; "
                    "item {} is {} [{}]",
                    index, c10::toString(x.scalar_type()), fmt::join(x.sizes().slice(1), ", ")));
  }
  return x[0];
}

}  // namespace

void save_top_losses_grid(const ClassificationInterpretation& interp, const Dataset& items, std::int64_t k,
                          const std::filesystem::path& file, TopLossesGridOptions options) {
  if (k < 1 || options.columns < 1 || options.cell < 16) {
    throw ConfigError(fmt::format("save_top_losses_grid: k {} and columns {} must be at least 1, cell {} at least 16",
                                  k, options.columns, options.cell));
  }
  const auto losses = interp.top_losses(k);
  const int columns = std::min<int>(options.columns, std::max<int>(1, static_cast<int>(losses.size())));
  const int rows = (static_cast<int>(losses.size()) + columns - 1) / columns;
  constexpr int kHeader = 34, kCaption = 38, kPad = 8;
  const int cell_w = options.cell + 2 * kPad, cell_h = options.cell + kCaption + kPad;
  const int width = columns * cell_w, height = kHeader + rows * cell_h;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" font-size=\"15\">predicted / actual, loss, probability of the prediction</text>\n",
      width, height, kPad);
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const auto& item = losses[i];
    const auto image = item_image(items, item.index);
    const int x = static_cast<int>(i) % columns * cell_w + kPad;
    const int y = kHeader + static_cast<int>(i) / columns * cell_h;
    // Fit the longer side to the cell; small images are scaled up with their pixels kept sharp.
    const double scale =
        static_cast<double>(options.cell) / static_cast<double>(std::max(image.size(1), image.size(2)));
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"{}\">{} / {}</text>\n"
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">{:.2f}, {:.2f} (item {})</text>\n"
        "<image x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{:.1f}\" style=\"image-rendering:pixelated\" "
        "href=\"data:image/png;base64,{}\"/>\n",
        x, y + 14, item.predicted == item.actual ? "#2ca02c" : "#d62728", svg_escape(item.predicted),
        svg_escape(item.actual), x, y + 30, item.loss, item.probability, item.index, x, y + kCaption,
        scale * static_cast<double>(image.size(2)), scale * static_cast<double>(image.size(1)),
        base64(encode_png(image)));
  }
  svg += "</svg>\n";
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  write_file_atomically(file, svg);
}

}  // namespace fastlearn
