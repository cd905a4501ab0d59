// ferry-bench output: aligned text tables, the --json file and the --svg chart.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench.h"

namespace ferry::bench {

/// Print one table, aligned, with a title naming the daemon target and the baseline.
void PrintTable(std::ostream& out, const Context& ctx, const Table& table);

/// Write every table (with the samples' summaries), the machine, version, commit and date.
/// Return false (with a message on stderr) when the file cannot be written.
bool WriteJson(const std::string& path, const Context& ctx, const std::vector<Table>& tables);

/// Chart bandwidth against size from the transfers tables: each target's upload and
/// download through the daemon, and the in-process baseline's, on log-log axes.
bool WriteSvg(const std::string& path, const Context& ctx, const std::vector<Table>& tables);

}  // namespace ferry::bench
