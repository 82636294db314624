// Accuracy over a run: a 3-layer MLP (32 -> 128 -> 128 -> 1, ReLU) learns a synthetic regression
// task (a fixed random teacher network plus noise) for 400 steps of batch 256, twice from the same
// initial weights and the same batches:
//   - "fp32": every tensor with fusekit::AdamW (float32 m and v);
//   - "8-bit": tensors of 4096 elements or more with fusekit::ApplyAdamWQuant (8-bit m and v,
//     the dynamic maps), the smaller ones (biases, the last layer) with AdamW, as the 8-bit
//     optimizers do.
// Prints both loss curves every 50 steps and the final training and held-out losses; exits
// non-zero when the 8-bit run's final held-out loss is more than 5% above the fp32 run's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "fusekit/adam_w.h"
#include "fusekit/apply_adam_w_quant.h"

namespace {

using fusekit::TensorView;

constexpr int kIn = 32, kHidden = 128, kBatch = 256, kSteps = 400, kTeacher = 16;
constexpr int64_t kQuantMin = 4096;

struct Param {
  std::vector<float> w, g;
  // float32 state
  std::vector<float> m32, v32;
  // 8-bit state
  bool q8 = false;
  std::vector<uint8_t> m8, v8;
  std::vector<float> absmax_m, absmax_v;
};

struct Model {
  Param w1, b1, w2, b2, w3, b3;
  std::vector<Param *> params() { return {&w1, &b1, &w2, &b2, &w3, &b3}; }
};

Model init_model(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto he = [&](int fan_in, size_t n) {
    std::normal_distribution<float> d(0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
    std::vector<float> w(n);
    for (auto &x : w) x = d(rng);
    return w;
  };
  Model m;
  m.w1.w = he(kIn, size_t{kIn} * kHidden);
  m.b1.w.assign(kHidden, 0.0f);
  m.w2.w = he(kHidden, size_t{kHidden} * kHidden);
  m.b2.w.assign(kHidden, 0.0f);
  m.w3.w = he(kHidden, kHidden);
  m.b3.w.assign(1, 0.0f);
  return m;
}

void init_state(Param &p, bool eight_bit, const std::array<float, 256> &qm) {
  const size_t n = p.w.size();
  p.g.assign(n, 0.0f);
  p.q8 = eight_bit && static_cast<int64_t>(n) >= kQuantMin;
  if (p.q8) {
    const auto zero = static_cast<uint8_t>(std::find(qm.begin(), qm.end(), 0.0f) - qm.begin());
    p.m8.assign(n, zero);
    p.v8.assign(n, 0);  // the unsigned map's 0
    p.absmax_m.assign((n + 255) / 256, 0.0f);
    p.absmax_v.assign((n + 255) / 256, 0.0f);
  } else {
    p.m32.assign(n, 0.0f);
    p.v32.assign(n, 0.0f);
  }
}

// The teacher: y = sum_j a_j tanh(x . u_j) + noise.
struct Task {
  std::vector<float> u, a;
  explicit Task(uint64_t seed) : u(size_t{kTeacher} * kIn), a(kTeacher) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto &x : u) x = d(rng) / std::sqrt(static_cast<float>(kIn));
    for (auto &x : a) x = d(rng);
  }
  void batch(std::mt19937_64 &rng, std::vector<float> &x, std::vector<float> &y) const {
    std::normal_distribution<float> d(0.0f, 1.0f);
    x.resize(size_t{kBatch} * kIn);
    y.resize(kBatch);
    for (auto &v : x) v = d(rng);
    for (int b = 0; b < kBatch; ++b) {
      float s = 0.0f;
      for (int j = 0; j < kTeacher; ++j) {
        float dot = 0.0f;
        for (int i = 0; i < kIn; ++i) dot += x[size_t(b) * kIn + i] * u[size_t(j) * kIn + i];
        s += a[j] * std::tanh(dot);
      }
      y[b] = s + 0.01f * d(rng);
    }
  }
};

// out[b][o] = bias[o] + sum_i in[b][i] * w[i][o]
void dense(const std::vector<float> &in, int nin, const std::vector<float> &w,
           const std::vector<float> &bias, int nout, std::vector<float> &out) {
  out.assign(size_t{kBatch} * nout, 0.0f);
  for (int b = 0; b < kBatch; ++b) {
    float *o = &out[size_t(b) * nout];
    for (int k = 0; k < nout; ++k) o[k] = bias[k];
    for (int i = 0; i < nin; ++i) {
      const float xi = in[size_t(b) * nin + i];
      const float *wi = &w[size_t(i) * nout];
      for (int k = 0; k < nout; ++k) o[k] += xi * wi[k];
    }
  }
}

// Backward of dense: gw += in^T dout, gb += sum dout, din = dout w^T.
void dense_back(const std::vector<float> &in, int nin, const std::vector<float> &w,
                const std::vector<float> &dout, int nout, std::vector<float> &gw,
                std::vector<float> &gb, std::vector<float> *din) {
  std::fill(gw.begin(), gw.end(), 0.0f);
  std::fill(gb.begin(), gb.end(), 0.0f);
  for (int b = 0; b < kBatch; ++b) {
    const float *d = &dout[size_t(b) * nout];
    for (int k = 0; k < nout; ++k) gb[k] += d[k];
    for (int i = 0; i < nin; ++i) {
      const float xi = in[size_t(b) * nin + i];
      float *gwi = &gw[size_t(i) * nout];
      for (int k = 0; k < nout; ++k) gwi[k] += xi * d[k];
    }
  }
  if (din != nullptr) {
    din->assign(size_t{kBatch} * nin, 0.0f);
    for (int b = 0; b < kBatch; ++b) {
      for (int i = 0; i < nin; ++i) {
        const float *wi = &w[size_t(i) * nout];
        const float *d = &dout[size_t(b) * nout];
        float s = 0.0f;
        for (int k = 0; k < nout; ++k) s += wi[k] * d[k];
        (*din)[size_t(b) * nin + i] = s;
      }
    }
  }
}

struct Activations {
  std::vector<float> h1, a1, h2, a2, out;
};

float forward(Model &m, const std::vector<float> &x, const std::vector<float> &y,
              Activations &act) {
  dense(x, kIn, m.w1.w, m.b1.w, kHidden, act.h1);
  act.a1 = act.h1;
  for (auto &v : act.a1) v = std::max(v, 0.0f);
  dense(act.a1, kHidden, m.w2.w, m.b2.w, kHidden, act.h2);
  act.a2 = act.h2;
  for (auto &v : act.a2) v = std::max(v, 0.0f);
  dense(act.a2, kHidden, m.w3.w, m.b3.w, 1, act.out);
  double loss = 0;
  for (int b = 0; b < kBatch; ++b) loss += double(act.out[b] - y[b]) * double(act.out[b] - y[b]);
  return static_cast<float>(loss / kBatch);
}

void backward(Model &m, const std::vector<float> &x, const std::vector<float> &y,
              Activations &act) {
  std::vector<float> d3(kBatch), d2, d1;
  for (int b = 0; b < kBatch; ++b) d3[b] = 2.0f * (act.out[b] - y[b]) / kBatch;
  dense_back(act.a2, kHidden, m.w3.w, d3, 1, m.w3.g, m.b3.g, &d2);
  for (size_t i = 0; i < d2.size(); ++i) d2[i] = act.h2[i] > 0 ? d2[i] : 0.0f;
  dense_back(act.a1, kHidden, m.w2.w, d2, kHidden, m.w2.g, m.b2.g, &d1);
  for (size_t i = 0; i < d1.size(); ++i) d1[i] = act.h1[i] > 0 ? d1[i] : 0.0f;
  dense_back(x, kIn, m.w1.w, d1, kHidden, m.w1.g, m.b1.g, nullptr);
}

bool optimizer_step(Param &p, int64_t step, const std::array<float, 256> &qm,
                    const std::array<float, 256> &qv) {
  const auto n = static_cast<int64_t>(p.w.size());
  fusekit::Status st;
  if (p.q8) {
    fusekit::ApplyAdamWQuantOptions o;
    o.weight_decay = 0.01;
    const auto blocks = static_cast<int64_t>(p.absmax_m.size());
    st = fusekit::apply_adam_w_quant_step(
        TensorView::of(p.w.data(), {n}), TensorView::of(p.g.data(), {n}),
        TensorView::of(p.m8.data(), {n}), TensorView::of(p.v8.data(), {n}),
        TensorView::of(qm.data(), {256}), TensorView::of(qv.data(), {256}),
        TensorView::of(p.absmax_m.data(), {blocks}), TensorView::of(p.absmax_v.data(), {blocks}),
        step, 1e-3f, o);
  } else {
    fusekit::AdamWOptions o;
    o.weight_decay = 0.01;
    st = fusekit::adam_w_step(TensorView::of(p.w.data(), {n}), TensorView::of(p.g.data(), {n}),
                              TensorView::of(p.m32.data(), {n}), TensorView::of(p.v32.data(), {n}),
                              step, 1e-3f, o);
  }
  if (!st.ok()) std::fprintf(stderr, "%s\n", st.message().c_str());
  return st.ok();
}

struct RunResult {
  std::vector<float> curve;  // training loss, mean over each 50 steps
  float final_train = 0, held_out = 0;
};

RunResult train(bool eight_bit, const Task &task) {
  const auto qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  Model model = init_model(42);
  for (Param *p : model.params()) init_state(*p, eight_bit, qm);
  std::mt19937_64 data_rng(7);
  std::vector<float> x, y;
  Activations act;
  RunResult r;
  double window = 0;
  for (int step = 0; step < kSteps; ++step) {
    task.batch(data_rng, x, y);
    const float loss = forward(model, x, y, act);
    backward(model, x, y, act);
    for (Param *p : model.params()) {
      if (!optimizer_step(*p, step, qm, qv)) return r;
    }
    window += loss;
    if ((step + 1) % 50 == 0) {
      r.curve.push_back(static_cast<float>(window / 50));
      window = 0;
    }
  }
  r.final_train = r.curve.back();
  std::mt19937_64 eval_rng(12345);
  double eval = 0;
  for (int k = 0; k < 8; ++k) {
    task.batch(eval_rng, x, y);
    eval += forward(model, x, y, act);
  }
  r.held_out = static_cast<float>(eval / 8);
  return r;
}

}  // namespace

int main() {
  const Task task(3);
  const RunResult a = train(false, task);
  const RunResult b = train(true, task);
  if (a.curve.empty() || b.curve.empty()) return 1;
  std::printf("MLP 32-128-128-1, batch %d, %d steps, lr 1e-3, weight decay 0.01\n", kBatch, kSteps);
  std::printf("%-8s %14s %14s\n", "steps", "fp32 AdamW", "8-bit AdamW");
  for (size_t i = 0; i < a.curve.size(); ++i) {
    std::printf("%-8zu %14.6f %14.6f\n", (i + 1) * 50, double{a.curve[i]}, double{b.curve[i]});
  }
  const double rel = (double{b.held_out} - double{a.held_out}) / double{a.held_out};
  std::printf("final training loss (last 50 steps): fp32 %.6f, 8-bit %.6f\n", double{a.final_train},
              double{b.final_train});
  std::printf("held-out loss: fp32 %.6f, 8-bit %.6f (%+.2f%%)\n", double{a.held_out},
              double{b.held_out}, 100 * rel);
  const bool ok = rel <= 0.05;
  std::printf("%s: the 8-bit run's held-out loss is %s 5%% of the fp32 run's\n",
              ok ? "PASS" : "FAIL", ok ? "within" : "not within");
  return ok ? 0 : 1;
}
