#pragma once
// The message of the exception `fn` throws, or "no error": for tests that check what an error says.
#include <exception>
#include <functional>
#include <string>

namespace fastlearn::testing {

inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace fastlearn::testing
