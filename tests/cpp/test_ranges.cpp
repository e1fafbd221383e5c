// Key-range helpers (ranges.h) against hand-computed cases, including zigzag CP with cp = 2 and 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "flashdsa/ranges.h"

namespace {

using flashdsa::Status;
using flashdsa::StatusCode;
using Rows = std::vector<int32_t>;

void expect_invalid(const Status& st, const std::string& field) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(field), std::string::npos) << "message should name " << field << ": " << st.message();
}

TEST(Ranges, BuildKeyRangesThd) {
  const int32_t cu[] = {0, 3, 3, 5};  // lengths 3, 0, 2
  Rows ks(5), ke(5);
  ASSERT_TRUE(flashdsa::build_key_ranges(cu, 3, ks.data(), ke.data()).ok());
  EXPECT_EQ(ks, (Rows{0, 0, 0, 3, 3}));
  EXPECT_EQ(ke, (Rows{1, 2, 3, 4, 5}));
}

TEST(Ranges, CheckCuSeqlens) {
  const int32_t good[] = {0, 4, 4, 9};
  EXPECT_TRUE(flashdsa::check_cu_seqlens(good, 3, 9).ok());
  EXPECT_TRUE(flashdsa::check_cu_seqlens(good, 0, 0).ok());
  const int32_t bad_first[] = {1, 4};
  expect_invalid(flashdsa::check_cu_seqlens(bad_first, 1, 4), "cu_seqlens[0]");
  const int32_t decreasing[] = {0, 5, 3, 9};
  expect_invalid(flashdsa::check_cu_seqlens(decreasing, 3, 9), "cu_seqlens[2]");
  expect_invalid(flashdsa::check_cu_seqlens(good, 3, 10), "cu_seqlens[3]");
  expect_invalid(flashdsa::check_cu_seqlens(nullptr, 1, 0), "cu_seqlens");
  expect_invalid(flashdsa::check_cu_seqlens(good, -1, 0), "B");
  Rows ks(9), ke(9);
  expect_invalid(flashdsa::build_key_ranges(decreasing, 3, ks.data(), ke.data()), "cu_seqlens[2]");
}

TEST(Ranges, ZigzagCp2) {
  const int32_t cu[] = {0, 8, 16};  // two sequences of 8: chunks of 2 tokens
  EXPECT_EQ(flashdsa::cp_local_tokens(cu, 2, 2), 8);
  Rows rank0(8), rank1(8);
  ASSERT_TRUE(flashdsa::build_cp_zigzag_rows(cu, 2, 2, 0, rank0.data()).ok());
  ASSERT_TRUE(flashdsa::build_cp_zigzag_rows(cu, 2, 2, 1, rank1.data()).ok());
  EXPECT_EQ(rank0, (Rows{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(rank1, (Rows{2, 3, 4, 5, 10, 11, 12, 13}));

  Rows ks(8), ke(8);
  ASSERT_TRUE(flashdsa::build_key_ranges_for_rows(cu, 2, rank0.data(), 8, ks.data(), ke.data()).ok());
  EXPECT_EQ(ks, (Rows{0, 0, 0, 0, 8, 8, 8, 8}));
  EXPECT_EQ(ke, (Rows{1, 2, 7, 8, 9, 10, 15, 16}));
  ASSERT_TRUE(flashdsa::build_key_ranges_for_rows(cu, 2, rank1.data(), 8, ks.data(), ke.data()).ok());
  EXPECT_EQ(ks, (Rows{0, 0, 0, 0, 8, 8, 8, 8}));
  EXPECT_EQ(ke, (Rows{3, 4, 5, 6, 11, 12, 13, 14}));
}

TEST(Ranges, ZigzagCp4CoversEveryRowOnce) {
  const int32_t cu[] = {0, 16};  // chunks of 2 tokens
  EXPECT_EQ(flashdsa::cp_local_tokens(cu, 1, 4), 4);
  const std::vector<Rows> expected{{0, 1, 14, 15}, {2, 3, 12, 13}, {4, 5, 10, 11}, {6, 7, 8, 9}};
  Rows all;
  for (int rank = 0; rank < 4; ++rank) {
    Rows rows(4);
    ASSERT_TRUE(flashdsa::build_cp_zigzag_rows(cu, 1, 4, rank, rows.data()).ok());
    EXPECT_EQ(rows, expected[rank]) << "rank " << rank;
    all.insert(all.end(), rows.begin(), rows.end());
  }
  std::sort(all.begin(), all.end());
  for (int32_t i = 0; i < 16; ++i) EXPECT_EQ(all[i], i);

  Rows ks(4), ke(4);
  ASSERT_TRUE(flashdsa::build_key_ranges_for_rows(cu, 1, expected[1].data(), 4, ks.data(), ke.data()).ok());
  EXPECT_EQ(ks, (Rows{0, 0, 0, 0}));
  EXPECT_EQ(ke, (Rows{3, 4, 13, 14}));
}

TEST(Ranges, ZigzagWithEmptyAndUnevenSequences) {
  const int32_t cu[] = {0, 0, 4, 12};  // lengths 0, 4, 8 with cp = 2: chunks of 0, 1, 2
  Rows rank1(6);
  ASSERT_TRUE(flashdsa::build_cp_zigzag_rows(cu, 3, 2, 1, rank1.data()).ok());
  EXPECT_EQ(rank1, (Rows{1, 2, 6, 7, 8, 9}));
  Rows ks(6), ke(6);
  ASSERT_TRUE(flashdsa::build_key_ranges_for_rows(cu, 3, rank1.data(), 6, ks.data(), ke.data()).ok());
  EXPECT_EQ(ks, (Rows{0, 0, 4, 4, 4, 4}));
  EXPECT_EQ(ke, (Rows{2, 3, 7, 8, 9, 10}));
}

TEST(Ranges, BadCpArguments) {
  const int32_t cu[] = {0, 8};
  Rows rows(8);
  expect_invalid(flashdsa::build_cp_zigzag_rows(cu, 1, 0, 0, rows.data()), "cp_size");
  expect_invalid(flashdsa::build_cp_zigzag_rows(cu, 1, 2, 2, rows.data()), "cp_rank");
  expect_invalid(flashdsa::build_cp_zigzag_rows(cu, 1, 2, -1, rows.data()), "cp_rank");
  const int32_t uneven[] = {0, 6};  // 6 is not a multiple of 2 * cp = 4
  expect_invalid(flashdsa::build_cp_zigzag_rows(uneven, 1, 2, 0, rows.data()), "cu_seqlens_padded");
  EXPECT_EQ(flashdsa::cp_local_tokens(uneven, 1, 2), -1);
  EXPECT_EQ(flashdsa::cp_local_tokens(cu, 1, 0), -1);

  Rows ks(2), ke(2);
  const Rows out_of_range{3, 8};
  expect_invalid(flashdsa::build_key_ranges_for_rows(cu, 1, out_of_range.data(), 2, ks.data(), ke.data()),
                 "global_rows[1]");
  expect_invalid(flashdsa::build_key_ranges_for_rows(cu, 1, out_of_range.data(), -1, ks.data(), ke.data()),
                 "T_local");
}

}  // namespace
