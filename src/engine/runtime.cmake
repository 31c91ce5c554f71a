# The engine over a real model: the transformer runner, the tokenizer adapter and the loader.
# Kept apart from crescent_engine so the scheduler/block manager build and test without models.
add_library(crescent_engine_runtime STATIC
  ${CMAKE_CURRENT_LIST_DIR}/loader.cc
  ${CMAKE_CURRENT_LIST_DIR}/transformer_runner.cc
)
target_link_libraries(crescent_engine_runtime PUBLIC crescent_engine crescent_model nlohmann_json::nlohmann_json)
crescent_app_library(crescent_engine_runtime)
