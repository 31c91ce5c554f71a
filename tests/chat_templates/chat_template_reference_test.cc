// Every template of src/model/testdata/chat_templates × every conversation of
// conversations.json, rendered by crescent (ChatTemplate::render_json) and by Python's jinja2 as
// transformers renders it (render_reference.py): the texts must be equal byte for byte, and a
// template error on one side must be an error on the other. Needs /usr/bin/python3 with jinja2
// (scripts/setup.sh installs python3-jinja2); without them the test fails.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/chat_template.h"
#include "model/jinja/template.h"

namespace crescent::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kTemplates = fs::path(CRESCENT_SOURCE_DIR) / "src/model/testdata/chat_templates";
const fs::path kHere = fs::path(CRESCENT_SOURCE_DIR) / "tests/chat_templates";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

struct Case {
  std::string name;
  std::string template_name;
  Json input;  // what render_reference.py reads
};

std::vector<Case> all_cases() {
  const Json templates = Json::parse(read_text(kHere / "templates.json"));
  const Json conversations = Json::parse(read_text(kHere / "conversations.json"))["conversations"];
  std::vector<Case> cases;
  for (const auto& [name, tokens] : templates.items()) {
    for (const Json& conversation : conversations) {
      Case c;
      c.template_name = name;
      c.name = name + "/" + conversation["name"].get<std::string>();
      c.input = conversation;
      c.input["template"] = (kTemplates / (name + ".jinja")).string();
      c.input["bos_token"] = tokens["bos_token"];
      c.input["eos_token"] = tokens["eos_token"];
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// Runs the Python reference over all cases; one result per case.
Json python_results(const Json& inputs) {
  const fs::path work =
      fs::temp_directory_path() / ("crescent_chat_templates_" + std::to_string(::getpid()));
  fs::create_directories(work);
  std::ofstream(work / "cases.json") << Json({{"cases", inputs}}).dump();
  const std::string cmd = "/usr/bin/python3 '" + (kHere / "render_reference.py").string() + "' '" +
                          (work / "cases.json").string() + "' '" + (work / "out.json").string() +
                          "' > '" + (work / "log").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = read_text(work / "log");
  const std::string out = read_text(work / "out.json");
  fs::remove_all(work);
  EXPECT_EQ(rc, 0) << "the Python reference failed (python3 and python3-jinja2 are needed): " << cmd
                   << "\n"
                   << log;
  return rc == 0 ? Json::parse(out) : Json::array();
}

Json python_results(const std::vector<Case>& cases) {
  Json inputs = Json::array();
  for (const Case& c : cases) {
    inputs.push_back(c.input);
  }
  return python_results(inputs);
}

Result<std::string> crescent_render(const Case& c) {
  TokenizerConfig config;
  if (c.input["bos_token"].is_string()) {
    config.bos_token = c.input["bos_token"].get<std::string>();
  }
  if (c.input["eos_token"].is_string()) {
    config.eos_token = c.input["eos_token"].get<std::string>();
  }
  ASSIGN_OR_RETURN(ChatTemplate t,
                   ChatTemplate::from_template(read_text(kTemplates / (c.template_name + ".jinja")),
                                               std::move(config)));
  ChatRenderOptions options;
  options.add_generation_prompt = c.input.value("add_generation_prompt", false);
  options.continue_final_message = c.input.value("continue_final_message", false);
  if (c.input.contains("tools")) {
    options.tools = c.input["tools"];
  }
  if (c.input.contains("kwargs")) {
    options.template_kwargs = c.input["kwargs"];
  }
  return t.render_json(c.input["messages"], options);
}

// crescent refuses, on purpose, what transformers would silently render wrong: a role the
// template never names (it would be dropped) and images for a template without images.
bool is_refusal(const Status& s) {
  return s.message().find("has no role") != std::string::npos ||
         s.message().find("does not take images") != std::string::npos;
}

TEST(ChatTemplateReferenceTest, MatchesPythonJinja2) {
  const std::vector<Case> cases = all_cases();
  ASSERT_GE(cases.size(), 12u * 10u);
  const Json expected = python_results(cases);
  ASSERT_EQ(expected.size(), cases.size());
  int num_equal = 0;
  int num_both_failed = 0;
  int num_refused = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Json& want = expected[i];
    const Result<std::string> got = crescent_render(c);
    SCOPED_TRACE(c.name);
    if (want["ok"].get<bool>()) {
      if (got.is_ok()) {
        EXPECT_EQ(*got, want["text"].get<std::string>());
        num_equal += *got == want["text"].get<std::string>() ? 1 : 0;
        continue;
      }
      const bool refused = is_refusal(got.status());
      EXPECT_TRUE(refused) << got.status().to_string();
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
      num_refused += refused ? 1 : 0;
      continue;
    }
    ASSERT_FALSE(got.is_ok()) << "jinja2 failed (" << want["kind"].get<std::string>() << ": "
                              << want["error"].get<std::string>() << ") but crescent rendered:\n"
                              << *got;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    if (want["kind"] == "TemplateError" && !is_refusal(got.status())) {
      // raise_exception: the template's own message reaches the user.
      EXPECT_NE(got.status().message().find(want["error"].get<std::string>()), std::string::npos)
          << got.status().message();
    }
    ++num_both_failed;
  }
  std::printf("%d cases equal to jinja2, %d failing in both, %d refused by crescent\n", num_equal,
              num_both_failed, num_refused);
  EXPECT_GE(num_equal, 250);
}

// Small templates over the engine's expressions, filters, tests and whitespace rules.
TEST(ChatTemplateReferenceTest, SnippetsMatchPythonJinja2) {
  const Json snippets = Json::parse(read_text(kHere / "snippets.json"));
  Json inputs = Json::array();
  for (const Json& source : snippets["snippets"]) {
    inputs.push_back({{"source", source}, {"variables", snippets["variables"]}});
  }
  const Json expected = python_results(inputs);
  ASSERT_EQ(expected.size(), inputs.size());
  int num_equal = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string source = inputs[i]["source"].get<std::string>();
    SCOPED_TRACE(source);
    auto t = jinja::Template::parse(source);
    const Result<std::string> got =
        t.is_ok() ? t->render(snippets["variables"]) : Result<std::string>(t.status());
    if (expected[i]["ok"].get<bool>()) {
      if (!got.is_ok()) {
        ADD_FAILURE() << got.status().to_string();
        continue;
      }
      EXPECT_EQ(*got, expected[i]["text"].get<std::string>());
      num_equal += *got == expected[i]["text"].get<std::string>() ? 1 : 0;
    } else {
      EXPECT_FALSE(got.is_ok()) << "jinja2 failed (" << expected[i]["error"].get<std::string>()
                                << ") but crescent rendered: " << *got;
    }
  }
  std::printf("%d of %zu snippets equal to jinja2, the others failing in both\n", num_equal,
              inputs.size());
  EXPECT_GE(num_equal, 60);
}

TEST(ChatTemplateReferenceTest, CorpusCoversTheMajorFamilies) {
  for (const char* name : {"qwen2", "qwen2_5", "qwen3", "qwq", "llama3", "llama3_1", "llama3_2",
                           "mistral_v0_3", "deepseek_v3", "deepseek_r1_distill", "gemma2", "phi3",
                           "phi4", "smollm2", "qwen2_vl", "hermes2pro_tool_use"}) {
    EXPECT_TRUE(fs::exists(kTemplates / (std::string(name) + ".jinja"))) << name;
  }
}

}  // namespace
}  // namespace crescent::model
