// The report's tests run fl-report with fl::testing::RunTool (testing/include/fl/testing/run_tool.h), by these names.
#pragma once

#include "fl/testing/run_tool.h"

namespace fl::report::testing {

using fl::testing::ReadAll;
using fl::testing::RunTool;
using fl::testing::ToolResult;

}  // namespace fl::report::testing
