#include "launcher/report/training_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "launcher/report/table_text.h"

namespace dflash {
namespace {

bool MetricNum(const nlohmann::json& m, const char* key, double* out) {
  if (!m.is_object()) return false;
  auto it = m.find(key);
  if (it == m.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return std::isfinite(*out);
}

std::vector<double> LossCurve(const nlohmann::json& m) {
  std::vector<double> out;
  if (!m.is_object() || !m.contains("losses") || !m["losses"].is_array()) return out;
  for (const auto& v : m["losses"])
    if (v.is_number() && std::isfinite(v.get<double>())) out.push_back(v.get<double>());
  return out;
}

bool ReportsSteps(const ProcessSummary& p) {
  double steps = 0;
  return MetricNum(p.metrics, "steps", &steps);
}

std::string NumText(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

/// The mean loss of the first and of the last 10 steps: one step's loss is noise ("5.613 -> 5.445" while the
/// last ten averaged 4.93). From `first_loss_mean10`/`last_loss_mean10` (TrainingMetrics keeps them exactly), else
/// from the curve when it has every step (`loss_stride` 1) and 20 of them; else "-".
std::string SmoothedLoss(const nlohmann::json& m, const std::vector<double>& losses) {
  constexpr size_t kWindow = 10;
  double first = 0, last = 0, stride = 1;
  if (MetricNum(m, "first_loss_mean10", &first) && MetricNum(m, "last_loss_mean10", &last))
    return NumText("%.3f", first) + " -> " + NumText("%.3f", last);
  MetricNum(m, "loss_stride", &stride);
  if (stride != 1 || losses.size() < 2 * kWindow) return "-";
  first = last = 0;
  for (size_t i = 0; i < kWindow; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  return NumText("%.3f", first / kWindow) + " -> " + NumText("%.3f", last / kWindow);
}

int64_t MetricInt(const nlohmann::json& m, const char* key) {
  double v = 0;
  return MetricNum(m, key, &v) && v >= 0 ? static_cast<int64_t>(v) : -1;
}

/// "resumed from step 20 (5 redone)" for each restart of `p` after a failure, ", "-joined; "" without any.
std::string RestartsText(const ProcessSummary& p) {
  std::string o;
  for (size_t k = 1; k < p.attempts.size(); ++k) {
    const AttemptRecord& before = p.attempts[k - 1];
    const AttemptTraining& now = p.attempts[k].training;
    if (!Restarted(before.outcome) || (before.training.steps < 0 && now.steps < 0)) continue;
    std::string t;
    if (now.resumed_from_step < 0) t = "restarted, no resume reported";
    else {
      t = "resumed from step " + std::to_string(now.resumed_from_step);
      if (before.training.step >= 0)
        t += " (" + std::to_string(std::max<int64_t>(0, before.training.step - now.resumed_from_step)) + " redone)";
    }
    o += (o.empty() ? "" : ", ") + t;
  }
  return o;
}

std::string RightTrimmed(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

AttemptTraining TrainingOfMetrics(const nlohmann::json& m) {
  AttemptTraining t;
  t.steps = MetricInt(m, "steps");
  t.resumed_from_step = MetricInt(m, "resumed_from_step");
  if (t.steps >= 0) t.step = std::max<int64_t>(0, t.resumed_from_step) + t.steps;
  if (m.is_object() && m.contains("checkpoint")) t.step = std::max(t.step, MetricInt(m["checkpoint"], "step"));
  return t;
}

TrainingAcross TrainingAcrossAttempts(const ProcessSummary& p) {
  TrainingAcross a;
  for (size_t k = 0; k < p.attempts.size(); ++k) {
    const AttemptTraining& t = p.attempts[k].training;
    if (t.steps >= 0) {
      a.any = true;
      a.steps += t.steps;
      ++a.attempts;
    }
    if (k + 1 < p.attempts.size() && Restarted(p.attempts[k].outcome) && t.step >= 0) {
      const AttemptTraining& next = p.attempts[k + 1].training;
      // Without a resume the next attempt began again at step 0: every step was redone.
      if (next.steps >= 0 || next.resumed_from_step >= 0)
        a.steps_redone += std::max<int64_t>(0, t.step - std::max<int64_t>(0, next.resumed_from_step));
    }
  }
  if (!p.attempts.empty()) {
    a.step = p.attempts.back().training.step;
    a.resumed_from_step = p.attempts.back().training.resumed_from_step;
  }
  return a;
}

std::string TrainingTable(const RunSummary& s) {
  std::vector<std::string> cells, restarts;
  bool curves = false, any_restart = false;
  for (const ProcessSummary& p : s.processes) {
    if (!ReportsSteps(p)) continue;
    const nlohmann::json& m = p.metrics;
    double steps = 0, first = 0, last = 0, t = 0, frames = 0, padded = 0, dropped = 0;
    MetricNum(m, "steps", &steps);
    TrainingAcross across = TrainingAcrossAttempts(p);
    if (across.any) steps = static_cast<double>(across.steps);  // every attempt's steps, not the last one's
    std::vector<double> losses = LossCurve(m);
    curves |= losses.size() >= 2;
    bool has_first = MetricNum(m, "first_loss", &first) || (!losses.empty() && (first = losses.front(), true));
    bool has_last = MetricNum(m, "last_loss", &last) || (!losses.empty() && (last = losses.back(), true));
    std::string loss = has_first && has_last ? NumText("%.3f", first) + " -> " + NumText("%.3f", last) : "-";
    std::string smooth = SmoothedLoss(m, losses);
    bool has_t = MetricNum(m, "time_to_first_step_s", &t) || MetricNum(m, "compile_wall_s", &t);
    std::string spool = "-";
    if (MetricNum(m, "frames_acked", &frames)) {
      spool = NumText("%.0f", frames);
      if (MetricNum(m, "frames_padded", &padded) && padded > 0) spool += " (+" + NumText("%.0f", padded) + " padded)";
      if (MetricNum(m, "frames_dropped", &dropped) && dropped > 0) spool += " (" + NumText("%.0f", dropped) + " dropped)";
    }
    cells.push_back(Pad(p.name, 14) + Pad(NumText("%.0f", steps), 8) + Pad(loss, 22) + Pad(smooth, 26) +
                    Pad(has_t ? Seconds(t) : "-", 12) + spool);
    restarts.push_back(RestartsText(p));
    any_restart |= !restarts.back().empty();
  }
  if (cells.empty()) return "";
  // The restarts column only when a process was restarted: where each resumed, and what it redid.
  std::string o = "\n" + Pad("training", 14) + Pad("steps", 8) + Pad("loss first -> last", 22) +
                  Pad("mean of 10 first -> last", 26) + Pad("first step", 12) +
                  (any_restart ? Pad("spool frames", 24) + "restarts\n" : "spool frames\n");
  for (size_t k = 0; k < cells.size(); ++k) {
    std::string row = any_restart ? Pad(cells[k], 14 + 8 + 22 + 26 + 12 + 24) + restarts[k] : cells[k];
    o += RightTrimmed(row) + "\n";
  }
  if (curves) o += "loss curves: " + s.run_dir + "/loss.svg\n";
  return o;
}

std::string LossPlotSvg(const RunSummary& s) {
  struct Curve { std::string name; std::vector<double> y; double stride; };
  std::vector<Curve> curves;
  double max_x = 1, lo = INFINITY, hi = -INFINITY;
  for (const ProcessSummary& p : s.processes) {
    std::vector<double> y = LossCurve(p.metrics);
    if (!ReportsSteps(p) || y.size() < 2) continue;
    double stride = 1;
    if (!MetricNum(p.metrics, "loss_stride", &stride) || stride < 1) stride = 1;
    max_x = std::max(max_x, (y.size() - 1) * stride);
    for (double v : y) lo = std::min(lo, v), hi = std::max(hi, v);
    curves.push_back({p.name, std::move(y), stride});
  }
  if (curves.empty()) return "";
  if (hi <= lo) hi = lo + 1;
  const double W = 800, H = 450, L = 60, R = 20, T = 30, B = 45;
  auto X = [&](double x) { return L + (W - L - R) * x / max_x; };
  auto Y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                  "#7f7f7f"};
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"450\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"800\" height=\"450\" fill=\"white\"/>\n";
  o += "<text x=\"" + NumText("%.0f", L) + "\" y=\"18\" font-size=\"14\">loss per step: " + XmlEscape(s.run_id) + "</text>\n";
  o += "<line x1=\"" + NumText("%.1f", L) + "\" y1=\"" + NumText("%.1f", H - B) + "\" x2=\"" + NumText("%.1f", W - R) + "\" y2=\"" +
       NumText("%.1f", H - B) + "\" stroke=\"black\"/>\n<line x1=\"" + NumText("%.1f", L) + "\" y1=\"" + NumText("%.1f", T) +
       "\" x2=\"" + NumText("%.1f", L) + "\" y2=\"" + NumText("%.1f", H - B) + "\" stroke=\"black\"/>\n";
  for (double v : {lo, (lo + hi) / 2, hi})
    o += "<text x=\"" + NumText("%.1f", L - 5) + "\" y=\"" + NumText("%.1f", Y(v) + 4) + "\" text-anchor=\"end\">" +
         NumText("%.3g", v) + "</text>\n";
  for (double x : {0.0, max_x / 2, max_x})
    o += "<text x=\"" + NumText("%.1f", X(x)) + "\" y=\"" + NumText("%.1f", H - B + 16) + "\" text-anchor=\"middle\">" +
         NumText("%.0f", x) + "</text>\n";
  o += "<text x=\"" + NumText("%.1f", (L + W - R) / 2) + "\" y=\"" + NumText("%.1f", H - 8) +
       "\" text-anchor=\"middle\">step</text>\n";
  for (size_t c = 0; c < curves.size(); ++c) {
    const Curve& k = curves[c];
    const char* color = kColors[c % (sizeof kColors / sizeof *kColors)];
    o += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < k.y.size(); ++i)
      o += (i ? " " : "") + NumText("%.1f", X(i * k.stride)) + "," + NumText("%.1f", Y(k.y[i]));
    o += "\"><title>" + XmlEscape(k.name) + "</title></polyline>\n";
    double ly = T + 14 + 16.0 * c;
    o += "<text x=\"" + NumText("%.1f", W - R - 5) + "\" y=\"" + NumText("%.1f", ly) + "\" text-anchor=\"end\" fill=\"" + color +
         "\">" + XmlEscape(k.name + ": " + NumText("%.3f", k.y.front()) + " -> " + NumText("%.3f", k.y.back())) +
         "</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace dflash
