#include <fastlearn/distributed/distrib_ctx.h>

#include <fastlearn/distributed/distributed_trainer.h>

namespace fastlearn {

DistribCtx::DistribCtx(const SetupOptions& options) {
  if (is_initialized()) {
    owns_ = detail::adopt_implicit_setup();
    active_ = world_size() > 1;
    return;
  }
  const bool explicit_world = options.env.world_size.has_value();
  if (resolve_env(options.env).world_size == 1 && !explicit_world) return;
  setup_distrib(options);
  owns_ = true;
  active_ = world_size() > 1;
}

DistribCtx::DistribCtx(Learner& learn) : DistribCtx(learn, DistributedTrainerOptions{}) {}

DistribCtx::DistribCtx(Learner& learn, const DistributedTrainerOptions& trainer, const SetupOptions& options)
    : DistribCtx(options) {
  try {
    if (active_) {
      to_distributed(learn, trainer);
      learn_ = &learn;
    }
  } catch (...) {
    if (owns_) teardown_distrib();
    throw;
  }
}

DistribCtx::~DistribCtx() {
  if (learn_) detach_distributed(*learn_);
  if (owns_) teardown_distrib();
}

}  // namespace fastlearn
