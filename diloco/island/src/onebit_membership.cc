#include "fl/diloco/island/onebit_membership.h"

#include <algorithm>
#include <string>
#include <vector>

namespace fl::diloco {

absl::Status FoldResidualsIntoMomentum(RingAllReduce& ring, uint64_t exchange_id, OneBitAdam& adam,
                                       ExchangeStats* stats) {
  std::vector<float> residual(adam.size(), 0.0f);
  if (std::span<const float> r = ring.Residual(kOneBitMomentumKey); r.size() == residual.size()) {
    std::copy(r.begin(), r.end(), residual.begin());
  }
  // Exact: the fold must deliver the residual mass as it is, so it travels in fp32 (the ring's sum order is
  // the same on every member, and the all-gather hands every member the same bits).
  const std::string codec = ring.options().codec;
  if (absl::Status s = ring.SetCodec("fp32"); !s.ok()) return s;
  std::vector<float> mean(residual.size());
  absl::Status s = ring.AllReduce(exchange_id, kOneBitFoldKey, std::span<const float>(residual), std::span<float>(mean),
                                  ReduceOp::kMean, stats);
  if (absl::Status back = ring.SetCodec(codec); !back.ok()) return back;
  if (!s.ok()) return s;
  if (absl::Status folded = adam.FoldIntoMomentum(mean); !folded.ok()) return folded;
  ring.ResetResidual(kOneBitMomentumKey);
  ring.ResetResidual(kOneBitGradientKey);
  return absl::OkStatus();
}

}  // namespace fl::diloco
