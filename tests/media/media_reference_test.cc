// decode_image and preprocess_image against references that tests/media/make_reference.py makes
// with Pillow and numpy: the decoded RGB must equal vLLM's PIL decode byte for byte, and the
// pixel patches must match Qwen2VLImageProcessor's within 1e-5. The script runs here; if python3
// or its packages are missing the test fails (it is never skipped).

#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "media/decode.h"
#include "media/image_processor.h"
#include "media/test_images.h"
#include "npy.h"

namespace crescent::media {
namespace {

namespace fs = std::filesystem;

struct Expected {
  std::string name;
  std::string file;
  bool is_error = false;
  int height = 0, width = 0, grid_t = 0, grid_h = 0, grid_w = 0;
};

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Images Pillow cannot write, made here with the C libraries; Pillow still decodes them for the
// reference.
void write_extra_inputs(const fs::path& inputs) {
  fs::create_directories(inputs);
  std::vector<uint8_t> cmyk = testing::pattern(48 * 40 * 4, 21);
  write_file(inputs / "ycck_jpeg.jpg", testing::encode_jpeg(48, 40, 4, cmyk, 90, /*ycck=*/true));
  write_file(inputs / "interlaced_rgb.png",
             testing::encode_png(45, 31, PNG_COLOR_TYPE_RGB, 8, testing::pattern(45 * 31 * 3, 22),
                                 {}, {}, /*interlace=*/true));
  write_file(inputs / "grey_trns.png", testing::encode_png(30, 30, PNG_COLOR_TYPE_GRAY, 8,
                                                           testing::pattern(900, 23), {}, {17}));
}

std::string run_script(const fs::path& out_dir, int* exit_code) {
  const std::string command = std::string(MEDIA_REFERENCE_PYTHON) + " " + CRESCENT_SOURCE_DIR +
                              "/tests/media/make_reference.py " + out_dir.string() + " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return "popen failed: " + command;
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    output.append(buffer, n);
  *exit_code = pclose(pipe);
  return command + "\n" + output;
}

std::vector<Expected> read_manifest(const fs::path& path) {
  std::vector<Expected> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Expected e;
    std::string status;
    fields >> e.name >> e.file >> status;
    e.is_error = status == "error";
    if (!e.is_error)
      fields >> e.height >> e.width >> e.grid_t >> e.grid_h >> e.grid_w;
    out.push_back(e);
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "media_reference_XXXXXX").string();
    CRESCENT_CHECK(mkdtemp(pattern.data()) != nullptr) << "mkdtemp";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(MediaReferenceTest, DecodeAndPreprocessMatchPillowAndTransformers) {
  TempDir dir;
  write_extra_inputs(dir.path() / "inputs");
  int exit_code = 0;
  std::string output = run_script(dir.path(), &exit_code);
  ASSERT_EQ(exit_code, 0) << "make_reference.py failed (python3-pil and python3-numpy come from "
                             "scripts/setup.sh):\n"
                          << output;
  const fs::path expected_dir = dir.path() / "expected";
  std::vector<Expected> entries = read_manifest(expected_dir / "manifest.txt");
  ASSERT_GE(entries.size(), 30u) << output;

  const ImageProcessorConfig config;  // the defaults make_reference.py uses
  int num_compared = 0;
  for (const Expected& e : entries) {
    SCOPED_TRACE(e.file);
    std::vector<uint8_t> bytes = read_file(dir.path() / "inputs" / e.file);
    auto decoded = decode_image(bytes);
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    auto rgb = testing::read_npy((expected_dir / (e.name + ".rgb.npy")).string());
    ASSERT_TRUE(rgb.is_ok()) << rgb.status().to_string();
    ASSERT_EQ(rgb->shape, (std::vector<int64_t>{decoded->height, decoded->width, 3}));
    int64_t differing_bytes = 0;
    for (size_t i = 0; i < rgb->data.size(); ++i)
      differing_bytes += rgb->data[i] != decoded->rgb[i];
    EXPECT_EQ(differing_bytes, 0) << "decoded RGB differs from PIL in " << differing_bytes << " of "
                                  << rgb->data.size() << " bytes";

    auto patches = preprocess_image(*decoded, config);
    if (e.is_error) {
      ASSERT_FALSE(patches.is_ok());
      std::vector<uint8_t> text = read_file(expected_dir / (e.name + ".error.txt"));
      EXPECT_EQ(patches.status().message(), std::string(text.begin(), text.end()));
      std::printf("  %-22s %5dx%-5d RGB %s | refused like the reference: %s\n", e.name.c_str(),
                  decoded->width, decoded->height,
                  differing_bytes == 0 ? "==" : "!=", patches.status().message().c_str());
      continue;
    }
    ASSERT_TRUE(patches.is_ok()) << patches.status().to_string();
    auto size =
        smart_resize(decoded->height, decoded->width, 28, config.min_pixels, config.max_pixels);
    ASSERT_TRUE(size.is_ok());
    EXPECT_EQ(size->first, e.height);
    EXPECT_EQ(size->second, e.width);
    EXPECT_EQ(patches->grid_t, e.grid_t);
    EXPECT_EQ(patches->grid_h, e.grid_h);
    EXPECT_EQ(patches->grid_w, e.grid_w);
    auto pixels = testing::read_npy((expected_dir / (e.name + ".pixels.npy")).string());
    ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
    ASSERT_EQ(pixels->dtype, "<f4");
    ASSERT_EQ(pixels->shape, (std::vector<int64_t>{patches->num_patches(), patches->patch_dim}));
    const float* want = reinterpret_cast<const float*>(pixels->data.data());
    double max_diff = 0;
    for (size_t i = 0; i < patches->values.size(); ++i)
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(patches->values[i]) - want[i]));
    EXPECT_LE(max_diff, 1e-5);
    std::printf("  %-22s %5dx%-5d RGB %s | resized %4dx%-4d grid %dx%dx%d  max |diff| %.3g\n",
                e.name.c_str(), decoded->width, decoded->height,
                differing_bytes == 0 ? "==" : "!=", e.width, e.height, e.grid_t, e.grid_h, e.grid_w,
                max_diff);
    ++num_compared;
  }
  std::fflush(stdout);
  EXPECT_GE(num_compared, 28);
}

}  // namespace
}  // namespace crescent::media
