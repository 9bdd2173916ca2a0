#include <fastlearn/core/detail/error_context.h>

#include <fastlearn/core/error.h>

#include <c10/util/Exception.h>

namespace fastlearn {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void rethrow_with_context(const std::exception_ptr& error, const std::string& context) {
  const auto message = context + ": " + message_of(error);
  try {
    std::rethrow_exception(error);
  } catch (const ConfigFileError& e) {  // before ConfigError, its base
    throw ConfigFileError(message, e.key(), e.line(), e.column());
  } catch (const ConfigError&) {
    throw ConfigError(message);
  } catch (const DataError&) {
    throw DataError(message);
  } catch (const CheckpointError&) {
    throw CheckpointError(message);
  } catch (const DistributedError&) {
    throw DistributedError(message);
  } catch (...) {
    throw Error(message);
  }
}

}  // namespace fastlearn
