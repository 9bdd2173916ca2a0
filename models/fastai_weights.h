#pragma once
// Weights that pass between fastai and fastlearn. A fastai vision_learner model and fastlearn's vision_model hold the
// same layers under other names:
//   body   fastai "0.0" conv1, "0.1" bn1, "0.4" .. "0.7" layer1 .. layer4 (torchvision's children, cut before the
//          pool); fastlearn "0.conv1", "0.bn1", "0.layer1" .. "0.layer4"; inside a layer both use torchvision's
//          names ("0.1.conv2.weight", "0.0.downsample.1.running_mean");
//   head   fastai's create_head has its concat pooling and its flatten as two modules, fastlearn's as one, so each
//          head layer is one index further in fastai: "1.2" BatchNorm, "1.4" Linear, "1.6" BatchNorm, "1.8" Linear
//          against fastlearn's "1.1", "1.3", "1.5", "1.7".
//   U-Net  fastai's DynamicUnet holds its layers in a ModuleList, "layers.<index>", fastlearn's models::unet as
//          children "<index>" of the same indices: "layers.1.weight" is "1.weight", "layers.4.shuf.0.0.weight"
//          "4.shuf.0.0.weight"; the body maps as above behind the prefix ("layers.0.4.0.conv1.weight" is
//          "0.layer1.0.conv1.weight").
// fastai's TabularModel and fastlearn's use the same names ("embeds.0.weight", "bn_cont.*", "layers.0.0.weight"):
// their state dicts load as they are (models/weights.h).
#include <fastlearn/core/named_tensors.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace torch::nn {
class Module;
}

namespace fastlearn::models {

/// fastai's name of a tensor of fastlearn's vision_model; ConfigError naming it for a name outside the map.
std::string fastai_vision_name(std::string_view fastlearn_name);
/// The inverse: fastlearn's name of a tensor of a fastai vision_learner model; ConfigError naming it otherwise.
std::string fastlearn_vision_name(std::string_view fastai_name);

/// The parameters and buffers of a fastlearn vision_model under fastai's names: save them with save_safetensors and
/// Python loads them into fastai's create_vision_model of the same architecture and classes
/// (`model.load_state_dict(safetensors.torch.load_file(path))`).
NamedTensors fastai_vision_state_dict(torch::nn::Module& vision_model);

/// Loads a fastai vision_learner model's state dict (safetensors, as `safetensors.torch.save_file(
/// learn.model.state_dict(), path)` writes it) into a fastlearn vision_model of the same architecture and classes:
/// strict, every tensor checked (name, shape, dtype) before anything changes; CheckpointError naming the file and the
/// tensor otherwise.
void load_fastai_vision_weights(torch::nn::Module& vision_model, const std::filesystem::path& file);

/// fastai's name of a tensor of a fastlearn U-Net (models::unet); ConfigError naming it for a body name outside the
/// map.
std::string fastai_unet_name(std::string_view fastlearn_name);
/// The inverse: fastlearn's name of a tensor of a fastai DynamicUnet.
std::string fastlearn_unet_name(std::string_view fastai_name);

/// A fastlearn U-Net's parameters and buffers under fastai's names: saved with save_safetensors, they load strictly
/// into fastai's create_unet_model of the same arch, classes, image size and options.
NamedTensors fastai_unet_state_dict(torch::nn::Module& unet);

/// Loads a fastai create_unet_model / unet_learner model's state dict (safetensors) into a fastlearn U-Net built with
/// the same arch, classes, image size and options: strict, checked before anything changes; CheckpointError naming
/// the file and the tensor otherwise.
void load_fastai_unet_weights(torch::nn::Module& unet, const std::filesystem::path& file);

}  // namespace fastlearn::models
