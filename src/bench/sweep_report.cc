#include "bench/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "bench/report.h"
#include "bench/svg_panel.h"
#include "core/check.h"

namespace crescent::bench {

namespace {

using Json = nlohmann::json;

// Goodput differences under this fraction read as a tie: a 2-core machine's runs vary so much.
constexpr double kTieWithin = 0.10;

std::string fixed(double v, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, v);
  return text;
}

std::string pad_left(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

std::optional<double> number(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return std::nullopt;
  }
  return it->get<double>();
}

enum class Winner { kA, kTie, kB };

Winner winner(const SweepPoint& a, const SweepPoint& b) {
  if (a.goodput > b.goodput * (1 + kTieWithin) && a.goodput > 0) {
    return Winner::kA;
  }
  if (b.goodput > a.goodput * (1 + kTieWithin) && b.goodput > 0) {
    return Winner::kB;
  }
  return Winner::kTie;
}

std::string rate_text(double rate) {
  return fixed(rate, rate == std::floor(rate) ? 0 : 2);
}

// The crossover: the rates between which the goodput winner last changes (ties skipped), or
// nullopt when one side wins wherever anyone does.
struct Crossover {
  size_t below = 0;  // index of the last point of the earlier winner
  size_t above = 0;  // index of the first point of the later one
  Winner from = Winner::kTie;
  Winner to = Winner::kTie;
};
std::optional<Crossover> find_crossover(const SweepSeries& a, const SweepSeries& b) {
  std::optional<size_t> last;  // the last point that was not a tie
  Winner last_winner = Winner::kTie;
  std::optional<Crossover> out;
  for (size_t i = 0; i < a.points.size(); ++i) {
    Winner w = winner(a.points[i], b.points[i]);
    if (w == Winner::kTie) {
      continue;
    }
    if (last && last_winner != w) {
      out = Crossover{.below = *last, .above = i, .from = last_winner, .to = w};
    }
    last = i;
    last_winner = w;
  }
  return out;
}

// The first point from which one side wins at every rate, all points before it being ties;
// nullopt otherwise.
std::optional<size_t> pulls_ahead(const SweepSeries& a, const SweepSeries& b) {
  size_t i = 0;
  while (i < a.points.size() && winner(a.points[i], b.points[i]) == Winner::kTie) {
    ++i;
  }
  if (i == a.points.size()) {
    return std::nullopt;
  }
  const Winner who = winner(a.points[i], b.points[i]);
  for (size_t k = i; k < a.points.size(); ++k) {
    if (winner(a.points[k], b.points[k]) != who) {
      return std::nullopt;
    }
  }
  return i;
}

}  // namespace

Result<SweepPoint> sweep_point(const Json& result, const std::string& what) {
  SweepPoint p;
  auto rate = number(result, "request_rate");
  if (!rate || !std::isfinite(*rate) || *rate <= 0) {
    return invalid_argument(what +
                            " has no finite request_rate (a sweep point is a run at "
                            "a --request-rate)");
  }
  auto goodput = number(result, "request_goodput");
  if (!goodput) {
    return invalid_argument(what + " has no request_goodput (run bench serve with --goodput)");
  }
  p.rate = *rate;
  p.goodput = *goodput;
  p.good = static_cast<int64_t>(number(result, "good_requests").value_or(0));
  p.completed = static_cast<int64_t>(number(result, "completed").value_or(0));
  p.failed = static_cast<int64_t>(number(result, "failed").value_or(0));
  p.p99_tpot_ms = number(result, "p99_tpot_ms").value_or(0);
  p.p99_itl_ms = number(result, "p99_itl_ms").value_or(0);
  p.median_ttft_ms = number(result, "median_ttft_ms").value_or(0);
  return p;
}

Result<SweepSeries> sweep_series(std::string label, const std::vector<Json>& results,
                                 const std::vector<std::string>& names) {
  CRESCENT_CHECK(results.size() == names.size());
  SweepSeries s;
  s.label = std::move(label);
  if (results.empty()) {
    return invalid_argument(s.label + ": no result files");
  }
  for (size_t i = 0; i < results.size(); ++i) {
    ASSIGN_OR_RETURN(SweepPoint p, sweep_point(results[i], names[i]));
    const std::string slos = goodput_slos_text(results[i]);
    if (i == 0) {
      s.slos = slos;
    } else if (slos != s.slos) {
      return invalid_argument(names[i] + " has other SLOs (" + slos + ") than " + names[0] + " (" +
                              s.slos + ")");
    }
    s.points.push_back(p);
  }
  std::sort(s.points.begin(), s.points.end(),
            [](const SweepPoint& x, const SweepPoint& y) { return x.rate < y.rate; });
  for (size_t i = 1; i < s.points.size(); ++i) {
    if (s.points[i].rate == s.points[i - 1].rate) {
      return invalid_argument(s.label + " has two runs at " + rate_text(s.points[i].rate) +
                              " req/s");
    }
  }
  return s;
}

Status check_comparable(const SweepSeries& a, const SweepSeries& b) {
  if (a.slos != b.slos) {
    return invalid_argument(a.label + " and " + b.label + " were measured under other SLOs (" +
                            a.slos + " vs " + b.slos + ")");
  }
  bool same = a.points.size() == b.points.size();
  for (size_t i = 0; same && i < a.points.size(); ++i) {
    same = std::abs(a.points[i].rate - b.points[i].rate) < 1e-9;
  }
  if (!same) {
    auto rates = [](const SweepSeries& s) {
      std::string out;
      for (const SweepPoint& p : s.points) {
        out += (out.empty() ? "" : " ") + rate_text(p.rate);
      }
      return out;
    };
    return invalid_argument(a.label + " and " + b.label + " were swept over other rates (" +
                            rates(a) + " vs " + rates(b) + " req/s)");
  }
  return Status::ok();
}

std::string sweep_table(const SweepSeries& a, const SweepSeries& b) {
  const char* kWhat[] = {"goodput", "TPOT p99", "ITL p99", "TTFT p50"};
  size_t col = 9;
  for (const char* what : kWhat) {
    col = std::max({col, std::string(what).size() + a.label.size() + 3,
                    std::string(what).size() + b.label.size() + 3});
  }
  std::string out = "Goodput under " + a.slos + "; latencies in ms\n";
  std::string header = pad_left("req/s", 7);
  for (const char* what : kWhat) {
    header += pad_left(std::string(what) + " " + a.label, col) +
              pad_left(std::string(what) + " " + b.label, col);
    if (std::string(what) == "goodput") {
      header += pad_left("A/B", 7);
    }
  }
  out += header + "\n" + std::string(header.size(), '=') + "\n";
  for (size_t i = 0; i < a.points.size(); ++i) {
    const SweepPoint& x = a.points[i];
    const SweepPoint& y = b.points[i];
    std::string line = pad_left(rate_text(x.rate), 7);
    line += pad_left(fixed(x.goodput, 2), col) + pad_left(fixed(y.goodput, 2), col);
    line += pad_left(y.goodput > 0 ? fixed(x.goodput / y.goodput, 2) + "x" : "-", 7);
    line += pad_left(fixed(x.p99_tpot_ms, 1), col) + pad_left(fixed(y.p99_tpot_ms, 1), col);
    line += pad_left(fixed(x.p99_itl_ms, 1), col) + pad_left(fixed(y.p99_itl_ms, 1), col);
    line += pad_left(fixed(x.median_ttft_ms, 1), col) + pad_left(fixed(y.median_ttft_ms, 1), col);
    out += line + "\n";
  }
  out += std::string(header.size(), '=') + "\n";
  return out;
}

std::string sweep_sentence(const SweepSeries& a, const SweepSeries& b) {
  auto name = [&](Winner w) { return w == Winner::kA ? a.label : b.label; };
  std::string out = a.label + " vs " + b.label + " goodput by rate:";
  for (size_t i = 0; i < a.points.size(); ++i) {
    const SweepPoint& x = a.points[i];
    const SweepPoint& y = b.points[i];
    out += std::string(i == 0 ? " " : ", ") + rate_text(x.rate) + " req/s " +
           (y.goodput > 0 ? fixed(x.goodput / y.goodput, 2) + "x" : "-") + " (" +
           fixed(x.goodput, 2) + " vs " + fixed(y.goodput, 2) + ")";
  }
  out += ". ";
  std::optional<Crossover> c = find_crossover(a, b);
  if (c) {
    out += "Crossover between " + rate_text(a.points[c->below].rate) + " and " +
           rate_text(a.points[c->above].rate) + " req/s: " + name(c->from) +
           " has the higher goodput up to " + rate_text(a.points[c->below].rate) + " req/s, " +
           name(c->to) + " from " + rate_text(a.points[c->above].rate) + " req/s on.";
    return out;
  }
  std::vector<std::string> wins;
  Winner who = Winner::kTie;
  for (size_t i = 0; i < a.points.size(); ++i) {
    Winner w = winner(a.points[i], b.points[i]);
    if (w != Winner::kTie) {
      who = w;
      wins.push_back(rate_text(a.points[i].rate));
    }
  }
  if (who == Winner::kTie) {
    return out + "No crossover: within " + fixed(kTieWithin * 100, 0) +
           "% of each other at every rate swept.";
  }
  // Tied at the low rates, then one side ahead at every higher one: where it pulls ahead.
  if (std::optional<size_t> ahead = pulls_ahead(a, b); ahead && *ahead > 0) {
    return out + "Within " + fixed(kTieWithin * 100, 0) + "% of each other up to " +
           rate_text(a.points[*ahead - 1].rate) + " req/s; " + name(who) +
           " has the higher goodput from " + rate_text(a.points[*ahead].rate) +
           " req/s on (no rate swept where " + name(who == Winner::kA ? Winner::kB : Winner::kA) +
           " is ahead).";
  }
  std::string at;
  for (size_t i = 0; i < wins.size(); ++i) {
    at += (i == 0 ? "" : (i + 1 == wins.size() ? " and " : ", ")) + wins[i];
  }
  return out + "No crossover in " + rate_text(a.points.front().rate) + "-" +
         rate_text(a.points.back().rate) + " req/s: " + name(who) + " has the higher goodput at " +
         at + " req/s and is within " + fixed(kTieWithin * 100, 0) + "% elsewhere.";
}

std::string render_sweep_svg(const SweepSeries& a, const SweepSeries& b, const std::string& title) {
  using svg::escape;
  using svg::kPanelHeight;
  using svg::kPanelWidth;
  using svg::num;
  constexpr double kTop = 50;
  constexpr double kLegend = 26;
  const double width = 2 * kPanelWidth;
  const double height = kTop + kPanelHeight + kLegend;
  const char* kColorA = "#4e79a7";
  const char* kColorB = "#e15759";
  std::string out = svg::document_start(width, height, title);

  const double x_lo = a.points.empty() ? 0 : a.points.front().rate;
  const double x_hi = a.points.empty() ? 1 : a.points.back().rate;
  // Dashed between the two rates where the goodput winner changes, or where one pulls ahead.
  std::optional<double> marker_at;
  std::string marker_label;
  if (std::optional<Crossover> c = find_crossover(a, b)) {
    marker_at = (a.points[c->below].rate + a.points[c->above].rate) / 2;
    marker_label = "crossover";
  } else if (std::optional<size_t> ahead = pulls_ahead(a, b); ahead && *ahead > 0) {
    marker_at = (a.points[*ahead - 1].rate + a.points[*ahead].rate) / 2;
    marker_label = "goodput apart by more than 10%";
  }
  auto draw = [&](double x0, const std::string& panel_title, const std::string& y_name,
                  double (*value)(const SweepPoint&)) {
    double y_hi = 0;
    std::vector<std::pair<double, double>> pa, pb;
    for (const SweepPoint& p : a.points) {
      pa.emplace_back(p.rate, value(p));
      y_hi = std::max(y_hi, value(p));
    }
    for (const SweepPoint& p : b.points) {
      pb.emplace_back(p.rate, value(p));
      y_hi = std::max(y_hi, value(p));
    }
    svg::Panel panel(&out, x0, kTop, panel_title, "offered request rate (req/s)", y_name, x_lo,
                     x_hi, 0, y_hi * 1.15);
    if (marker_at) {
      panel.vertical_marker(*marker_at, "#888");
    }
    panel.line(pa, kColorA);
    panel.line(pb, kColorB);
    if (marker_at) {
      panel.marker_label("#666", marker_label, 0);
    }
  };
  draw(0, "Goodput (" + a.slos + ")", "good requests/s",
       [](const SweepPoint& p) { return p.goodput; });
  draw(kPanelWidth, "TPOT p99", "ms", [](const SweepPoint& p) { return p.p99_tpot_ms; });
  const double ly = kTop + kPanelHeight + 12;
  double lx = width / 2 - 120;
  for (const auto& [label, color] : {std::pair{a.label, kColorA}, std::pair{b.label, kColorB}}) {
    out += "<rect x=\"" + num(lx) + "\" y=\"" + num(ly - 9) +
           "\" width=\"14\" height=\"4\" fill=\"" + color + "\"/>\n";
    out += "<text x=\"" + num(lx + 20) + "\" y=\"" + num(ly - 3) + "\" font-size=\"12\">" +
           escape(label) + "</text>\n";
    lx += 140;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace crescent::bench
