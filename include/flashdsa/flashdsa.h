// FlashDSA public C++ API: include this one header.
#pragma once

#include "flashdsa/ops.h"
#include "flashdsa/ranges.h"
#include "flashdsa/status.h"
#include "flashdsa/threads.h"
#include "flashdsa/types.h"
