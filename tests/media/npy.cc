#include "npy.h"

#include <cstring>
#include <fstream>
#include <iterator>

namespace crescent::media::testing {

int64_t NpyArray::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Result<NpyArray> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return not_found("cannot open " + path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    return data_loss(path + ": not a .npy file");
  size_t header_len = 0;
  size_t offset = 0;
  if (bytes[6] == 1) {
    header_len = bytes[8] | (bytes[9] << 8);
    offset = 10;
  } else {
    if (bytes.size() < 12)
      return data_loss(path + ": short header");
    header_len = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (bytes[11] << 24);
    offset = 12;
  }
  if (offset + header_len > bytes.size())
    return data_loss(path + ": short header");
  std::string header(bytes.begin() + offset, bytes.begin() + offset + header_len);
  NpyArray array;
  size_t descr = header.find("'descr': '");
  if (descr == std::string::npos)
    return data_loss(path + ": no descr");
  descr += 10;
  array.dtype = header.substr(descr, header.find('\'', descr) - descr);
  if (header.find("'fortran_order': False") == std::string::npos)
    return data_loss(path + ": Fortran order");
  size_t shape = header.find("'shape': (");
  if (shape == std::string::npos)
    return data_loss(path + ": no shape");
  shape += 10;
  std::string dims = header.substr(shape, header.find(')', shape) - shape);
  size_t pos = 0;
  while (pos < dims.size()) {
    size_t comma = dims.find(',', pos);
    std::string item =
        dims.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.find_first_not_of(' ') != std::string::npos)
      array.shape.push_back(std::stoll(item));
    if (comma == std::string::npos)
      break;
    pos = comma + 1;
  }
  size_t item_size = 0;
  if (array.dtype == "<f4")
    item_size = 4;
  else if (array.dtype == "|u1")
    item_size = 1;
  else
    return data_loss(path + ": unsupported dtype " + array.dtype);
  const size_t data_bytes = static_cast<size_t>(array.num_elements()) * item_size;
  offset += header_len;
  if (bytes.size() - offset != data_bytes)
    return data_loss(path + ": data size does not match the shape");
  array.data.assign(bytes.begin() + offset, bytes.end());
  return array;
}

}  // namespace crescent::media::testing
