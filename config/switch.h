#pragma once
// A setting that is on, off, or "auto": decided by fastlearn from the rest of the configuration.

namespace fastlearn {

/// In a config file: true, false or "auto".
enum class Switch { off, on, automatic };

}  // namespace fastlearn
