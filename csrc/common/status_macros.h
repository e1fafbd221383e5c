// Internal: early return on a failed Status.
#pragma once

#include "flashdsa/status.h"

// Returns the Status of `expr` from the enclosing function unless it is OK.
#define FLASHDSA_RETURN_IF_ERROR(expr)  \
  do {                                  \
    ::flashdsa::Status _st = (expr);    \
    if (!_st.ok()) return _st;          \
  } while (0)
