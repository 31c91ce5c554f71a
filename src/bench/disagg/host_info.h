#pragma once
// What the disaggregation benchmarks read about this host and its processes: the load average
// and usable cores printed beside every figure (these machines are shared), child logs, and a
// process's minor page faults (to show where a copy faults).

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace crescent::bench {

// "1.23 4.56 7.89" from /proc/loadavg.
std::string load_average();

// The cores this process may run on (its affinity mask), at least 1.
int num_usable_cores();

// The whole file, or "" when it cannot be read.
std::string read_text_file(const std::string& path);

// The last `num_lines` lines of `text` (all of it when shorter), for error messages.
std::string tail_lines(const std::string& text, int num_lines);

// Minor page faults of `pid` so far (/proc/PID/stat field 10); -1 when unreadable.
int64_t minor_page_faults(pid_t pid);

}  // namespace crescent::bench
