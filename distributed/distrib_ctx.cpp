#include <fastlearn/distributed/distrib_ctx.h>

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

DistribCtx::~DistribCtx() {
  if (detach_learner_) detach_learner_();
  if (owns_) teardown_distrib();
}

}  // namespace fastlearn
