#include "model/quantize.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "core/file.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_files.h"

namespace crescent::model {

namespace fs = std::filesystem;

namespace {

// Keys that describe the file being written rather than the model; general.alignment is set by
// the writer itself.
bool is_per_file_key(const std::string& key) {
  return key == "general.file_type" || key == "general.quantization_version" ||
         key == "general.alignment";
}

Status write(const ModelFiles& files, const QuantizeOptions& o, const std::string& path) {
  if (const auto* gguf = dynamic_cast<const GgufFile*>(files.tensors.get())) {
    GgufWriter w(path);
    for (const GgufFile::RawMetadata& e : gguf->raw_metadata()) {
      if (!is_per_file_key(e.key))
        w.set_raw(e.key, e.type_and_value);
    }
    w.set_u32("general.file_type", gguf_file_type(o.type));
    w.set_u32("general.quantization_version", 2);
    return write_gguf_tensors(w, files.config, *gguf, o.type, o.progress);
  }
  ASSIGN_OR_RETURN(std::string tokenizer_json, read_file(files.tokenizer_json_path));
  std::string chat_template;
  if (!files.tokenizer_config_path.empty()) {
    ASSIGN_OR_RETURN(TokenizerConfig config,
                     TokenizerConfig::from_file(files.tokenizer_config_path));
    chat_template = config.chat_template;
  }
  return write_gguf(path, files.config, *files.tensors, o.type, tokenizer_json, files.name,
                    chat_template, o.progress);
}

}  // namespace

Status quantize_model(const QuantizeOptions& o) {
  if (o.input.empty() || o.output.empty())
    return invalid_argument("quantize needs an input model and an output file");
  std::error_code ec;
  if (fs::exists(o.output, ec)) {
    if (fs::equivalent(o.input, o.output, ec))
      return invalid_argument(o.output + " is the input: write the quantised model elsewhere");
    if (fs::is_directory(o.output, ec))
      return invalid_argument(o.output + " is a directory: the output is a .gguf file");
    if (!o.overwrite)
      return already_exists(o.output + " exists (pass --force to overwrite it)");
  }
  Result<ModelFiles> files = open_model(o.input);
  if (!files.is_ok())
    return files.status().with_context("cannot read the input model");

  // Written beside the output, then renamed: a failed or interrupted run leaves no output.
  const std::string tmp = o.output + ".tmp." + std::to_string(::getpid());
  Status s = write(*files, o, tmp);
  if (s.is_ok()) {
    fs::rename(tmp, o.output, ec);
    if (ec)
      s = invalid_argument("cannot rename " + tmp + " to " + o.output + ": " + ec.message());
  }
  if (!s.is_ok())
    fs::remove(tmp, ec);
  return s;
}

}  // namespace crescent::model
