#pragma once
// A server's /metrics (Prometheus text exposition) as the disaggregation benchmark reads it:
// each sample line's series ("name" or "name{labels}") and value. Comments and lines without a
// number are skipped; nothing else is validated (promtool does that in the server's tests).

#include <map>
#include <string>

namespace crescent::bench {

using Scrape = std::map<std::string, double>;

Scrape parse_prometheus_text(const std::string& text);

// The first series named exactly `name` whose labels contain `label` (e.g. role="decode"); with
// an empty `label`, the unlabelled series, or else the first labelled one. 0 when there is none.
double scrape_value(const Scrape& scrape, const std::string& name, const std::string& label = "");

}  // namespace crescent::bench
