#include "apps/flags.h"

#include <charconv>
#include <cstdio>
#include <sstream>

namespace crescent::apps {

FlagParser::FlagParser(std::string usage_line, std::string description)
    : usage_line_(std::move(usage_line)), description_(std::move(description)) {}

void FlagParser::add(const std::string& name, std::string* target, const std::string& help) {
  flags_[name] = {Kind::kString, target, help, target->empty() ? "" : "\"" + *target + "\""};
  order_.push_back(name);
}
void FlagParser::add(const std::string& name, int64_t* target, const std::string& help) {
  flags_[name] = {Kind::kInt64, target, help, std::to_string(*target)};
  order_.push_back(name);
}
void FlagParser::add(const std::string& name, int* target, const std::string& help) {
  flags_[name] = {Kind::kInt, target, help, std::to_string(*target)};
  order_.push_back(name);
}
void FlagParser::add(const std::string& name, double* target, const std::string& help) {
  std::ostringstream os;
  os << *target;
  flags_[name] = {Kind::kDouble, target, help, os.str()};
  order_.push_back(name);
}
void FlagParser::add(const std::string& name, bool* target, const std::string& help) {
  flags_[name] = {Kind::kBool, target, help, *target ? "true" : "false"};
  order_.push_back(name);
}
void FlagParser::add_repeated(const std::string& name, std::vector<std::string>* target,
                              const std::string& help) {
  flags_[name] = {Kind::kRepeated, target, help, ""};
  order_.push_back(name);
}
void FlagParser::require(const std::string& name) {
  flags_.at(name).required = true;
}

bool FlagParser::was_set(const std::string& name) const {
  auto it = flags_.find(name);
  return it != flags_.end() && it->second.set;
}

Status FlagParser::assign(const std::string& name, Flag& flag, const std::string& value) {
  flag.set = true;
  auto bad = [&](const char* what) {
    return invalid_argument("--" + name + " expects " + what + ", got '" + value + "'");
  };
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.target) = value;
      return Status::ok();
    case Kind::kRepeated:
      static_cast<std::vector<std::string>*>(flag.target)->push_back(value);
      return Status::ok();
    case Kind::kInt64:
    case Kind::kInt: {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || ptr != value.data() + value.size())
        return bad("an integer");
      if (flag.kind == Kind::kInt) {
        if (v < INT32_MIN || v > INT32_MAX)
          return bad("a 32-bit integer");
        *static_cast<int*>(flag.target) = static_cast<int>(v);
      } else {
        *static_cast<int64_t*>(flag.target) = v;
      }
      return Status::ok();
    }
    case Kind::kDouble: {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size())
        return bad("a number");
      *static_cast<double*>(flag.target) = v;
      return Status::ok();
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.target) = false;
      } else {
        return bad("true or false");
      }
      return Status::ok();
  }
  return internal_error("unreachable flag kind");
}

Status FlagParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_requested_ = true;
      return Status::ok();
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && !has_value && name.rfind("no-", 0) == 0) {
      auto neg = flags_.find(name.substr(3));
      if (neg != flags_.end() && neg->second.kind == Kind::kBool) {
        neg->second.set = true;
        *static_cast<bool*>(neg->second.target) = false;
        continue;
      }
    }
    if (it == flags_.end()) {
      return invalid_argument("unknown flag --" + name + " (see --help)");
    }
    Flag& flag = it->second;
    if (!has_value) {
      if (flag.kind == Kind::kBool) {
        flag.set = true;
        *static_cast<bool*>(flag.target) = true;
        continue;
      }
      if (i + 1 >= args.size())
        return invalid_argument("--" + name + " needs a value");
      value = args[++i];
    }
    RETURN_IF_ERROR(assign(name, flag, value));
  }
  for (const auto& [name, flag] : flags_) {
    if (flag.required && !flag.set)
      return invalid_argument("--" + name + " is required");
  }
  return Status::ok();
}

std::string FlagParser::help_text() const {
  std::ostringstream os;
  os << "usage: " << usage_line_ << "\n\n" << description_ << "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    os << "  --" << name;
    if (f.kind != Kind::kBool)
      os << " VALUE";
    os << "\n      " << f.help;
    if (f.required) {
      os << " (required)";
    } else if (!f.default_text.empty()) {
      os << " (default: " << f.default_text << ")";
    }
    os << "\n";
  }
  return os.str();
}

int FlagParser::parse_or_exit_code(const std::vector<std::string>& args) {
  Status s = parse(args);
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n\n%s", s.message().c_str(), help_text().c_str());
    return 2;
  }
  if (help_requested_) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  return -1;
}

}  // namespace crescent::apps
