// One self-contained HTML report: inline CSS and inline SVG, no scripts, no external resources, so it can be
// mailed, archived next to the records database or opened offline. Tables carry id="table-<name>" and each
// cell data-col="<column>" so that tests (and people's scripts) can find a figure by name.
#pragma once

#include <string>

#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"
#include "fl/report/plots.h"

namespace fl::report {

std::string HtmlReport(const ExperimentData& data, const Analysis& analysis, const TimelineOptions& timeline = {});

}  // namespace fl::report
