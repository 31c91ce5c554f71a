#include "bench/disagg/host_info.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace crescent::bench {

std::string load_average() {
  std::string s = read_text_file("/proc/loadavg");
  // "1.23 4.56 7.89 3/456 789": the three averages.
  size_t end = 0;
  for (int i = 0; i < 3 && end != std::string::npos; ++i) {
    end = s.find(' ', end + 1);
  }
  return end == std::string::npos ? s : s.substr(0, end);
}

int num_usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail_lines(const std::string& text, int num_lines) {
  if (num_lines <= 0) {
    return "";
  }
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') {
    --pos;  // the last line's own newline
  }
  for (int i = 0; i < num_lines; ++i) {
    size_t nl = pos == 0 ? std::string::npos : text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      return text;
    }
    pos = nl;
  }
  return text.substr(pos + 1);
}

int64_t minor_page_faults(pid_t pid) {
  std::string stat = read_text_file("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return -1;
  }
  std::istringstream in(stat.substr(paren + 1));
  std::string field;
  // After "(comm)": state ppid pgrp session tty_nr tpgid flags minflt.
  for (int i = 0; i < 8; ++i) {
    in >> field;
  }
  return in ? std::strtoll(field.c_str(), nullptr, 10) : -1;
}

}  // namespace crescent::bench
