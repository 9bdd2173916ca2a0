#include <fastlearn/distributed/distrib_ctx.h>

namespace fastlearn {

DistribCtx::DistribCtx(const SetupOptions& options) : uncaught_at_start_(std::uncaught_exceptions()) {
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
  if (!owns_) return;
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    abort_distrib();
  } else {
    teardown_distrib();
  }
}

}  // namespace fastlearn
