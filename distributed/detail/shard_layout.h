#pragma once
// How the ranks of a sharded run split a gradient bucket (ZeRO stages 1 and 2, issue 64): the bucket's flat elements
// (its parameters end to end, in bucket order) padded to a multiple of the world size, rank r owning the r-th of
// equal contiguous parts. A parameter may straddle two ranks (as in DeepSpeed's ZeRO), so the ranks' parts stay
// even whatever the parameter sizes, and reduce_scatter / all_gather_into move whole parts. For each rank, the
// pieces of parameters its part holds: which parameter, where in it, where in the part.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastlearn {

/// A run of one parameter's elements inside one rank's part.
struct ParamPiece {
  std::size_t param = 0;           ///< the parameter's index among the bucket's (bucket order)
  std::int64_t param_offset = 0;   ///< its first element within the parameter (flat, in its memory order)
  std::int64_t bucket_offset = 0;  ///< that element's position in the bucket
  std::int64_t part_offset = 0;    ///< and in the rank's part
  std::int64_t numel = 0;
  bool operator==(const ParamPiece&) const = default;
};

struct ShardedBucket {
  std::int64_t numel = 0;                       ///< the parameters' elements
  std::int64_t padded = 0;                      ///< numel rounded up to a multiple of the world size
  std::int64_t part = 0;                        ///< padded / world size: every rank's part
  std::vector<std::int64_t> param_offsets;      ///< where each parameter starts in the bucket
  std::vector<std::vector<ParamPiece>> pieces;  ///< per rank, in bucket order; padding belongs to no parameter
};

/// The layout of a bucket of parameters of `numels` elements (bucket order) over `world_size` ranks. ConfigError
/// for a world size below 1 or a negative size.
ShardedBucket shard_bucket(const std::vector<std::int64_t>& numels, int world_size);

}  // namespace fastlearn
