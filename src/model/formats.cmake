# Model files: config.json, safetensors, GGUF, presets and the make-model writer.
add_library(crescent_model_formats STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/config.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/vision_config.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/tensor_source.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/safetensors.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_types.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_writer.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/gguf_mmproj.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/model_files.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/presets.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/make_model.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_gguf.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/quantize.cc
)
# kernels: the ggml reference quantisers (kernels/quants.h) behind the GGUF writer.
# tokenizer: tokenizer_gguf.cc builds a Tokenizer from GGUF metadata.
target_link_libraries(crescent_model_formats PUBLIC crescent_core crescent_kernels
                      crescent_tokenizer nlohmann_json::nlohmann_json)
# presets.cc finds the npm tokenizers in the source tree by default.
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/presets.cc PROPERTIES
  COMPILE_DEFINITIONS "CRESCENT_SOURCE_DIR=\"${PROJECT_SOURCE_DIR}\"")
crescent_app_library(crescent_model_formats)

crescent_test(model_formats_test
  SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/config_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/gguf_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/gguf_mmproj_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/model_files_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/make_model_test.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_gguf_test.cc
  LIBS crescent_model_formats
  LABELS unit)
# GCC 12 reports a false -Wrestrict in inlined std::string concatenation at -O3 (GCC PR 105329).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(model_formats_test PRIVATE -Wno-restrict)
endif()
