#include "model/model_files.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "model/gguf.h"
#include "model/safetensors.h"

namespace crescent::model {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

Status find_tokenizer(const fs::path& dir, ModelFiles& files) {
  const fs::path tok = dir / "tokenizer.json";
  if (!is_file(tok)) {
    return not_found(tok.string() + " is missing: crescent needs the Hugging Face tokenizer.json " +
                     "beside the model weights");
  }
  files.tokenizer_json_path = tok.string();
  if (is_file(dir / "tokenizer_config.json")) {
    files.tokenizer_config_path = (dir / "tokenizer_config.json").string();
  }
  return Status::ok();
}

Result<ModelFiles> open_gguf(const fs::path& path) {
  ModelFiles files;
  ASSIGN_OR_RETURN(auto gguf, GgufFile::open(path.string()));
  ASSIGN_OR_RETURN(files.config, gguf->model_config());
  files.name = path.stem().string();
  if (gguf->has_key("general.name")) {
    ASSIGN_OR_RETURN(std::string name, gguf->get_string("general.name"));
    if (!name.empty())
      files.name = name;
  }
  fs::path dir = path.parent_path();
  if (dir.empty())
    dir = ".";
  RETURN_IF_ERROR(find_tokenizer(dir, files));
  files.tensors = std::move(gguf);
  return files;
}

}  // namespace

Result<ModelFiles> open_model(const std::string& path_text) {
  const fs::path path(path_text);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return not_found(path_text + ": no such file or directory");
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".gguf")
      return open_gguf(path);
    return invalid_argument(path_text + ": expected a model directory or a .gguf file");
  }

  const fs::path single = path / "model.safetensors";
  const fs::path index = path / "model.safetensors.index.json";
  if (!is_file(single) && !is_file(index)) {
    std::vector<fs::path> ggufs;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".gguf" && is_file(entry.path())) {
        ggufs.push_back(entry.path());
      }
    }
    if (ggufs.size() == 1)
      return open_gguf(ggufs[0]);
    if (ggufs.size() > 1) {
      return invalid_argument(path_text + " holds several .gguf files and no safetensors: " +
                              "pass the .gguf file to use");
    }
    return not_found(path_text + " holds no model.safetensors, model.safetensors.index.json " +
                     "or .gguf file");
  }

  ModelFiles files;
  const fs::path config_path = path / "config.json";
  ASSIGN_OR_RETURN(std::string config_text, read_file_to_string(config_path.string()));
  Result<ModelConfig> config = parse_model_config(config_text);
  if (!config.is_ok())
    return config.status().with_context(config_path.string());
  files.config = std::move(config).value();
  if (is_file(single)) {
    ASSIGN_OR_RETURN(files.tensors, SafetensorsFile::open(single.string()));
  } else {
    ASSIGN_OR_RETURN(files.tensors, open_sharded_safetensors(index.string()));
  }
  RETURN_IF_ERROR(find_tokenizer(path, files));
  files.name = fs::absolute(path, ec).lexically_normal().filename().string();
  if (files.name.empty())
    files.name = fs::absolute(path, ec).lexically_normal().parent_path().filename().string();
  return files;
}

}  // namespace crescent::model
