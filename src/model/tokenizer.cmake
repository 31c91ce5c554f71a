# Tokenizer, pre-tokenizer, Unicode helpers and chat templates (crescent::model).
find_package(ICU REQUIRED COMPONENTS uc)

add_library(crescent_tokenizer STATIC
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cc
  ${CMAKE_CURRENT_LIST_DIR}/pretokenizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_load.cc
  ${CMAKE_CURRENT_LIST_DIR}/unicode.cc
)
target_link_libraries(crescent_tokenizer
  PUBLIC crescent_core
  PRIVATE nlohmann_json::nlohmann_json ICU::uc)

crescent_test(tokenizer_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/chat_template_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/pretokenizer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/tokenizer_test.cc
  LIBS crescent_tokenizer nlohmann_json::nlohmann_json
  LABELS unit)
