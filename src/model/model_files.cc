#include "model/model_files.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/file.h"
#include "model/gguf.h"
#include "model/gguf_mmproj.h"
#include "model/safetensors.h"
#include "model/tokenizer_gguf.h"

namespace crescent::model {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// `gguf`: the model's GGUF file, whose embedded tokenizer is the fallback (null for a checkout).
Status find_tokenizer(const fs::path& dir, const GgufFile* gguf, ModelFiles& files) {
  files.directory = dir.string();
  const fs::path tok = dir / "tokenizer.json";
  if (!is_file(tok) && gguf != nullptr) {
    if (!gguf_has_tokenizer(*gguf)) {
      return not_found(gguf->path() + " has no tokenizer metadata and " + tok.string() +
                       " is missing: put the model's Hugging Face tokenizer.json beside it");
    }
    files.tokenizer_gguf_path = gguf->path();
    return Status::ok();
  }
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

void find_preprocessor_config(const fs::path& dir, ModelFiles& files) {
  if (is_file(dir / "preprocessor_config.json"))
    files.preprocessor_config_path = (dir / "preprocessor_config.json").string();
}

// llama.cpp names the vision tower of a GGUF model mmproj-<model>-<type>.gguf.
bool is_mmproj_name(const fs::path& p) {
  return p.extension() == ".gguf" && p.filename().string().rfind("mmproj", 0) == 0;
}

Result<fs::path> find_mmproj(const fs::path& model_path, const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_mmproj_name(entry.path()) && is_file(entry.path()))
      found.push_back(entry.path());
  }
  if (found.size() == 1)
    return found[0];
  if (found.empty()) {
    return not_found(model_path.string() +
                     " is a vision-language model: its vision tower is missing (pass the " +
                     "mmproj .gguf, or put one named mmproj*.gguf beside it)");
  }
  return invalid_argument(dir.string() + " holds several mmproj*.gguf files: pass the one to use");
}

Result<ModelFiles> open_gguf(const fs::path& path, const std::string& mmproj_path) {
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
  if (files.config.is_multimodal()) {
    fs::path mmproj(mmproj_path);
    if (mmproj.empty()) {
      ASSIGN_OR_RETURN(mmproj, find_mmproj(path, dir));
    }
    VisionConfig vision;
    Result<std::unique_ptr<TensorSource>> tower = open_mmproj(mmproj.string(), &vision);
    if (!tower.is_ok())
      return tower.status().with_context("vision tower of " + path.string());
    if (vision.out_hidden_size != files.config.hidden_size) {
      return invalid_argument(mmproj.string() + ": the vision tower projects to " +
                              std::to_string(vision.out_hidden_size) + " values, but " +
                              path.string() + " has hidden_size " +
                              std::to_string(files.config.hidden_size));
    }
    // The LLM GGUF is the same for both; the projector type tells them apart.
    files.config.architecture = vision.architecture == VisionArchitecture::kQwen25Vl
                                    ? Architecture::kQwen25Vl
                                    : Architecture::kQwen2Vl;
    files.config.architecture_name = std::string(architecture_name(files.config.architecture));
    files.config.vision = std::move(vision);
    files.vision_tensors = std::move(tower).value();
  } else if (!mmproj_path.empty()) {
    return invalid_argument(path.string() + " is a text-only model; the mmproj file " +
                            mmproj_path + " does not apply to it");
  }
  RETURN_IF_ERROR(find_tokenizer(dir, gguf.get(), files));
  find_preprocessor_config(dir, files);
  files.tensors = std::move(gguf);
  return files;
}

// The .gguf files in `dir` that may hold a language model (mmproj*.gguf left out).
std::vector<fs::path> model_ggufs_in(const fs::path& dir) {
  std::vector<fs::path> ggufs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".gguf" && !is_mmproj_name(entry.path()) &&
        is_file(entry.path())) {
      ggufs.push_back(entry.path());
    }
  }
  return ggufs;
}

// The tokenizer `files` names, with `gguf` the open file of files.tokenizer_gguf_path (if any).
Result<std::unique_ptr<Tokenizer>> tokenizer_of(const ModelFiles& files, const GgufFile* gguf,
                                                TokenizerConfig* gguf_config) {
  if (files.tokenizer_gguf_path.empty())
    return Tokenizer::from_file(files.tokenizer_json_path);
  ASSIGN_OR_RETURN(GgufTokenizer t, tokenizer_from_gguf(*gguf));
  if (gguf_config != nullptr)
    *gguf_config = std::move(t.config);
  return std::move(t.tokenizer);
}

Result<std::unique_ptr<TensorSource>> open_safetensors(const fs::path& single,
                                                       const fs::path& index) {
  if (is_file(single)) {
    ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> source, SafetensorsFile::open(single.string()));
    return source;
  }
  return open_sharded_safetensors(index.string());
}

}  // namespace

Result<ModelFiles> open_model(const std::string& path_text, const std::string& mmproj_path) {
  const fs::path path(path_text);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return not_found(path_text + ": no such file or directory");
  if (!mmproj_path.empty() && !fs::exists(mmproj_path, ec))
    return not_found(mmproj_path + ": no such file");
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".gguf")
      return open_gguf(path, mmproj_path);
    return invalid_argument(path_text + ": expected a model directory or a .gguf file");
  }

  const fs::path single = path / "model.safetensors";
  const fs::path index = path / "model.safetensors.index.json";
  if (!is_file(single) && !is_file(index)) {
    const std::vector<fs::path> ggufs = model_ggufs_in(path);
    if (ggufs.size() == 1)
      return open_gguf(ggufs[0], mmproj_path);
    if (ggufs.size() > 1) {
      return invalid_argument(path_text + " holds several .gguf files and no safetensors: " +
                              "pass the .gguf file to use");
    }
    return not_found(path_text + " holds no model.safetensors, model.safetensors.index.json " +
                     "or .gguf file");
  }

  ModelFiles files;
  const fs::path config_path = path / "config.json";
  ASSIGN_OR_RETURN(std::string config_text, read_file(config_path.string()));
  Result<ModelConfig> config = parse_model_config(config_text);
  if (!config.is_ok())
    return config.status().with_context(config_path.string());
  files.config = std::move(config).value();
  if (!mmproj_path.empty()) {
    return invalid_argument(path_text + " is a Hugging Face checkout" +
                            (files.config.vision ? " with its own vision tower" : "") +
                            ": an mmproj file only goes with a GGUF model");
  }
  if (files.config.is_multimodal() && !files.config.vision) {
    return invalid_argument(config_path.string() +
                            " sets M-RoPE sections but has no vision_config");
  }
  ASSIGN_OR_RETURN(files.tensors, open_safetensors(single, index));
  if (files.config.vision) {
    // A second handle: the same mapped files, owned separately from `tensors`.
    ASSIGN_OR_RETURN(files.vision_tensors, open_safetensors(single, index));
    constexpr const char* kPatchEmbed = "visual.patch_embed.proj.weight";
    if (files.vision_tensors->get(kPatchEmbed).status().code() == StatusCode::kNotFound) {
      return not_found(path_text + ": config.json has a vision_config but the weights hold no " +
                       kPatchEmbed);
    }
  }
  RETURN_IF_ERROR(find_tokenizer(path, nullptr, files));
  find_preprocessor_config(path, files);
  files.name = fs::absolute(path, ec).lexically_normal().filename().string();
  if (files.name.empty())
    files.name = fs::absolute(path, ec).lexically_normal().parent_path().filename().string();
  return files;
}

Result<std::unique_ptr<Tokenizer>> open_tokenizer(const ModelFiles& files,
                                                  TokenizerConfig* gguf_config) {
  std::unique_ptr<GgufFile> gguf;
  if (!files.tokenizer_gguf_path.empty()) {
    ASSIGN_OR_RETURN(gguf, GgufFile::open(files.tokenizer_gguf_path));
  }
  return tokenizer_of(files, gguf.get(), gguf_config);
}

Result<std::unique_ptr<Tokenizer>> open_tokenizer(const std::string& path_text) {
  const fs::path path(path_text);
  std::error_code ec;
  if (is_file(path) && path.extension() != ".gguf")
    return Tokenizer::from_file(path_text);
  fs::path gguf_path;
  if (fs::is_directory(path, ec)) {
    if (is_file(path / "tokenizer.json"))
      return Tokenizer::from_file((path / "tokenizer.json").string());
    const std::vector<fs::path> ggufs = model_ggufs_in(path);
    if (ggufs.size() > 1) {
      return invalid_argument(path_text + " holds several .gguf files and no tokenizer.json: " +
                              "pass the .gguf file to use");
    }
    if (ggufs.empty())
      return not_found(path_text + " holds no tokenizer.json and no .gguf file");
    gguf_path = ggufs[0];
  } else if (is_file(path)) {
    gguf_path = path;
  } else {
    return not_found(path_text + ": no such file or directory");
  }
  ModelFiles files;
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::open(gguf_path.string()));
  fs::path dir = gguf_path.parent_path();
  if (dir.empty())
    dir = ".";
  RETURN_IF_ERROR(find_tokenizer(dir, gguf.get(), files));
  return tokenizer_of(files, gguf.get(), nullptr);
}

}  // namespace crescent::model
