#pragma once
// On/off switches read from the environment at each use: kernel choices a user can turn off to compare them or
// to rule them out (FASTLEARN_CONV_PATCH_GRAD, FASTLEARN_POOL_BY_VIEW).

namespace fastlearn {

/// True when the variable `name` is unset, empty or "1"; false when it is "0". Any other value throws
/// ConfigError naming the variable, its value and what 0 means (`off_means`, e.g. "torch's convolution
/// everywhere").
bool env_switch_on(const char* name, const char* off_means);

}  // namespace fastlearn
