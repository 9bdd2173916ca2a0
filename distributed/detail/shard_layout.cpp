#include <fastlearn/distributed/detail/shard_layout.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>

#include <algorithm>

namespace fastlearn {

ShardedBucket shard_bucket(const std::vector<std::int64_t>& numels, int world_size) {
  if (world_size < 1) throw ConfigError(fmt::format("shard_bucket: {} ranks; need at least 1", world_size));
  ShardedBucket out;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0) throw ConfigError(fmt::format("shard_bucket: parameter {} has {} elements", i, numels[i]));
    out.param_offsets.push_back(out.numel);
    out.numel += numels[i];
  }
  out.padded = (out.numel + world_size - 1) / world_size * world_size;
  out.part = out.padded / world_size;
  out.pieces.resize(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::int64_t begin = r * out.part, end = std::min(begin + out.part, out.numel);
    for (std::size_t i = 0; i < numels.size() && begin < end; ++i) {
      const std::int64_t first = std::max(begin, out.param_offsets[i]);
      const std::int64_t last = std::min(end, out.param_offsets[i] + numels[i]);
      if (first >= last) continue;
      out.pieces[static_cast<std::size_t>(r)].push_back({.param = i,
                                                         .param_offset = first - out.param_offsets[i],
                                                         .bucket_offset = first,
                                                         .part_offset = first - begin,
                                                         .numel = last - first});
    }
  }
  return out;
}

}  // namespace fastlearn
