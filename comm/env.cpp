#include <fastlearn/comm/env.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

namespace fastlearn {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

namespace {

// The variable names one launcher family uses.
struct Scheme {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

int parse_int(const std::string& text, const std::string& name) {
  int value = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw DistributedError(fmt::format("environment variable {}='{}' is not an integer", name, text));
  }
  return value;
}

std::optional<int> lookup_int(const EnvLookup& lookup, const char* name) {
  auto value = lookup(name);
  if (!value || value->empty()) return std::nullopt;
  // SLURM_NTASKS_PER_NODE may read "2(x3)" on some clusters: the count before the repetition.
  if (auto paren = value->find('('); paren != std::string::npos) value->resize(paren);
  return parse_int(*value, name);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const auto comma = nodelist.find(',');
  const auto bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return nodelist.substr(0, comma);
  }
  // prefix[a-b,c...]: the prefix followed by the first number (or range start), zero padding kept.
  const auto close = nodelist.find(']', bracket);
  if (close == std::string::npos) throw DistributedError("SLURM node list '" + nodelist + "' has an unclosed '['");
  auto inner = nodelist.substr(bracket + 1, close - bracket - 1);
  const auto stop = inner.find_first_of("-,");
  return nodelist.substr(0, bracket) + inner.substr(0, stop);
}

DistEnv resolve_env(const EnvOptions& options, const EnvLookup& lookup) {
  DistEnv env;
  const Scheme* scheme = nullptr;
  for (const auto& s : kSchemes) {
    if (lookup(s.rank) && lookup(s.world_size)) {
      scheme = &s;
      break;
    }
  }
  auto from_scheme = [&](const char* Scheme::*field) -> std::optional<int> {
    return scheme ? lookup_int(lookup, scheme->*field) : std::nullopt;
  };
  const auto rank = options.rank ? options.rank : from_scheme(&Scheme::rank);
  const auto world = options.world_size ? options.world_size : from_scheme(&Scheme::world_size);
  if (options.rank || options.world_size) {
    env.source = "explicit options";
  } else if (scheme) {
    env.source = scheme->source;
  }
  // Name the variables in errors, so the user knows what to fix.
  const bool explicit_layout = options.rank || options.world_size;
  const std::string rank_name = explicit_layout ? "the rank option" : scheme ? scheme->rank : "rank";
  const std::string world_name = explicit_layout ? "the world_size option" : scheme ? scheme->world_size : "world size";
  if (rank.has_value() != world.has_value()) {
    throw DistributedError(fmt::format("{} set {} but not {}; set both (or neither, for a single process)", env.source,
                                       rank ? rank_name : world_name, rank ? world_name : rank_name));
  }
  env.rank = rank.value_or(0);
  env.world_size = world.value_or(1);
  if (env.world_size < 1) throw DistributedError(fmt::format("{}={} must be >= 1", world_name, env.world_size));
  if (env.rank < 0 || env.rank >= env.world_size) {
    throw DistributedError(fmt::format("{}={} is out of range for {}={} (need 0 <= rank < world size)", rank_name,
                                       env.rank, world_name, env.world_size));
  }

  // Local layout; without it, assume every rank is on this node.
  const auto local_world = options.local_world_size ? options.local_world_size : from_scheme(&Scheme::local_world_size);
  const auto local_rank = options.local_rank ? options.local_rank : from_scheme(&Scheme::local_rank);
  env.local_world_size = local_world.value_or(env.world_size);
  env.local_rank =
      local_rank.value_or(env.local_world_size == env.world_size ? env.rank : env.rank % env.local_world_size);
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    throw DistributedError(fmt::format("{}: local world size {} must be in [1, world size {}]", env.source,
                                       env.local_world_size, env.world_size));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    throw DistributedError(fmt::format("{}: local rank {} is out of range for local world size {}", env.source,
                                       env.local_rank, env.local_world_size));
  }

  // Master address: explicit, MASTER_ADDR, SLURM's first node, or loopback when the job is on one node.
  if (options.master_addr) {
    env.master_addr = *options.master_addr;
  } else if (auto addr = lookup("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
  } else if (auto nodes = lookup("SLURM_JOB_NODELIST") ? lookup("SLURM_JOB_NODELIST") : lookup("SLURM_NODELIST");
             scheme && std::string(scheme->source) == "SLURM" && nodes) {
    env.master_addr = first_slurm_host(*nodes);
  } else if (env.local_world_size < env.world_size) {
    throw DistributedError(
        fmt::format("{}: the job spans several nodes ({} of {} ranks are local) but no master "
                    "address is known; set MASTER_ADDR to the host of rank 0",
                    env.source, env.local_world_size, env.world_size));
  }
  if (options.master_port) {
    env.master_port = *options.master_port;
  } else if (auto port = lookup_int(lookup, "MASTER_PORT")) {
    env.master_port = *port;
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    throw DistributedError(fmt::format("master port {} is not a TCP port (1-65535)", env.master_port));
  }
  return env;
}

}  // namespace fastlearn
