#include "model/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/file.h"

namespace crescent::model {

using nlohmann::json;

namespace {

constexpr int64_t kMaxHeaderBytes = 100 << 20;  // the reference implementation's limit

// Element size of every dtype the format defines (0: unknown to us).
int64_t safetensors_element_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::optional<DType> supported_dtype(const std::string& dtype) {
  if (dtype == "F32")
    return DType::kF32;
  if (dtype == "F16")
    return DType::kF16;
  if (dtype == "BF16")
    return DType::kBF16;
  return std::nullopt;
}

Result<std::string> safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::string("F32");
    case DType::kF16:
      return std::string("F16");
    case DType::kBF16:
      return std::string("BF16");
    default:  // the GGUF block types
      break;
  }
  return invalid_argument("safetensors cannot store " + std::string(dtype_name(dtype)) +
                          " tensors");
}

Result<int64_t> checked_num_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return invalid_argument("negative dimension");
    if (d != 0 && n > (int64_t{1} << 50) / d)
      return invalid_argument("too many elements");
    n *= d;
  }
  return n;
}

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  auto corrupt = [&](const std::string& what) { return data_loss(path + ": " + what); };
  if (file->size() < 8)
    return corrupt("file too short for a safetensors header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > static_cast<uint64_t>(file->size() - 8)) {
    return corrupt("header length " + std::to_string(header_len) + " runs past the end of the " +
                   std::to_string(file->size()) + "-byte file");
  }
  if (header_len > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return corrupt("header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = file->size() - data_start;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(file->data()) + 8,
                         reinterpret_cast<const char*>(file->data()) + data_start);
  } catch (const json::exception& e) {
    return corrupt(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object())
    return corrupt("header is not a JSON object");

  auto result = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  result->file_ = file;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // relative [begin, end), for overlap checks
  std::vector<std::string> range_names;
  try {
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object())
          return corrupt("__metadata__ is not an object");
        for (const auto& [k, v] : value.items()) {
          if (!v.is_string())
            return corrupt("__metadata__." + k + " is not a string");
          result->metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& what) { return corrupt("tensor " + name + ": " + what); };
      if (!value.is_object())
        return bad("entry is not an object");
      auto dt = value.find("dtype");
      auto sh = value.find("shape");
      auto off = value.find("data_offsets");
      if (dt == value.end() || !dt->is_string())
        return bad("missing or non-string dtype");
      if (sh == value.end() || !sh->is_array())
        return bad("missing or non-list shape");
      if (off == value.end() || !off->is_array() || off->size() != 2 ||
          !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
        return bad("data_offsets must be two non-negative integers");
      }
      Entry e;
      e.dtype_name = dt->get<std::string>();
      e.dtype = supported_dtype(e.dtype_name);
      for (const auto& d : *sh) {
        if (!d.is_number_unsigned())
          return bad("shape must hold non-negative integers");
        e.shape.push_back(d.get<int64_t>());
      }
      Result<int64_t> num_elements = checked_num_elements(e.shape);
      if (!num_elements.is_ok())
        return bad("shape " + shape_to_string(e.shape) + " is too large");
      const auto begin = (*off)[0].get<uint64_t>();
      const auto end = (*off)[1].get<uint64_t>();
      if (begin > end) {
        return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] are reversed");
      }
      if (end > static_cast<uint64_t>(data_size)) {
        return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] run past the end of the data (" + std::to_string(data_size) +
                   " bytes): the file is truncated or corrupt");
      }
      if (int64_t elem = safetensors_element_bytes(e.dtype_name); elem > 0) {
        const int64_t expected = *num_elements * elem;
        if (static_cast<int64_t>(end - begin) != expected) {
          return bad("holds " + std::to_string(end - begin) + " bytes but " + e.dtype_name + " " +
                     shape_to_string(e.shape) + " needs " + std::to_string(expected));
        }
      }
      e.begin = data_start + static_cast<int64_t>(begin);
      e.end = data_start + static_cast<int64_t>(end);
      ranges.emplace_back(static_cast<int64_t>(begin), static_cast<int64_t>(end));
      range_names.push_back(name);
      result->entries_.emplace(name, std::move(e));
    }
  } catch (const json::exception& e) {
    return corrupt(std::string("malformed header: ") + e.what());
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second && cur.first != cur.second) {
      return corrupt("tensors " + range_names[order[i - 1]] + " and " + range_names[order[i]] +
                     " overlap");
    }
  }
  return result;
}

Result<TensorView> SafetensorsFile::get(const std::string& hf_name) const {
  auto it = entries_.find(hf_name);
  if (it == entries_.end())
    return not_found(path() + ": no tensor " + hf_name);
  const Entry& e = it->second;
  if (!e.dtype) {
    return unimplemented(path() + ": tensor " + hf_name + " has dtype " + e.dtype_name +
                         " (supported: F32, F16, BF16)");
  }
  TensorView v;
  v.name = hf_name;
  v.dtype = *e.dtype;
  v.shape = e.shape;
  v.data = file_->data() + e.begin;
  v.num_bytes = e.end - e.begin;
  return v;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_)
    out.push_back(name);
  return out;
}

namespace {

class ShardedSafetensors : public TensorSource {
 public:
  std::vector<std::unique_ptr<SafetensorsFile>> shards;
  std::map<std::string, const SafetensorsFile*> weight_map;

  Result<TensorView> get(const std::string& hf_name) const override {
    auto it = weight_map.find(hf_name);
    if (it == weight_map.end())
      return not_found("no tensor " + hf_name + " in the index");
    return it->second->get(hf_name);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, shard] : weight_map)
      out.push_back(name);
    return out;
  }
};

}  // namespace

Result<std::unique_ptr<TensorSource>> open_sharded_safetensors(const std::string& index_path) {
  ASSIGN_OR_RETURN(std::string text, read_file(index_path));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument(index_path + ": not valid JSON: " + e.what());
  }
  auto wm = index.find("weight_map");
  if (!index.is_object() || wm == index.end() || !wm->is_object()) {
    return invalid_argument(index_path + ": missing object 'weight_map'");
  }
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  auto source = std::make_unique<ShardedSafetensors>();
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string())
      return invalid_argument(index_path + ": weight_map." + name + " is not a string");
    auto shard_name = file.get<std::string>();
    if (shard_name.find('/') != std::string::npos || shard_name.empty() || shard_name == "..") {
      return invalid_argument(index_path + ": shard name '" + shard_name +
                              "' is not a plain file name");
    }
    auto it = by_file.find(shard_name);
    if (it == by_file.end()) {
      ASSIGN_OR_RETURN(auto shard, SafetensorsFile::open((dir / shard_name).string()));
      it = by_file.emplace(shard_name, shard.get()).first;
      source->shards.push_back(std::move(shard));
    }
    const auto names = it->second->names();
    if (!std::binary_search(names.begin(), names.end(), name)) {
      return data_loss(index_path + ": tensor " + name + " is listed in " + shard_name +
                       " but that file does not hold it");
    }
    source->weight_map[name] = it->second;
  }
  return std::unique_ptr<TensorSource>(std::move(source));
}

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {}
SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

Status SafetensorsWriter::add_tensor(const std::string& name, DType dtype,
                                     std::vector<int64_t> shape) {
  if (out_)
    return failed_precondition(path_ + ": add_tensor after write_header");
  RETURN_IF_ERROR(safetensors_dtype_name(dtype));
  if (name.empty() || name == "__metadata__")
    return invalid_argument("bad tensor name '" + name + "'");
  for (const auto& t : tensors_) {
    if (t.name == name)
      return invalid_argument(path_ + ": duplicate tensor " + name);
  }
  ASSIGN_OR_RETURN(int64_t n, checked_num_elements(shape));
  tensors_.push_back({name, dtype, std::move(shape), dtype_num_bytes(dtype, n)});
  return Status::ok();
}

Status SafetensorsWriter::write_header() {
  if (out_)
    return failed_precondition(path_ + ": header already written");
  json header = json::object();
  if (!metadata_.empty())
    header["__metadata__"] = metadata_;
  int64_t offset = 0;
  for (const auto& t : tensors_) {
    header[t.name] = {{"dtype", *safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.num_bytes}}};
    offset += t.num_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  ASSIGN_OR_RETURN(out_, FileWriter::create(path_));
  uint64_t len = text.size();
  RETURN_IF_ERROR(out_->write(&len, 8));
  RETURN_IF_ERROR(out_->write(text.data(), static_cast<int64_t>(text.size())));
  current_ = 0;
  current_written_ = 0;
  while (current_ < tensors_.size() && tensors_[current_].num_bytes == 0)
    ++current_;
  return Status::ok();
}

Status SafetensorsWriter::write_data(const void* data, int64_t num_bytes) {
  if (!out_)
    return failed_precondition(path_ + ": write_data before write_header");
  const auto* p = static_cast<const uint8_t*>(data);
  while (num_bytes > 0) {
    if (current_ >= tensors_.size()) {
      return invalid_argument(path_ + ": more data written than the declared tensors hold");
    }
    int64_t n = std::min(num_bytes, tensors_[current_].num_bytes - current_written_);
    RETURN_IF_ERROR(out_->write(p, n));
    p += n;
    num_bytes -= n;
    current_written_ += n;
    while (current_ < tensors_.size() && current_written_ == tensors_[current_].num_bytes) {
      ++current_;
      current_written_ = 0;
    }
  }
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (!out_)
    RETURN_IF_ERROR(write_header());
  if (current_ < tensors_.size()) {
    return failed_precondition(path_ + ": tensor " + tensors_[current_].name +
                               " was not written in full");
  }
  return out_->close();
}

Status write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer(path);
  for (const auto& [k, v] : metadata)
    writer.set_metadata(k, v);
  for (const auto& t : tensors)
    RETURN_IF_ERROR(writer.add_tensor(t.name, t.dtype, t.shape));
  RETURN_IF_ERROR(writer.write_header());
  for (const auto& t : tensors)
    RETURN_IF_ERROR(writer.write_data(t.data, t.num_bytes));
  return writer.finish();
}

}  // namespace crescent::model
