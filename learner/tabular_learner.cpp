#include <fastlearn/learner/tabular_learner.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/loss.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

models::TabularModel tabular_model(const DataLoaders& dls, const TabularLearnerOptions& options) {
  const auto* table = tabular_dataset(dls);
  if (!table) throw ConfigError("tabular_model: the data is not a table (make it with TabularDataLoaders)");
  const auto& procs = table->procs();
  for (const auto& [name, width] : options.emb_szs) {
    if (std::find(procs.cat_names().begin(), procs.cat_names().end(), name) == procs.cat_names().end()) {
      throw ConfigError(fmt::format("tabular_model: emb_szs names '{}', which is not a categorical input ({})",
                                    excerpt(name), fmt::join(excerpts(procs.cat_names()), ", ")));
    }
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs;
  for (std::size_t i = 0; i < procs.cat_names().size(); ++i) {
    const auto n = static_cast<std::int64_t>(procs.vocabs()[i].size());
    const auto given = options.emb_szs.find(procs.cat_names()[i]);
    emb_szs.emplace_back(n, given != options.emb_szs.end() ? given->second : models::emb_sz_rule(n));
  }
  return models::TabularModel(
      emb_szs, static_cast<std::int64_t>(procs.cont_names().size()), dls.c(),
      models::TabularModelOptions{
          .layers = options.layers, .ps = options.ps, .embed_p = options.embed_p, .y_range = options.y_range});
}

std::unique_ptr<Learner> tabular_learner(DataLoaders dls, const TabularLearnerOptions& options,
                                         LearnerOptions learner_options) {
  auto model = tabular_model(dls, options);
  const bool regression = tabular_dataset(dls)->regression();
  // The same model as the config's keys build it (registry.cpp) can be exported by those keys.
  if (options.emb_szs.empty() && options.ps.empty() && !options.y_range && learner_options.model_recipe.empty()) {
    auto embed_p = fmt::format("{:.17g}", options.embed_p);
    if (embed_p.find_first_of(".eEn") == std::string::npos) embed_p += ".0";  // a TOML float
    learner_options.model_recipe = fmt::format(
        "[data]\ndataset = \"csv\"\ny_block = \"{}\"\n[model]\narch = \"tabular\"\nlayers = [{}]\nembed_p = {}\n",
        regression ? "regression" : "category", fmt::join(options.layers, ", "), embed_p);
  }
  return std::make_unique<Learner>(std::move(dls), model, regression ? mse_loss() : cross_entropy(),
                                   std::move(learner_options));
}

}  // namespace fastlearn
