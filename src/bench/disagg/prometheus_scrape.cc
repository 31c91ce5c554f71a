#include "bench/disagg/prometheus_scrape.h"

#include <cstdlib>
#include <sstream>

namespace crescent::bench {

Scrape parse_prometheus_text(const std::string& text) {
  Scrape out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) {
      continue;
    }
    char* end = nullptr;
    double v = std::strtod(line.c_str() + sp + 1, &end);
    if (end != line.c_str() + sp + 1) {
      out[line.substr(0, sp)] = v;
    }
  }
  return out;
}

double scrape_value(const Scrape& scrape, const std::string& name, const std::string& label) {
  for (auto it = scrape.lower_bound(name); it != scrape.end(); ++it) {
    const std::string& key = it->first;
    if (key.compare(0, name.size(), name) != 0) {
      break;
    }
    bool is_exact = key.size() == name.size();
    bool has_labels = key.size() > name.size() && key[name.size()] == '{';
    if ((is_exact && label.empty()) || (has_labels && key.find(label) != std::string::npos)) {
      return it->second;
    }
  }
  return 0;
}

}  // namespace crescent::bench
