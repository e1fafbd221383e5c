// Which ops the sm90 backend implements in this build. An op is listed only once its kernel has
// passed the GPU tests (tests/python on CUDA tensors, compute-sanitizer) on an H200.
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {

bool implements(OpKind op) {
  switch (op) {
    case OpKind::kSparseMlaFwd:
    case OpKind::kSparseMlaBwd:
    case OpKind::kAttentionMass:
    case OpKind::kSparseKlFwd:
    case OpKind::kSparseKlBwd:
    case OpKind::kDenseKlFwd:
    case OpKind::kDenseKlBwd:
    case OpKind::kIndexerTopk:
      return true;
  }
  return false;
}

}  // namespace flashdsa::sm90
