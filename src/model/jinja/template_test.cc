#include "model/jinja/template.h"

#include <gtest/gtest.h>

namespace crescent::model::jinja {
namespace {

TEST(JinjaTemplateTest, RendersChatMl) {
  auto t = Template::parse(
      "{% for message in messages %}"
      "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const nlohmann::ordered_json vars = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                       {"add_generation_prompt", true}};
  auto r = t->render(vars);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // Rendering twice gives the same text (the template is immutable).
  EXPECT_EQ(*t->render(vars), *r);
}

TEST(JinjaTemplateTest, ErrorsAreInvalidArgumentWithLine) {
  auto bad = Template::parse("line1\n{% if x %}\n{% endfor %}");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 3"), std::string::npos) << bad.status().message();
  auto raising = Template::parse("a\n\n{{ raise_exception('Only user and assistant roles') }}");
  ASSERT_TRUE(raising.is_ok());
  auto r = raising->render(nlohmann::ordered_json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "chat template error at line 3: Only user and assistant roles");
  auto generation = Template::parse("{% generation %}x{% endgeneration %}");
  ASSERT_TRUE(generation.is_ok());
  EXPECT_EQ(*generation->render(nlohmann::ordered_json::object()), "x");
}

}  // namespace
}  // namespace crescent::model::jinja
