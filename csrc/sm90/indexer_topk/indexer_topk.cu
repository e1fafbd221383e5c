// Placeholder until the fused indexer + top-k kernel lands (issue: lightning indexer kernel).
#include "sm90/sm90_backend.h"

namespace flashdsa::sm90 {
Status indexer_topk(const IndexerTopkParams&) { return Status::NotSupported("sm90 indexer_topk: kernel not implemented yet"); }
size_t indexer_topk_workspace_size(const IndexerTopkParams&) { return 0; }
}  // namespace flashdsa::sm90
