#pragma once
// The calling thread's DropoutGeneratorScope as a value, for code that switches between two lines of work on one
// thread (the step API's fit and the program that drives it), each with a scope of its own.
#include <ATen/core/Generator.h>

#include <optional>

namespace fastlearn::models {

/// Makes `generator` the thread's dropout generator (none: torch's default draws) and returns the one before.
std::optional<at::Generator> exchange_dropout_scope(std::optional<at::Generator> generator);

}  // namespace fastlearn::models
