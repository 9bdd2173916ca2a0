#pragma once
// Warnings on stderr ("fastlearn: warning: ..."), once per job: in a data parallel job every rank reads the same
// data and would print the same warning, so a process whose RANK is set and not 0 keeps them to itself.
#include <string_view>

namespace fastlearn {

/// Prints "fastlearn: warning: <message>" and a newline on stderr, unless this process is a rank other than 0
/// of a job (the environment's RANK, as every launcher sets it).
void warn(std::string_view message);

}  // namespace fastlearn
