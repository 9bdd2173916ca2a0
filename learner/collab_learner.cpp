#include <fastlearn/learner/collab_learner.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/models/collab.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {

namespace {

CollabClasses classes_of(const DataLoaders& dls, std::string_view who) {
  auto classes = collab_classes(dls);
  if (!classes)
    throw ConfigError(fmt::format("{}: the data is not a table of ratings (make it with CollabDataLoaders)", who));
  return *std::move(classes);
}

// fastai's EmbeddingNN takes the codes alone; fastlearn's TabularModel, codes and continuous values: none of them.
ForwardOutputs forward_on_codes(models::TabularModel model) {
  return [model](const std::vector<at::Tensor>& xb) mutable -> std::vector<at::Tensor> {
    if (xb.size() != 1)
      throw ConfigError(fmt::format("EmbeddingNN: the batch has {} inputs; it takes one, the (N, 2) codes", xb.size()));
    return {model->forward(xb[0], at::empty({xb[0].size(0), 0}, xb[0].options().dtype(at::kFloat)))};
  };
}

// A TOML float: "5.5", "0.0".
std::string toml_float(double x) {
  auto text = fmt::format("{:.17g}", x);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

CollabModel collab_model(const DataLoaders& dls, const CollabLearnerOptions& o) {
  const auto classes = classes_of(dls, "collab_model");
  const auto n_users = static_cast<std::int64_t>(classes.users.size());
  const auto n_items = static_cast<std::int64_t>(classes.items.size());
  if (!o.use_nn) {
    if (!o.emb_szs.empty() || !o.layers.empty())
      throw ConfigError("collab_model: emb_szs and layers are EmbeddingNN's (use_nn = true)");
    auto model = models::EmbeddingDotBias(o.n_factors, n_users, n_items, o.y_range);
    return {model.ptr(), detail::forward_of(model), detail::replicate_of<models::EmbeddingDotBias>()};
  }
  for (const auto& [name, width] : o.emb_szs)
    if (name != classes.user && name != classes.item)
      throw ConfigError(
          fmt::format("collab_model: emb_szs names '{}', which is neither the user column '{}' nor the "
                      "item column '{}'",
                      excerpt(name), excerpt(classes.user), excerpt(classes.item)));
  const auto width = [&](const std::string& name, std::int64_t n) {
    const auto given = o.emb_szs.find(name);
    return given != o.emb_szs.end() ? given->second : models::emb_sz_rule(n);
  };
  auto model =
      models::embedding_nn({{n_users, width(classes.user, n_users)}, {n_items, width(classes.item, n_items)}},
                           {.layers = o.layers.empty() ? std::vector{o.n_factors} : o.layers, .y_range = o.y_range});
  Replicate replicate = [](torch::nn::Module& m, const c10::Device& device) -> ModelCopy {
    auto copy = std::dynamic_pointer_cast<models::TabularModelImpl>(m.clone(device));
    if (!copy) return {};
    return {.model = copy, .forward = forward_on_codes(models::TabularModel(copy))};
  };
  return {model.ptr(), forward_on_codes(model), std::move(replicate)};
}

std::unique_ptr<Learner> collab_learner(DataLoaders dls, const CollabLearnerOptions& o,
                                        LearnerOptions learner_options) {
  auto model = collab_model(dls, o);
  // The same model as the config's keys build it (registry.cpp): the export carries those keys.
  if (o.emb_szs.empty() && learner_options.model_recipe.empty()) {
    auto recipe = fmt::format("[data]\ndataset = \"ratings\"\n[model]\narch = \"{}\"\nn_factors = {}\n",
                              o.use_nn ? "collab_nn" : "collab", o.n_factors);
    if (o.use_nn && !o.layers.empty()) recipe += fmt::format("layers = [{}]\n", fmt::join(o.layers, ", "));
    if (o.y_range)
      recipe += fmt::format("y_range = [{}, {}]\n", toml_float(o.y_range->first), toml_float(o.y_range->second));
    learner_options.model_recipe = std::move(recipe);
  }
  if (!learner_options.replicate) learner_options.replicate = std::move(model.replicate);
  return std::make_unique<Learner>(std::move(dls), std::move(model.module), std::move(model.forward), mse_loss(),
                                   std::move(learner_options));
}

double predict_rating(Learner& learn, const std::string& user, const std::string& item) {
  const auto codes = at::stack({collab_codes(learn.dls(), {user}, false, true, "predict_rating"),
                                collab_codes(learn.dls(), {item}, true, true, "predict_rating")},
                               1);
  return learn.predict_batch({codes}).to(torch::kCPU, torch::kDouble).flatten()[0].item<double>();
}

std::vector<Recommendation> recommend(Learner& learn, const std::string& user, std::int64_t k,
                                      const std::vector<std::string>& exclude) {
  const auto classes = classes_of(learn.dls(), "recommend");
  if (k < 0) throw ConfigError(fmt::format("recommend: k = {} is negative", k));
  const auto user_code = collab_codes(learn.dls(), {user}, false, true, "recommend")[0];
  // Every item the model knows (not "#na#"), for this user.
  const auto n = static_cast<std::int64_t>(classes.items.size()) - 1;
  auto codes =
      at::stack({at::full({n}, user_code.item<std::int64_t>(), at::kLong), at::arange(1, n + 1, at::kLong)}, 1);
  auto ratings = learn.predict_batch({codes}).to(torch::kCPU, torch::kDouble).flatten().contiguous();
  std::vector<bool> left_out(static_cast<std::size_t>(n + 1), false);
  if (!exclude.empty()) {
    const auto excluded = collab_codes(learn.dls(), exclude, true, false, "recommend");
    for (std::int64_t i = 0; i < excluded.numel(); ++i)
      left_out[static_cast<std::size_t>(excluded.data_ptr<std::int64_t>()[i])] = true;
  }
  const auto* r = ratings.data_ptr<double>();
  std::vector<std::int64_t> order;
  for (std::int64_t i = 1; i <= n; ++i)
    if (!left_out[static_cast<std::size_t>(i)]) order.push_back(i);
  const auto take = std::min<std::int64_t>(k, static_cast<std::int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](std::int64_t a, std::int64_t b) {
    return r[a - 1] > r[b - 1] || (r[a - 1] == r[b - 1] && a < b);
  });
  std::vector<Recommendation> out;
  for (std::int64_t i = 0; i < take; ++i) {
    const auto code = order[static_cast<std::size_t>(i)];
    out.push_back({classes.items[static_cast<std::size_t>(code)], r[code - 1]});
  }
  return out;
}

}  // namespace fastlearn
