#pragma once
// Metrics of multi-label classification (fastai's accuracy_multi and FBetaMulti): the model gives one
// logit per class, the targets are multi-hot rows; a class is predicted when sigmoid(logit) >= thresh.
#include <fastlearn/learner/metrics.h>

namespace fastlearn {

/// Fraction of (item, class) pairs predicted right; "accuracy_multi".
MetricPtr accuracy_multi(double thresh = 0.5);

/// F-beta over the whole set: per item, then averaged ("samples", sklearn's average='samples'), or per
/// class, then averaged ("macro"); a zero denominator scores 0. "fbeta_multi". beta > 0.
MetricPtr fbeta_multi(double beta = 2.0, double thresh = 0.5, const std::string& average = "samples");

}  // namespace fastlearn
