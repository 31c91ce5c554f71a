#pragma once
// Whole-file reads of the text files a model brings (tokenizer.json, chat templates, config.json,
// safetensors indexes).

#include <string>

#include "core/status.h"

namespace crescent {

// The bytes of the file at `path`. A regular file is read into one buffer sized from its length
// (a tokenizer.json runs to 11 MB; copying it through a string stream grew a buffer by doubling
// and copied it out once more); files whose length the kernel does not report (/proc, pipes) are
// read to their end as well. Errors name the path and the system's reason: kNotFound when it
// cannot be opened, kDataLoss when a read fails (a directory, an I/O error).
Result<std::string> read_file(const std::string& path);

}  // namespace crescent
