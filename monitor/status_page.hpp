// The status page an operator reads at a glance (`/`), and the full per-source
// table (`/sources`). Both are made from the same counter sums as the metrics, the
// control state and the distinct-error log; no external assets, and the plots of
// the last minutes are drawn by the page itself from numbers it carries. At 1600
// sources the main page lists only the sources that need a look (absent, silent,
// missing most), so it stays small and cheap to serve.
#pragma once

#include <string>
#include <string_view>

#include "monitor/exporter.hpp"

namespace evb::monitor {

std::string status_page(const Sources& s);
std::string sources_page(const Sources& s);

std::string html_escape(std::string_view in);

}  // namespace evb::monitor
