// The C interface (c/fastlearn.h) as a C or Fortran program meets it: the same weights as the C++ step API on the
// same samples, whatever the layout and type of the arrays; every misuse a status with a message, never a crash;
// resume and exports; and the heat solver example in C++, C and Fortran on one and two ranks.
#include <fastlearn/c/fastlearn.h>

#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/core/safetensors.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/build_paths.h"
#include "support/multiprocess.h"
#include "support/processes.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

// Samples of 3 x 4 inputs and 2 targets, an mlp, 2 epochs of 4 steps, 8 samples held out.
std::string config_text(const fs::path& out, const std::string& extra = "") {
  return fmt::format(R"([data]
dataset = "program"
input_shape = [3, 4]
target_shape = [2]
steps_per_epoch = 4
held_out = 8
[model]
arch = "mlp"
hidden = [16]
[train]
epochs = 2
lr = 0.01
device = "cpu"
metrics = ["rmse"]
{}
[output]
dir = "{}"
plots = false
)",
                     extra, out.string());
}

class CInterface : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("fastlearn_c_{}_{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A learner of config_text (or `text`), freed at the end of the test.
  fl_learner* create(const std::string& text = "") {
    fl_learner* learn = nullptr;
    const auto toml = text.empty() ? config_text(dir_ / "run") : text;
    EXPECT_EQ(fl_create_from_toml(toml.c_str(), "test.toml", &learn), FL_OK) << fl_last_error();
    learners_.push_back(learn);
    return learn;
  }

  ~CInterface() override {
    for (auto* learn : learners_) fl_free(&learn);
  }

  fs::path dir_;
  std::vector<fl_learner*> learners_;
};

// A row-major description of a contiguous tensor.
fl_array row_major(const at::Tensor& t) {
  fl_array a{.data = t.data_ptr(),
             .dtype = t.scalar_type() == torch::kFloat64 ? FL_FLOAT64
                      : t.scalar_type() == torch::kInt64 ? FL_INT64
                      : t.scalar_type() == torch::kInt32 ? FL_INT32
                                                         : FL_FLOAT32,
             .layout = FL_ROW_MAJOR,
             .ndim = static_cast<int32_t>(t.dim())};
  for (int d = 0; d < t.dim(); ++d) a.shape[d] = t.size(d);
  return a;
}

// The same memory as Fortran declares it: column-major, the dimensions reversed.
fl_array column_major(const at::Tensor& t) {
  auto a = row_major(t);
  a.layout = FL_COLUMN_MAJOR;
  for (int d = 0; d < t.dim(); ++d) a.shape[d] = t.size(t.dim() - 1 - d);
  return a;
}

std::vector<at::Tensor> weights_of(fl::Learner& learn) {
  std::vector<at::Tensor> out;
  for (const auto& p : learn.model().parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<at::Tensor> weights_in(const fs::path& file) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : fl::load_safetensors(file).tensors)
    if (!name.starts_with("optimizer/") && !name.starts_with("rng/") && !name.starts_with("steps/")) out.push_back(t);
  return out;
}

// What parse_config says of `text` with `set` (as --set), or "" when it takes it.
std::string message_of_config(const std::string& text, const std::string& set) {
  try {
    fl::parse_config(text, "test.toml", {set});
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

}  // namespace

TEST_F(CInterface, TrainsTheSameWeightsAsTheStepApiOnTheSameSamples) {
  torch::manual_seed(7);
  const auto x = torch::randn({8, 4, 3, 4}), y = torch::randn({8, 4, 2});
  const auto held_x = torch::randn({8, 3, 4}), held_y = torch::randn({8, 2});

  // C++: the step API on the config's Learner.
  const auto config = fl::parse_config(config_text(dir_ / "cpp"), "test.toml");
  auto cpp = fl::learner_from_config(config, {.progress = false});
  cpp->begin_steps(fl::step_plan(config), fl::step_fit(config));
  cpp->hold_out({held_x}, {held_y});
  std::vector<double> cpp_losses;
  for (int s = 0; s < 8; ++s) cpp_losses.push_back(cpp->train_step(x[s], y[s]).item<double>());
  EXPECT_FALSE(cpp->stepping());
  cpp->end_steps();

  // C: float32 row-major (read in place), float64 (converted), and Fortran's column-major view of the same memory.
  auto* c = create();
  const auto held_x64 = held_x.to(torch::kFloat64), held_y64 = held_y.to(torch::kFloat64);
  auto hx = column_major(held_x64), hy = column_major(held_y64);
  ASSERT_EQ(fl_hold_out(c, &hx, &hy), FL_OK) << fl_last_error();
  for (int s = 0; s < 8; ++s) {
    const auto xs = s % 2 ? x[s].to(torch::kFloat64) : x[s].contiguous();
    const auto ys = s % 2 ? y[s].to(torch::kFloat64) : y[s].contiguous();
    auto xa = s % 4 < 2 ? row_major(xs) : column_major(xs);
    auto ya = s % 4 < 2 ? row_major(ys) : column_major(ys);
    double loss = 0;
    ASSERT_EQ(fl_train_step(c, &xa, &ya, &loss), FL_OK) << fl_last_error();
    EXPECT_EQ(loss, cpp_losses[s]) << "step " << s;
  }
  int64_t trained = 0, planned = 0;
  int32_t running = 1;
  ASSERT_EQ(fl_steps(c, &trained, &planned, &running), FL_OK);
  EXPECT_EQ(trained, 8);
  EXPECT_EQ(planned, 8);
  EXPECT_EQ(running, 0);
  ASSERT_EQ(fl_save(c, (dir_ / "c.safetensors").c_str()), FL_OK) << fl_last_error();
  expect_equal(weights_in(dir_ / "c.safetensors"), weights_of(*cpp));

  // Predictions into the caller's array, in its type and layout.
  const auto new_x = torch::randn({5, 3, 4});
  const auto expected = cpp->predict_batch({new_x});
  auto out = torch::zeros({5, 2}, torch::kFloat64);
  auto in = row_major(new_x), outputs = row_major(out);
  outputs.layout = FL_COLUMN_MAJOR;  // declared (5, 2) column-major: C's (2, 5)
  ASSERT_EQ(fl_predict(c, &in, &outputs), FL_ERROR_SHAPE);
  outputs = column_major(out);  // (2, 5) column-major: the (5, 2) batch of outputs
  ASSERT_EQ(fl_predict(c, &in, &outputs), FL_OK) << fl_last_error();
  EXPECT_TRUE(torch::equal(out.to(torch::kFloat32), expected));
  // Validation ran on the held-out samples after each epoch: history.csv has both epochs' valid_loss.
  std::ifstream history(dir_ / "run" / "history.csv");
  std::string line;
  int rows = 0;
  while (std::getline(history, line)) ++rows;
  EXPECT_EQ(rows, 3);
}

// TorchFort's train_multiarg: a model of two inputs (features, and an int64 index into an embedding) scripted with
// TorchScript's compiler, and a scripted loss over the prediction, the target and a mask (an extra loss argument).
TEST_F(CInterface, SeveralInputsAndTargetsTrainAScriptedModelAsTheStepApiDoes) {
  torch::manual_seed(3);
  torch::jit::Module model("TwoInputs");
  model.register_parameter("emb", torch::randn({10, 4}).requires_grad_(), false);
  model.register_parameter("w", (torch::randn({8, 1}) * 0.3).requires_grad_(), false);
  model.register_parameter("b", torch::zeros({1}).requires_grad_(), false);
  model.define("def forward(self, x, idx):\n    return torch.cat([x, self.emb[idx]], 1) @ self.w + self.b\n");
  model.save((dir_ / "model.pt").string());
  torch::jit::Module masked_mse("MaskedMse");
  masked_mse.define(
      "def forward(self, pred, y, mask):\n    return ((pred - y) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)\n");
  masked_mse.save((dir_ / "loss.pt").string());
  const auto text = fmt::format(R"([data]
dataset = "program"
input_shapes = [[4], []]
input_dtypes = ["float32", "int64"]
target_shapes = [[1], [1]]
steps_per_epoch = 3
[model]
arch = "torchscript"
file = "{}"
[train]
epochs = 2
lr = 0.01
device = "cpu"
loss = "torchscript"
loss_file = "{}"
[output]
dir = "{}"
plots = false
)",
                                (dir_ / "model.pt").string(), (dir_ / "loss.pt").string(), (dir_ / "run").string());
  const auto x = torch::randn({6, 5, 4});
  const auto idx = torch::randint(0, 10, {6, 5}, torch::kInt64);
  const auto y = torch::randn({6, 5, 1});
  const auto mask = (torch::rand({6, 5, 1}) < 0.6).to(torch::kFloat32);

  const auto config = fl::parse_config(text, "multi.toml");
  auto cpp = fl::learner_from_config(config, {.progress = false});
  cpp->begin_steps(fl::step_plan(config), fl::step_fit(config));
  std::vector<double> cpp_losses;
  for (int s = 0; s < 6; ++s) cpp_losses.push_back(cpp->train_step({x[s], idx[s]}, {y[s], mask[s]}).item<double>());
  cpp->end_steps();

  auto* c = create(text);
  const auto before = weights_of(*fl::learner_from_config(config, {.progress = false}));
  // Misuse first, each named and changing nothing: one input where the config declares two, a float index, an index
  // of another shape, an int32 index (widened: accepted, below).
  const auto x0 = x[0].contiguous(), y0 = y[0].contiguous(), m0 = mask[0].contiguous();
  const auto float_idx = idx[0].to(torch::kFloat32), wide_idx = idx[0].view({5, 1}).contiguous();
  std::vector<fl_array> targets{row_major(y0), row_major(m0)};
  double loss = 0;
  std::vector<fl_array> one{row_major(x0)};
  EXPECT_EQ(fl_train_step_n(c, 1, one.data(), 2, targets.data(), &loss), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("fl_train_step_n: inputs: 1 array(s) given, and the config declares 2"),
            std::string::npos)
      << fl_last_error();
  std::vector<fl_array> floats{row_major(x0), row_major(float_idx)};
  EXPECT_EQ(fl_train_step_n(c, 2, floats.data(), 2, targets.data(), &loss), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error())
                .find("inputs[1]: (5) row-major float32 holds float32 values, and it is "
                      "declared int64"),
            std::string::npos)
      << fl_last_error();
  std::vector<fl_array> wide{row_major(x0), row_major(wide_idx)};
  EXPECT_EQ(fl_train_step_n(c, 2, wide.data(), 2, targets.data(), &loss), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error())
                .find("inputs[1]: (5, 1) row-major int64 is a batch of 5 samples of shape [1], "
                      "and data.input_shapes[1] is []"),
            std::string::npos)
      << fl_last_error();
  int64_t trained = -1;
  ASSERT_EQ(fl_steps(c, &trained, nullptr, nullptr), FL_OK);
  EXPECT_EQ(trained, 0) << "a refused step is not a step";
  ASSERT_EQ(fl_save(c, (dir_ / "untouched.safetensors").c_str()), FL_OK) << fl_last_error();
  expect_equal(weights_in(dir_ / "untouched.safetensors"), before);

  for (int s = 0; s < 6; ++s) {
    const auto xs = x[s].contiguous(), ys = y[s].contiguous(), ms = mask[s].contiguous();
    const auto is = s % 2 ? idx[s].to(torch::kInt32) : idx[s].contiguous();  // int32 arrays are widened
    std::vector<fl_array> in{row_major(xs), row_major(is)}, out{row_major(ys), row_major(ms)};
    ASSERT_EQ(fl_train_step_n(c, 2, in.data(), 2, out.data(), &loss), FL_OK) << fl_last_error();
    EXPECT_EQ(loss, cpp_losses[static_cast<std::size_t>(s)]) << "step " << s;
  }
  ASSERT_EQ(fl_save(c, (dir_ / "c.safetensors").c_str()), FL_OK) << fl_last_error();
  expect_equal(weights_in(dir_ / "c.safetensors"), weights_of(*cpp));

  // Fortran (tests/c/two_inputs.f90): the same formulas' samples, the same weights as the step API's on them.
  const auto fortran = fs::path(FASTLEARN_BIN_DIR) / "c_two_inputs_fortran";
  if (fs::exists(fortran)) {
    std::ofstream(dir_ / "multi.toml") << text;
    const auto [status, printed] = flt::run_shell(
        fmt::format("cd '{}' && '{}' multi.toml fortran.safetensors 2>&1", dir_.string(), fortran.string()));
    ASSERT_EQ(status, 0) << printed;
    EXPECT_NE(printed.find("fl_train_step_n: inputs: 1 array(s) given, and the config declares 2"), std::string::npos)
        << printed;
    auto twin = fl::learner_from_config(config, {.progress = false});
    twin->begin_steps(fl::step_plan(config), fl::step_fit(config));
    for (int s = 0; s < 6; ++s) {
      auto fx = torch::empty({5, 4}), fy = torch::empty({5, 1}), fmask = torch::empty({5, 1});
      auto fidx = torch::empty({5}, torch::kInt64);
      for (int j = 1; j <= 5; ++j) {
        for (int i = 1; i <= 4; ++i) fx[j - 1][i - 1] = static_cast<float>(std::sin(0.1 * (s * 20 + j * 4 + i)));
        fidx[j - 1] = (s * 5 + j) % 10;
        fy[j - 1][0] = static_cast<float>(std::cos(0.3 * (s * 5 + j)));
        fmask[j - 1][0] = (s + j) % 3 != 0 ? 1.0f : 0.0f;
      }
      twin->train_step({fx, fidx}, {fy, fmask});
    }
    twin->end_steps();
    expect_equal(weights_in(dir_ / "fortran.safetensors"), weights_of(*twin));
  } else {
    ADD_FAILURE() << "no " << fortran << ": the build found no Fortran compiler (scripts/bootstrap installs gfortran)";
  }

  // Predictions of both inputs, and from the export with the scripts gone.
  const auto new_x = torch::randn({3, 4});
  const auto new_idx = torch::randint(0, 10, {3}, torch::kInt64);
  const auto expected = cpp->predict_batch({new_x, new_idx});
  auto pred = torch::zeros({3, 1});
  std::vector<fl_array> in{row_major(new_x), row_major(new_idx)};
  auto out = row_major(pred);
  ASSERT_EQ(fl_predict_n(c, 2, in.data(), 1, &out), FL_OK) << fl_last_error();
  EXPECT_TRUE(torch::equal(pred, expected));
  ASSERT_EQ(fl_export(c, (dir_ / "export.safetensors").c_str()), FL_OK) << fl_last_error();
  fs::remove(dir_ / "model.pt");
  fs::remove(dir_ / "loss.pt");
  fl_learner* loaded = nullptr;
  ASSERT_EQ(fl_load_export((dir_ / "export.safetensors").c_str(), "cpu", &loaded), FL_OK) << fl_last_error();
  learners_.push_back(loaded);
  auto again = torch::full({3, 1}, -1.0f);
  auto out_again = row_major(again);
  ASSERT_EQ(fl_predict_n(loaded, 2, in.data(), 1, &out_again), FL_OK) << fl_last_error();
  EXPECT_TRUE(torch::equal(again, expected));
}

// data.classes: a program's samples classified, integer labels from C (int64, or int32 widened), as the step API does.
TEST_F(CInterface, AProgramsSamplesAreClassifiedFromIntegerLabels) {
  const auto text = fmt::format(R"([data]
dataset = "program"
input_shape = [4]
classes = 3
steps_per_epoch = 10
held_out = 16
[model]
arch = "mlp"
hidden = [16]
[train]
epochs = 3
lr = 0.05
device = "cpu"
metrics = ["accuracy"]
[output]
dir = "{}"
plots = false
)",
                                (dir_ / "run").string());
  const auto config = fl::parse_config(text, "classes.toml");
  EXPECT_EQ(fl::to_string(fl::task_of(config.data)), "classification");
  EXPECT_EQ(config.train.loss, "cross_entropy");
  torch::manual_seed(5);
  const auto x = torch::randn({30, 16, 4});
  const auto labels = (x.select(2, 0) > 0).to(torch::kInt64) + (x.select(2, 1) > 0).to(torch::kInt64);  // 0, 1, 2
  auto cpp = fl::learner_from_config(config, {.progress = false});
  cpp->begin_steps(fl::step_plan(config), fl::step_fit(config));
  cpp->hold_out({x[29]}, {labels[29]});
  for (int s = 0; s < 30; ++s) cpp->train_step(x[s], labels[s]);
  cpp->end_steps();

  auto* c = create(text);
  const auto held_x = x[29].contiguous(), held_y = labels[29].contiguous();
  auto hx = row_major(held_x), hy = row_major(held_y);
  ASSERT_EQ(fl_hold_out(c, &hx, &hy), FL_OK) << fl_last_error();
  const auto float_labels = labels[0].to(torch::kFloat32);
  auto x0 = row_major(x[0].contiguous()), wrong = row_major(float_labels);
  EXPECT_EQ(fl_train_step(c, &x0, &wrong, nullptr), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error())
                .find("targets: (16) row-major float32 holds float32 values, and it is "
                      "declared int64"),
            std::string::npos)
      << fl_last_error();
  const auto out_of_range = labels[0].clone().fill_(3);
  auto bad = row_major(out_of_range);
  EXPECT_EQ(fl_train_step(c, &x0, &bad, nullptr), FL_ERROR_VALUE);
  EXPECT_NE(std::string(fl_last_error()).find("targets: class 3 is not in [0, 3) (data.classes = 3)"),
            std::string::npos)
      << fl_last_error();
  for (int s = 0; s < 30; ++s) {
    const auto xs = x[s].contiguous();
    const auto ys = s % 2 ? labels[s].to(torch::kInt32) : labels[s].contiguous();
    auto xa = row_major(xs), ya = row_major(ys);
    ASSERT_EQ(fl_train_step(c, &xa, &ya, nullptr), FL_OK) << fl_last_error();
  }
  ASSERT_EQ(fl_save(c, (dir_ / "c.safetensors").c_str()), FL_OK) << fl_last_error();
  expect_equal(weights_in(dir_ / "c.safetensors"), weights_of(*cpp));
  // The probabilities of the 3 classes, and the accuracy on the held-out samples after each epoch.
  auto probs = torch::zeros({16, 3});
  auto out = row_major(probs);
  ASSERT_EQ(fl_predict(c, &hx, &out), FL_OK) << fl_last_error();
  EXPECT_TRUE(probs.sum(1).allclose(torch::ones({16}), 1e-5, 1e-5)) << "softmax";
  std::ifstream history(dir_ / "run" / "history.csv");
  std::string header;
  std::getline(history, header);
  EXPECT_NE(header.find("accuracy"), std::string::npos) << header;
  // Refused by name: another arch, and targets of another dtype.
  const auto field = message_of_config(text + "\n", "model.arch=\"field_cnn\"");
  EXPECT_NE(field.find("with data.classes: only \"mlp\" classifies"), std::string::npos) << field;
  const auto dtype = message_of_config(text, "data.target_dtypes=[\"float32\"]");
  EXPECT_NE(dtype.find("data.classes makes the first target class indices"), std::string::npos) << dtype;
}

TEST_F(CInterface, MisuseIsAStatusWithAMessageNeverACrash) {
  fl_learner* learn = nullptr;
  // Bad configs: the message names the key, the line or the file.
  EXPECT_EQ(fl_create(nullptr, &learn), FL_ERROR_NULL);
  EXPECT_EQ(fl_create("x.toml", nullptr), FL_ERROR_NULL);
  EXPECT_EQ(fl_create((dir_ / "missing.toml").c_str(), &learn), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("missing.toml"), std::string::npos) << fl_last_error();
  EXPECT_EQ(learn, nullptr);
  const auto base = config_text(dir_ / "run");
  auto with = [&](const std::string& from, const std::string& to) {
    auto text = base;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  EXPECT_EQ(fl_create_from_toml(with("hidden = [16]", "hiden = [16]").c_str(), "bad.toml", &learn), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("model.hidden"), std::string::npos) << fl_last_error();
  EXPECT_EQ(
      fl_create_from_toml(with("dataset = \"program\"", "dataset = \"fashion_mnist\"").c_str(), "bad.toml", &learn),
      FL_ERROR_CONFIG);
  EXPECT_EQ(fl_create_from_toml(with("input_shape = [3, 4]\n", "").c_str(), "bad.toml", &learn), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("data.input_shape"), std::string::npos) << fl_last_error();
  EXPECT_EQ(
      fl_create_from_toml(with("arch = \"mlp\"\nhidden = [16]", "arch = \"field_cnn\"").c_str(), "bad.toml", &learn),
      FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("field_cnn"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_create_from_toml("[data\n", "bad.toml", &learn), FL_ERROR_CONFIG);
  EXPECT_EQ(fl_create(dir_.c_str(), &learn), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("is a folder, not a config file"), std::string::npos) << fl_last_error();
  EXPECT_EQ(learn, nullptr);

  learn = create();
  const auto x = torch::randn({4, 3, 4}), y = torch::randn({4, 2});
  auto xa = row_major(x), ya = row_major(y);
  // Null pointers.
  EXPECT_EQ(fl_train_step(nullptr, &xa, &ya, nullptr), FL_ERROR_NULL);
  EXPECT_EQ(fl_train_step(learn, nullptr, &ya, nullptr), FL_ERROR_NULL);
  auto no_data = xa;
  no_data.data = nullptr;
  EXPECT_EQ(fl_train_step(learn, &no_data, &ya, nullptr), FL_ERROR_NULL);
  EXPECT_EQ(fl_save(learn, nullptr), FL_ERROR_NULL);
  // Wrong shapes, types and layouts, each said with what was expected.
  const auto wrong = torch::randn({4, 4, 3});
  auto wa = row_major(wrong);
  EXPECT_EQ(fl_train_step(learn, &wa, &ya, nullptr), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error()).find("data.input_shape is [3, 4]"), std::string::npos) << fl_last_error();
  auto column = column_major(x);  // (4, 3, 4) column-major is a batch of 4 x 3 samples: not [3, 4]
  column.shape[0] = 3;
  column.shape[1] = 4;
  EXPECT_EQ(fl_train_step(learn, &column, &ya, nullptr), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error()).find("in reverse"), std::string::npos) << fl_last_error();
  const auto more = torch::randn({5, 2});
  auto ma = row_major(more);
  EXPECT_EQ(fl_train_step(learn, &xa, &ma, nullptr), FL_ERROR_SHAPE);
  for (auto [field, value] : {std::pair{0, 7}, std::pair{1, -1}, std::pair{2, 0}, std::pair{2, 9}}) {
    auto bad = xa;
    (field == 0 ? bad.dtype : field == 1 ? bad.layout : bad.ndim) = value;
    EXPECT_EQ(fl_train_step(learn, &bad, &ya, nullptr), FL_ERROR_SHAPE) << field << " = " << value;
  }
  auto strided = xa;  // what the Fortran module's fl_array_of hands over for a section with a stride
  strided.reserved = 1;
  EXPECT_EQ(fl_train_step(learn, &strided, &ya, nullptr), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error()).find("not contiguous"), std::string::npos) << fl_last_error();
  auto negative = xa;
  negative.shape[0] = -4;
  EXPECT_EQ(fl_train_step(learn, &negative, &ya, nullptr), FL_ERROR_SHAPE);
  auto huge = xa;
  huge.shape[0] = int64_t{1} << 62;  // claimed, never allocated nor read
  EXPECT_EQ(fl_train_step(learn, &huge, &ya, nullptr), FL_ERROR_SHAPE);
  // NaN and infinite values, by position.
  auto nan_x = x.clone();
  nan_x[2][1][3] = std::nan("");
  auto na = row_major(nan_x);
  EXPECT_EQ(fl_train_step(learn, &na, &ya, nullptr), FL_ERROR_VALUE);
  EXPECT_NE(std::string(fl_last_error()).find("element 31"), std::string::npos) << fl_last_error();
  auto inf_y = y.to(torch::kFloat64);
  inf_y[0][1] = INFINITY;
  auto ia = row_major(inf_y);
  EXPECT_EQ(fl_train_step(learn, &xa, &ia, nullptr), FL_ERROR_VALUE);
  // None of that started the steps: they start with a good batch.
  int64_t trained = -1;
  ASSERT_EQ(fl_steps(learn, &trained, nullptr, nullptr), FL_OK);
  EXPECT_EQ(trained, 0);
  EXPECT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
  // Not now: setup after the first step, loading during the steps, predictions into the wrong shape.
  EXPECT_EQ(fl_distributed_init(learn), FL_ERROR_STATE);
  EXPECT_EQ(fl_resume(learn, dir_.c_str()), FL_ERROR_STATE);
  EXPECT_EQ(fl_load(learn, (dir_ / "none.safetensors").c_str()), FL_ERROR_STATE);
  const auto out = torch::zeros({4, 3});
  auto oa = row_major(out);
  EXPECT_EQ(fl_predict(learn, &xa, &oa), FL_ERROR_SHAPE);
  EXPECT_NE(std::string(fl_last_error()).find("[4, 2]"), std::string::npos) << fl_last_error();
  // After the planned steps, a step is refused and says how many were trained.
  for (int s = 1; s < 8; ++s) ASSERT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
  EXPECT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_ERROR_STATE);
  EXPECT_NE(std::string(fl_last_error()).find("8 of the 8"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_end_steps(learn), FL_OK) << "ended already: nothing to do";
  EXPECT_EQ(fl_load(learn, (dir_ / "none.safetensors").c_str()), FL_ERROR_IO);
  EXPECT_NE(std::string(fl_last_error()).find("none.safetensors"), std::string::npos) << fl_last_error();
  // Holding out needs a config that holds out.
  auto* no_hold = create([&] {
    auto text = config_text(dir_ / "c");
    text.replace(text.find("held_out = 8"), 12, "held_out = 0");
    return text;
  }());
  EXPECT_EQ(fl_hold_out(no_hold, &xa, &ya), FL_ERROR_CONFIG);
  EXPECT_NE(std::string(fl_last_error()).find("data.held_out"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_resume(no_hold, (dir_ / "nowhere").c_str()), FL_ERROR_IO);
  // Steps the program ended are said to be so; an output folder that cannot be made is said at creation.
  ASSERT_EQ(fl_train_step(no_hold, &xa, &ya, nullptr), FL_OK) << fl_last_error();
  ASSERT_EQ(fl_end_steps(no_hold), FL_OK) << fl_last_error();
  EXPECT_EQ(fl_train_step(no_hold, &xa, &ya, nullptr), FL_ERROR_STATE);
  EXPECT_NE(std::string(fl_last_error()).find("after 1 of the 8 planned (fl_end_steps ended them)"), std::string::npos)
      << fl_last_error();
  fl_learner* unwritable = nullptr;
  EXPECT_EQ(fl_create_from_toml(config_text("/proc/no/such/run").c_str(), "run.toml", &unwritable), FL_ERROR_IO);
  EXPECT_NE(std::string(fl_last_error()).find("output.dir '/proc/no/such/run' cannot be created"), std::string::npos)
      << fl_last_error();
}

TEST_F(CInterface, AFreedLearnerIsRefusedThroughEveryCopyOfItsHandle) {
  fl_learner* learn = nullptr;
  ASSERT_EQ(fl_create_from_toml(config_text(dir_ / "run").c_str(), nullptr, &learn), FL_OK) << fl_last_error();
  fl_learner* copy = learn;
  ASSERT_EQ(fl_free(&learn), FL_OK);
  EXPECT_EQ(learn, nullptr);
  EXPECT_EQ(fl_free(&learn), FL_OK) << "freeing NULL does nothing";
  EXPECT_EQ(fl_free(nullptr), FL_OK);
  const auto x = torch::randn({4, 3, 4}), y = torch::randn({4, 2});
  auto xa = row_major(x), ya = row_major(y);
  EXPECT_EQ(fl_train_step(copy, &xa, &ya, nullptr), FL_ERROR_STATE);
  EXPECT_NE(std::string(fl_last_error()).find("freed"), std::string::npos) << fl_last_error();
  EXPECT_EQ(fl_steps(copy, nullptr, nullptr, nullptr), FL_ERROR_STATE);
  EXPECT_EQ(fl_free(&copy), FL_ERROR_STATE) << "a second free through a copy";
  EXPECT_EQ(copy, nullptr);
  // A pointer that never was a learner.
  int not_a_learner = 0;
  EXPECT_EQ(fl_end_steps(reinterpret_cast<fl_learner*>(&not_a_learner)), FL_ERROR_STATE);
  EXPECT_NE(std::string(fl_last_error()).find("not a learner"), std::string::npos) << fl_last_error();
}

TEST_F(CInterface, TheLastErrorBelongsToTheThreadThatMetIt) {
  EXPECT_EQ(fl_create(nullptr, nullptr), FL_ERROR_NULL);
  const std::string mine = fl_last_error();
  EXPECT_FALSE(mine.empty());
  std::string other = "unset";
  std::thread([&] { other = fl_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(std::string(fl_last_error()), mine);
  EXPECT_STREQ(fl_version(), FASTLEARN_VERSION_FOR_TESTS);
  // A successful call clears it.
  auto* learn = create();
  int32_t rank = -1, world = -1;
  EXPECT_EQ(fl_rank(learn, &rank, &world), FL_OK);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(world, 1);
  EXPECT_STREQ(fl_last_error(), "");
}

TEST_F(CInterface, ResumesFromItsCheckpointToTheWeightsOfAnUninterruptedRun) {
  torch::manual_seed(3);
  const auto x = torch::randn({8, 4, 3, 4}), y = torch::randn({8, 4, 2}), held_x = torch::randn({8, 3, 4}),
             held_y = torch::randn({8, 2});
  const auto run = [&](const fs::path& out, int from, int to, bool resume) {
    fl_learner* learn = nullptr;
    EXPECT_EQ(fl_create_from_toml(config_text(out).c_str(), "resume.toml", &learn), FL_OK) << fl_last_error();
    if (resume) {
      EXPECT_EQ(fl_resume(learn, (out / "checkpoints").c_str()), FL_OK) << fl_last_error();
      int64_t trained = -1;
      EXPECT_EQ(fl_steps(learn, &trained, nullptr, nullptr), FL_OK);
      EXPECT_EQ(trained, from) << "the checkpoint after the first epoch";
    } else {
      auto hx = row_major(held_x), hy = row_major(held_y);
      EXPECT_EQ(fl_hold_out(learn, &hx, &hy), FL_OK) << fl_last_error();
    }
    for (int s = from; s < to; ++s) {
      const auto xs = x[s].contiguous(), ys = y[s].contiguous();
      auto xa = row_major(xs), ya = row_major(ys);
      EXPECT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
    }
    EXPECT_EQ(fl_save(learn, (out / "weights.safetensors").c_str()), FL_OK) << fl_last_error();
    EXPECT_EQ(fl_free(&learn), FL_OK) << fl_last_error();  // before the planned steps: ends them as cancelled
  };
  run(dir_ / "whole", 0, 8, false);
  run(dir_ / "parts", 0, 4, false);  // the program stops after the first epoch's checkpoint
  run(dir_ / "parts", 4, 8, true);
  expect_equal(weights_in(dir_ / "parts" / "weights.safetensors"), weights_in(dir_ / "whole" / "weights.safetensors"));
  // The resumed run's history.csv keeps the first epoch's row, as the uninterrupted one has it.
  const auto rows = [](const fs::path& file) {
    std::ifstream in(file);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
    return out;
  };
  EXPECT_EQ(rows(dir_ / "parts" / "history.csv"), rows(dir_ / "whole" / "history.csv"));
  EXPECT_EQ(rows(dir_ / "whole" / "history.csv").size(), 3u);
}

TEST_F(CInterface, AnExportPredictsAsTheLearnerThatTrainedIt) {
  auto* learn = create();
  const auto x = torch::randn({4, 3, 4}), y = torch::randn({4, 2});
  auto xa = row_major(x), ya = row_major(y);
  for (int s = 0; s < 3; ++s) ASSERT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
  const auto file = dir_ / "export.safetensors";
  ASSERT_EQ(fl_export(learn, file.c_str()), FL_OK) << fl_last_error();
  auto trained = torch::zeros({4, 2}), loaded = torch::zeros({4, 2});
  auto ta = row_major(trained), la = row_major(loaded);
  ASSERT_EQ(fl_predict(learn, &xa, &ta), FL_OK) << fl_last_error();
  fl_learner* served = nullptr;
  ASSERT_EQ(fl_load_export(file.c_str(), "cpu", &served), FL_OK) << fl_last_error();
  learners_.push_back(served);
  ASSERT_EQ(fl_predict(served, &xa, &la), FL_OK) << fl_last_error();
  EXPECT_TRUE(torch::equal(trained, loaded));
  EXPECT_EQ(fl_train_step(served, &xa, &ya, nullptr), FL_ERROR_STATE);
  EXPECT_NE(std::string(fl_last_error()).find("predicts only"), std::string::npos) << fl_last_error();
  fl_learner* none = nullptr;
  EXPECT_EQ(fl_load_export(file.c_str(), "tpu", &none), FL_ERROR_CONFIG);
  EXPECT_EQ(fl_load_export((dir_ / "missing").c_str(), nullptr, &none), FL_ERROR_IO);
  EXPECT_EQ(none, nullptr);
}

// fl_export and fl_save are not collective: a 2-rank program calls them on rank 0 alone, in the middle of its steps,
// while rank 1 is busy elsewhere (waiting for rank 0's word through the store, which never comes if rank 0 waits for
// rank 1); then both train on. The export predicts as rank 1's own learner did at that step: the weights are the same.
TEST(CInterfaceRanks, RankZeroAloneSavesAndExportsWhileTheOtherRankWorks) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn_c_ranks_{}", flt::test_process_id());
  flt::run_on_ranks(2,
                    [&dir](const flt::RankContext& rank) {
                      auto text = config_text(dir / "run", "");
                      text.replace(text.find("held_out = 8\n"), 13, "");
                      fl_learner* learn = nullptr;
                      ASSERT_EQ(fl_create_from_toml(text.c_str(), "ranks.toml", &learn), FL_OK) << fl_last_error();
                      ASSERT_EQ(fl_distributed_init(learn), FL_OK) << fl_last_error();
                      int32_t me = -1, ranks = 0;
                      ASSERT_EQ(fl_rank(learn, &me, &ranks), FL_OK);
                      ASSERT_EQ(me, rank.rank);
                      ASSERT_EQ(ranks, 2);
                      torch::manual_seed(10 + me);
                      const auto step = [&] {
                        const auto x = torch::randn({4, 3, 4}), y = torch::randn({4, 2});
                        auto xa = row_major(x), ya = row_major(y);
                        double loss = 0;
                        ASSERT_EQ(fl_train_step(learn, &xa, &ya, &loss), FL_OK) << fl_last_error();
                      };
                      for (int s = 0; s < 3; ++s) step();
                      const auto exported = dir / "surrogate.safetensors", saved = dir / "weights.safetensors";
                      if (me == 0) {
                        ASSERT_EQ(fl_export(learn, exported.c_str()), FL_OK) << fl_last_error();
                        ASSERT_EQ(fl_save(learn, saved.c_str()), FL_OK) << fl_last_error();
                        rank.store->set("written", std::vector<std::uint8_t>{1});
                      } else {
                        rank.store->wait({"written"},
                                         std::chrono::seconds(20));  // throws if rank 0 waits for this rank
                      }
                      // The export predicts what this rank's learner predicts now.
                      const auto probe = torch::randn({5, 3, 4});
                      auto mine = torch::zeros({5, 2}), theirs = torch::zeros({5, 2});
                      auto in = row_major(probe), out_mine = row_major(mine), out_theirs = row_major(theirs);
                      ASSERT_EQ(fl_predict(learn, &in, &out_mine), FL_OK) << fl_last_error();
                      fl_learner* served = nullptr;
                      ASSERT_EQ(fl_load_export(exported.c_str(), "cpu", &served), FL_OK) << fl_last_error();
                      ASSERT_EQ(fl_predict(served, &in, &out_theirs), FL_OK) << fl_last_error();
                      EXPECT_TRUE(torch::equal(mine, theirs));
                      fl_free(&served);
                      EXPECT_TRUE(fs::exists(saved));
                      step();  // both ranks train on together
                      ASSERT_EQ(fl_end_steps(learn), FL_OK) << fl_last_error();
                      ASSERT_EQ(fl_free(&learn), FL_OK) << fl_last_error();
                    },
                    {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
  if (!flt::in_rank_process()) fs::remove_all(dir);
}

// fl_distributed_init_ranks: ranks 2 and 0 of a job of 3 train together, their steps those of one process with both
// halves of each batch; rank 1, outside, says so and is not waited for.
TEST(CInterfaceRanks, ASubsetOfTheJobsRanksTrainsTogether) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn_c_subset_{}", flt::test_process_id());
  flt::run_on_ranks(
      3,
      [&dir](const flt::RankContext& ctx) {
        auto text = config_text(dir / fmt::format("run{}", ctx.rank), "");
        text.replace(text.find("held_out = 8\n"), 13, "");
        torch::manual_seed(1);
        const auto x = torch::randn({8, 8, 3, 4}), y = torch::randn({8, 8, 2});
        // One process, the whole batches: the reference.
        const auto config = fl::parse_config(text, "subset.toml");
        auto whole = fl::learner_from_config(config, {.progress = false});
        whole->begin_steps(fl::step_plan(config), fl::step_fit(config));
        for (int s = 0; s < 8; ++s) whole->train_step(x[s], y[s]);
        whole->end_steps();

        fl_learner* learn = nullptr;
        ASSERT_EQ(fl_create_from_toml(text.c_str(), "subset.toml", &learn), FL_OK) << fl_last_error();
        const std::vector<int32_t> wrong{0, 3};
        EXPECT_EQ(fl_distributed_init_ranks(learn, wrong.data(), 2), FL_ERROR_CONFIG);
        EXPECT_NE(std::string(fl_last_error()).find("ranks [0, 3]: 3 is not a rank of a job of 3 process(es)"),
                  std::string::npos)
            << fl_last_error();
        const std::vector<int32_t> members{2, 0};
        ASSERT_EQ(fl_distributed_init_ranks(learn, members.data(), 2), FL_OK) << fl_last_error();
        int32_t me = 0, size = 0, global = -1, world = 0;
        ASSERT_EQ(fl_rank(learn, &me, &size), FL_OK);
        ASSERT_EQ(fl_global_rank(learn, &global, &world), FL_OK);
        EXPECT_EQ(global, ctx.rank);
        EXPECT_EQ(world, 3);
        EXPECT_EQ(size, 2);
        if (ctx.rank == 1) {
          EXPECT_EQ(me, -1) << "outside the subset";
        } else {
          EXPECT_EQ(me, ctx.rank / 2);
          for (int s = 0; s < 8; ++s) {  // rank 0 takes the first half of each batch, rank 2 the second
            const auto xs = x[s].narrow(0, 4 * me, 4).contiguous(), ys = y[s].narrow(0, 4 * me, 4).contiguous();
            auto xa = row_major(xs), ya = row_major(ys);
            ASSERT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
          }
          const auto file = dir / fmt::format("rank{}.safetensors", ctx.rank);
          fs::create_directories(dir);
          ASSERT_EQ(fl_save(learn, file.c_str()), FL_OK) << fl_last_error();
          if (me == 0) {
            const auto saved = weights_in(file), expected = weights_of(*whole);
            ASSERT_EQ(saved.size(), expected.size());
            for (std::size_t i = 0; i < saved.size(); ++i)
              EXPECT_TRUE(saved[i].allclose(expected[i], 1e-5, 1e-6)) << "tensor " << i;
          }
        }
        ASSERT_EQ(fl_free(&learn), FL_OK) << fl_last_error();
      },
      {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(3)});
  if (!flt::in_rank_process()) fs::remove_all(dir);
}

// With `shard = "gradients"` (or "parameters") in the config, each rank keeps its share of the optimizer's state (and
// of the parameters) and fl_save is collective: every rank calls it, rank 0 writes the whole state, the same as an
// unsharded run's file of those steps.
TEST(CInterfaceRanks, ShardedStepsSaveTheWholeStateWhenEveryRankSaves) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn_c_sharded_{}", flt::test_process_id());
  flt::run_on_ranks(2,
                    [&dir](const flt::RankContext& rank) {
                      for (const char* shard : {"none", "gradients", "parameters"}) {
                        auto text = config_text(dir / shard, fmt::format("[distributed]\nshard = \"{}\"", shard));
                        text.replace(text.find("held_out = 8\n"), 13, "");
                        fl_learner* learn = nullptr;
                        ASSERT_EQ(fl_create_from_toml(text.c_str(), "sharded.toml", &learn), FL_OK) << fl_last_error();
                        ASSERT_EQ(fl_distributed_init(learn), FL_OK) << fl_last_error();
                        torch::manual_seed(10 + rank.rank);
                        for (int s = 0; s < 6; ++s) {
                          const auto x = torch::randn({4, 3, 4}), y = torch::randn({4, 2});
                          auto xa = row_major(x), ya = row_major(y);
                          ASSERT_EQ(fl_train_step(learn, &xa, &ya, nullptr), FL_OK) << fl_last_error();
                        }
                        const auto file = dir / fmt::format("{}.safetensors", shard);
                        ASSERT_EQ(fl_save(learn, file.c_str()), FL_OK) << fl_last_error();
                        ASSERT_EQ(fl_end_steps(learn), FL_OK) << fl_last_error();
                        ASSERT_EQ(fl_free(&learn), FL_OK) << fl_last_error();
                      }
                      if (rank.rank != 0) return;
                      const auto whole = fl::load_safetensors(dir / "none.safetensors");
                      for (const char* stage : {"gradients", "parameters"}) {
                        const auto sharded = fl::load_safetensors(dir / fmt::format("{}.safetensors", stage));
                        ASSERT_EQ(sharded.tensors.size(), whole.tensors.size()) << stage;
                        int optimizer_tensors = 0;
                        for (std::size_t i = 0; i < whole.tensors.size(); ++i) {
                          const auto& [name, t] = whole.tensors[i];
                          ASSERT_EQ(sharded.tensors[i].first, name) << stage;
                          optimizer_tensors += name.starts_with("optimizer/") ? 1 : 0;
                          if (t.is_floating_point())
                            EXPECT_TRUE(t.allclose(sharded.tensors[i].second, 1e-6, 1e-6)) << stage << ": " << name;
                        }
                        EXPECT_EQ(optimizer_tensors, 8) << stage << ": Adam's two states of the MLP's 4 parameters";
                      }
                    },
                    {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
  if (!flt::in_rank_process()) fs::remove_all(dir);
}

// apps/examples/heat_surrogate in C++, C and Fortran: the solver trains its surrogate on 1 and on 2 ranks, the three
// train the same weights, and the surrogate stands in for the solver for 20 steps within 1%.
TEST(HeatSurrogate, CppCAndFortranTrainTheSameSurrogateOnOneAndTwoRanks) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn_heat_{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto config = fs::path(FASTLEARN_SOURCE_DIR) / "configs" / "heat_surrogate.toml";
  for (const int ranks : {1, 2}) {
    std::vector<std::vector<at::Tensor>> weights;
    for (const char* program : {"heat_surrogate", "heat_surrogate_c", "heat_surrogate_fortran"}) {
      SCOPED_TRACE(fmt::format("{} on {} rank(s)", program, ranks));
      const auto binary = fs::path(FASTLEARN_BIN_DIR) / program;
      const auto file = dir / fmt::format("{}_{}.safetensors", program, ranks);
      const auto command =
          fmt::format("cd '{}' && {}'{}' '{}' '{}' 2>&1", dir.string(),
                      ranks > 1 ? fmt::format("'{}' launch --nproc-per-node {} ", FASTLEARN_CLI, ranks) : std::string(),
                      binary.string(), config.string(), file.string());
      const auto [status, out] = fl::testing::run_shell(command);
      ASSERT_EQ(status, 0) << out;
      std::smatch m;
      ASSERT_TRUE(
          std::regex_search(out, m, std::regex(R"((\d+) steps on (\d+) rank\(s\).* surrogate is ([0-9.eE+-]+)% off)")))
          << out;
      EXPECT_EQ(m[1], "1000");
      EXPECT_EQ(std::stoi(m[2]), ranks);
      EXPECT_LT(std::stod(m[3]), 1.0) << out;
      weights.push_back(weights_in(file));
    }
    expect_equal(weights[1], weights[0]);
    expect_equal(weights[2], weights[0]);
  }
  fs::remove_all(dir);
}

// The command line has no program to take a program's samples from: `fastlearn train` refuses its config by name;
// `fastlearn predict` predicts from its export, the fields read from and written to .npy and safetensors files.
TEST(HeatSurrogate, TheCommandLineRefusesAProgramsConfigAndPredictsFromItsExport) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn_heat_cli_{}", getpid());
  fs::remove_all(dir);
  const auto config = (fs::path(FASTLEARN_SOURCE_DIR) / "configs" / "heat_surrogate.toml").string();
  const auto train = fl::testing::run_cli(fmt::format("train {} --out {}", config, (dir / "run").string()));
  EXPECT_NE(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("data.dataset = \"program\" trains on samples a running program hands over"),
            std::string::npos)
      << train.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << "refused before anything is written";
  // An export of the surrogate, as fl_export writes it (its run folder in the test's).
  std::ifstream in(config);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("runs/heat_surrogate"), 19, (dir / "program").string());
  fl_learner* learn = nullptr;
  ASSERT_EQ(fl_create_from_toml(text.c_str(), "heat_surrogate.toml", &learn), FL_OK) << fl_last_error();
  const auto file = dir / "surrogate.safetensors";
  ASSERT_EQ(fl_export(learn, file.c_str()), FL_OK) << fl_last_error();
  // `fastlearn predict EXPORT` reads the fields from NumPy's files as numpy.save writes them (C order float32, Fortran
  // order big-endian float64, one item without the batch dimension) and from safetensors, and writes the outputs the
  // same way, which numpy reads back: the C interface's predictions on the same fields.
  const auto fields = torch::randn({2, 32, 32});
  std::ofstream(dir / "fields.raw", std::ios::binary)
      .write(static_cast<const char*>(fields.data_ptr()), static_cast<std::streamsize>(fields.nbytes()));
  auto [status, out] = fl::testing::run_shell(
      fmt::format("cd '{}' && '{}' -c \"import numpy as np; x = np.fromfile('fields.raw', '<f4').reshape(2, 32, 32); "
                  "np.save('c_order.npy', x); np.save('fortran_order.npy', np.asfortranarray(x.astype('>f8'))); "
                  "np.save('one.npy', x[1])\"",
                  dir.string(), FASTLEARN_PYTHON));
  ASSERT_EQ(status, 0) << out;
  fl::save_safetensors(dir / "fields.safetensors", {{"one", fields[0].clone()}, {"both", fields}});
  const auto predict =
      fl::testing::run_cli(fmt::format("predict {} {} {} {} {} --out {}", file.string(), (dir / "c_order.npy").string(),
                                       (dir / "fortran_order.npy").string(), (dir / "one.npy").string(),
                                       (dir / "fields.safetensors").string(), (dir / "outputs").string()));
  ASSERT_EQ(predict.exit_code, 0) << predict.output;
  EXPECT_NE(predict.output.find("c_order.npy\tbatch (2, 32, 32) -> outputs (2, 32, 32)"), std::string::npos)
      << predict.output;
  EXPECT_NE(predict.output.find("one.npy\titem (32, 32) -> outputs (32, 32)"), std::string::npos) << predict.output;
  auto expected = torch::zeros({2, 32, 32});
  auto field_array = row_major(fields), outputs = row_major(expected);
  ASSERT_EQ(fl_predict(learn, &field_array, &outputs), FL_OK) << fl_last_error();
  ASSERT_EQ(fl_free(&learn), FL_OK);
  std::tie(status, out) = fl::testing::run_shell(fmt::format(
      "cd '{}/outputs' && '{}' -c \"import numpy as np; a = np.load('c_order.npy'); b = np.load('fortran_order.npy'); "
      "c = np.load('one.npy'); assert a.dtype == np.float32 and a.shape == (2, 32, 32) and c.shape == (32, 32), "
      "(a.dtype, a.shape, c.shape); np.concatenate([a, b, c[None]]).astype('<f4').tofile('outputs.raw')\"",
      dir.string(), FASTLEARN_PYTHON));
  ASSERT_EQ(status, 0) << out;
  auto read_back = torch::empty({5, 32, 32});
  std::ifstream(dir / "outputs/outputs.raw", std::ios::binary)
      .read(static_cast<char*>(read_back.data_ptr()), static_cast<std::streamsize>(read_back.nbytes()));
  EXPECT_TRUE(torch::allclose(read_back.narrow(0, 0, 2), expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(read_back.narrow(0, 2, 2), expected, 1e-5, 1e-6)) << "float64 inputs compute in float32";
  EXPECT_TRUE(torch::allclose(read_back[4], expected[1], 1e-5, 1e-6));
  const auto written = fl::load_safetensors(dir / "outputs/fields.safetensors");
  ASSERT_EQ(written.tensors.size(), 2U);
  EXPECT_EQ(written.tensors[0].first, "one");
  EXPECT_TRUE(torch::allclose(written.tensors[0].second, expected[0], 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(written.tensors[1].second, expected, 1e-5, 1e-6));
  // What does not fit is refused by name: an array of another shape, a file of another kind, no --out.
  fl::save_safetensors(dir / "bad.safetensors", {{"small", torch::zeros({31, 32})}});
  const auto bad =
      fl::testing::run_cli(fmt::format("predict {} {} {} --out {}", file.string(), (dir / "bad.safetensors").string(),
                                       config, (dir / "outputs").string()));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("'small': an array of shape (31, 32), and the model takes items of shape (32, 32)"),
            std::string::npos)
      << bad.output;
  EXPECT_NE(bad.output.find("a model of tensors reads .npy and .safetensors files"), std::string::npos) << bad.output;
  const auto no_out = fl::testing::run_cli(fmt::format("predict {} {}", file.string(), (dir / "one.npy").string()));
  EXPECT_NE(no_out.exit_code, 0);
  EXPECT_NE(no_out.output.find("give --out DIR"), std::string::npos) << no_out.output;
  fs::remove_all(dir);
}
