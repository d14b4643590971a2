#include "optimizer.h"

#include <algorithm>
#include <cmath>

#include "grad_buckets.h"
#include "kf/common/error.h"
#include "kf/common/log.h"

namespace kf::learner {

double schedule_lr(const OptimConfig& o, const ScheduleConfig& s, int64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) return o.lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.kind == ScheduleKind::constant) return o.lr;
  const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
  const double p = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  const double lo = o.lr * s.min_lr_ratio;
  if (s.kind == ScheduleKind::linear) return o.lr + (lo - o.lr) * p;
  return lo + 0.5 * (o.lr - lo) * (1.0 + std::cos(M_PI * p));
}

namespace {

// Sum of squares in fp64 (a 0-dim fp64 tensor on g's device), in chunks so a large
// embedding never has a whole fp64 copy.
torch::Tensor sum_squares(const torch::Tensor& g) {
  const auto flat = g.reshape({-1});
  const int64_t n = flat.numel(), chunk = int64_t{1} << 24;
  auto total = torch::zeros({}, g.options().dtype(torch::kFloat64));
  for (int64_t off = 0; off < n; off += chunk)
    total += flat.narrow(0, off, std::min(chunk, n - off)).to(torch::kFloat64).pow(2).sum();
  return total;
}

// The fused kernels (CUDA): torch's _fused_adamw_ does the loop's arithmetic per element in
// one launch for a list of tensors (decoupled decay, lerp and addcmul moments, the
// bias-corrected step); it reads, not increments, the step count.
void fused_adamw(std::vector<torch::Tensor> w, std::vector<torch::Tensor> g, std::vector<torch::Tensor> m,
                 std::vector<torch::Tensor> v, int64_t step, double lr, const OptimConfig& c) {
  if (w.empty()) return;
  const auto st = torch::full({}, static_cast<double>(step), w[0].options().dtype(torch::kFloat32));
  const std::vector<torch::Tensor> steps(w.size(), st);
  at::_fused_adamw_(w, g, m, v, {}, steps, lr, c.beta1, c.beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                    /*maximize=*/false);
}

// Sum of the squares of every tensor's norm, fp64 (0-dim on the tensors' device): one
// _foreach_norm launch for fp32 gradients; others (bf16) per tensor in fp64, since a
// bf16 norm would round the clip threshold to 3 digits.
torch::Tensor foreach_sum_squares(const std::vector<torch::Tensor>& gs) {
  const bool fp32 =
      std::all_of(gs.begin(), gs.end(), [](const torch::Tensor& g) { return g.scalar_type() == torch::kFloat32; });
  if (fp32) return torch::stack(at::_foreach_norm(gs, 2)).to(torch::kFloat64).pow(2).sum();
  auto total = torch::zeros({}, gs[0].options().dtype(torch::kFloat64));
  for (const auto& g : gs) total += sum_squares(g);
  return total;
}

std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB (%lld bytes)", static_cast<double>(bytes) / (1 << 20),
                static_cast<long long>(bytes));
  return buf;
}

}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, OptimConfig cfg, GradBuckets* sharded)
    : params_(std::move(params)), cfg_(cfg) {
  torch::NoGradGuard ng;
  int64_t numel = 0;
  for (const auto& p : params_) numel += p.second.numel();
  if (sharded && sharded->sharded()) {
    shard_ = sharded;
    if (shard_->params().size() != params_.size())
      throw Error("learner optimizer: the sharded gradient buckets hold " + std::to_string(shard_->params().size()) +
                  " parameters, the optimizer " + std::to_string(params_.size()));
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (shard_->params()[i].unsafeGetTensorImpl() != params_[i].second.unsafeGetTensorImpl())
        throw Error("learner optimizer: parameter " + std::to_string(i) + " ('" + params_[i].first +
                    "') is not the sharded gradient buckets' parameter " + std::to_string(i) +
                    " (both must be built from one list, in one order)");
    master_is_param_ = params_.empty() || params_[0].second.scalar_type() == torch::kFloat32;
    for (std::size_t b = 0; b < shard_->buckets(); ++b) {
      const auto slice = shard_->param_shard(b);
      master_.push_back(master_is_param_ ? slice : slice.to(torch::kFloat32).clone());
      exp_avg_.push_back(torch::zeros({slice.numel()}, slice.options().dtype(torch::kFloat32)));
      exp_avg_sq_.push_back(torch::zeros({slice.numel()}, slice.options().dtype(torch::kFloat32)));
    }
    auto* comm = shard_->comm();
    log_info("learner optimizer (", comm->name(), "): AdamW state ", mib(state_bytes()), " on this rank: fp32 moments",
             master_is_param_ ? " (fp32 parameters are their own master)" : " + fp32 master", " for ",
             shard_->padded_numel() / comm->world(), " of ", numel, " parameters (padded to ", shard_->padded_numel(),
             ", sharded over ", comm->world(), " ranks)");
    return;
  }
  int64_t masters = 0;
  for (const auto& p : params_) {
    exp_avg_.push_back(torch::zeros_like(p.second, p.second.options().dtype(torch::kFloat32)));
    exp_avg_sq_.push_back(torch::zeros_like(p.second, p.second.options().dtype(torch::kFloat32)));
    // A non-fp32 (bf16) parameter gets an fp32 master: updates far below the parameter's
    // own precision accumulate there instead of rounding away.
    const bool own = p.second.scalar_type() == torch::kFloat32;
    param_master_.push_back(own ? torch::Tensor() : p.second.detach().to(torch::kFloat32).clone());
    if (!own) masters += p.second.numel();
  }
  log_info("learner optimizer: AdamW state ", mib(state_bytes()), " on this rank: fp32 moments for all ", numel,
           " parameters", masters ? ", fp32 master copies of " + std::to_string(masters) + " non-fp32 ones" : "",
           " (not sharded)");
}

int64_t AdamW::state_bytes() const {
  int64_t n = 0;
  for (const auto& t : exp_avg_) n += t.numel();
  for (const auto& t : exp_avg_sq_) n += t.numel();
  if (!master_is_param_)
    for (const auto& t : master_) n += t.numel();
  for (const auto& t : param_master_)
    if (t.defined()) n += t.numel();
  return n * 4;
}

double AdamW::clip_grad_norm(double max_norm) {
  if (!shard_) {
    std::vector<torch::Tensor> ps;
    for (const auto& p : params_) ps.push_back(p.second);
    return kf::learner::clip_grad_norm(ps, max_norm, cfg_.fused_cuda);
  }
  torch::NoGradGuard ng;
  torch::Tensor total;
  if (fused() && shard_->buckets() > 0) {
    std::vector<torch::Tensor> gs;
    for (std::size_t b = 0; b < shard_->buckets(); ++b) gs.push_back(shard_->grad_shard(b));
    total = foreach_sum_squares(gs);
  } else {
    for (std::size_t b = 0; b < shard_->buckets(); ++b) {
      const auto s = sum_squares(shard_->grad_shard(b));
      total = total.defined() ? total + s : s;
    }
  }
  if (!total.defined())  // no parameters: a zero on the parameters' device
    total = torch::zeros({}, torch::TensorOptions()
                                 .dtype(torch::kFloat64)
                                 .device(params_.empty() ? torch::Device(torch::kCPU) : params_[0].second.device()));
  auto t = total.reshape({1}).contiguous();
  shard_->comm()->all_reduce_sum(t);
  const double norm = std::sqrt(t.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    if (fused()) {
      std::vector<torch::Tensor> gs;
      for (std::size_t b = 0; b < shard_->buckets(); ++b) gs.push_back(shard_->grad_shard(b));
      at::_foreach_mul_(gs, scale);
    } else {
      for (std::size_t b = 0; b < shard_->buckets(); ++b) shard_->grad_shard(b).mul_(scale);
    }
  }
  return norm;
}

void AdamW::step_sharded(double lr) {
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  auto* comm = shard_->comm();
  // The same operations, in the same order, as the unsharded update below: per element
  // the result is the same.
  for (std::size_t b = 0; b < shard_->buckets(); ++b) {
    auto& p = master_[b];
    const auto g = shard_->grad_shard(b).to(torch::kFloat32);
    if (fused()) {  // one bucket per launch, so bucket b's gather still overlaps b+1's update
      fused_adamw({p}, {g}, {exp_avg_[b]}, {exp_avg_sq_[b]}, steps_, lr, cfg_);
      if (!master_is_param_) shard_->param_shard(b).copy_(p);
      if (!shard_->params_sharded()) comm->all_gather_async(shard_->param_flat(b));
      continue;
    }
    if (cfg_.weight_decay != 0.0) p.mul_(1.0 - lr * cfg_.weight_decay);
    exp_avg_[b].lerp_(g, 1.0 - cfg_.beta1);
    exp_avg_sq_[b].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
    const auto denom = (exp_avg_sq_[b].sqrt() / bc2_sqrt).add_(cfg_.eps);
    p.addcdiv_(exp_avg_[b], denom, -step_size);
    if (!master_is_param_) shard_->param_shard(b).copy_(p);
    // NCCL: bucket b's gather overlaps bucket b+1's update. Sharded parameters stay
    // sliced: the next forward gathers them layer by layer.
    if (!shard_->params_sharded()) comm->all_gather_async(shard_->param_flat(b));
  }
  comm->synchronize();
}

void AdamW::step(double lr) {
  torch::NoGradGuard ng;
  if (shard_) {
    ++steps_;
    step_sharded(lr);
    return;
  }
  ++steps_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  if (fused()) {
    // fp32 gradients (fp32 parameters, or their masters' gradients in fp32 already) go to
    // one launch; a bf16 gradient takes the loop, where its fp32 copy lives one tensor at a time.
    std::vector<torch::Tensor> w, g, m, v;
    bool all_fp32 = true;
    for (std::size_t i = 0; i < params_.size() && all_fp32; ++i) {
      const auto& g0 = params_[i].second.grad();
      if (!g0.defined()) continue;
      all_fp32 = g0.scalar_type() == torch::kFloat32;
      w.push_back(param_master_[i].defined() ? param_master_[i] : params_[i].second);
      g.push_back(g0);
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
    }
    if (all_fp32) {
      fused_adamw(w, g, m, v, steps_, lr, cfg_);
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (param_master_[i].defined() && params_[i].second.grad().defined()) params_[i].second.copy_(param_master_[i]);
      return;
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g0 = p.grad();
    if (!g0.defined()) continue;
    const auto g = g0.to(torch::kFloat32);
    // fp32 parameters are their own master; others update the master and take its rounding.
    auto& w = param_master_[i].defined() ? param_master_[i] : p;
    if (cfg_.weight_decay != 0.0) w.mul_(1.0 - lr * cfg_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - cfg_.beta1);
    exp_avg_sq_[i].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
    const auto denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(cfg_.eps);
    w.addcdiv_(exp_avg_[i], denom, -step_size);
    if (param_master_[i].defined()) p.copy_(w);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (shard_) {
    // Bucket by bucket: all-gather each slice tensor into a whole bucket (device memory:
    // one bucket), rank 0 keeps the per-parameter pieces on CPU.
    torch::NoGradGuard ng;
    auto* comm = shard_->comm();
    const bool keep = comm->rank() == 0;
    const std::size_t n = params_.size();
    std::vector<torch::Tensor> m(n), v(n), w(n);
    for (std::size_t b = 0; b < shard_->buckets(); ++b) {
      auto gather = [&](const torch::Tensor& slice, std::vector<torch::Tensor>& into) {
        auto buf = torch::zeros({shard_->bucket_numel(b)}, slice.options());
        buf.narrow(0, shard_->shard_offset(b), shard_->shard_numel(b)).copy_(slice);
        comm->all_gather(buf);
        if (!keep) return;
        const auto cpu = buf.to(torch::kCPU);
        for (std::size_t i = 0; i < n; ++i) {
          if (shard_->bucket_of(static_cast<int64_t>(i)) != static_cast<int64_t>(b)) continue;
          const auto& p = params_[i].second;
          into[i] = cpu.narrow(0, shard_->offset_in_bucket(static_cast<int64_t>(i)), p.numel()).view(p.sizes()).clone();
        }
      };
      gather(exp_avg_[b], m);
      gather(exp_avg_sq_[b], v);
      if (!master_is_param_) gather(master_[b], w);
    }
    if (!keep) return out;
    for (std::size_t i = 0; i < n; ++i) {
      out.emplace_back(params_[i].first + ".exp_avg", m[i]);
      out.emplace_back(params_[i].first + ".exp_avg_sq", v[i]);
      if (!master_is_param_) out.emplace_back(params_[i].first + ".master", w[i]);
    }
    return out;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].first + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].first + ".exp_avg_sq", exp_avg_sq_[i]);
    if (param_master_[i].defined()) out.emplace_back(params_[i].first + ".master", param_master_[i]);
  }
  return out;
}

void AdamW::load_state_tensor(const std::string& name, const torch::Tensor& value) {
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& pn = params_[i].first;
    if (shard_) {
      // Sharded: this rank's slice of the whole tensor. A checkpoint written at any world
      // size (or unsharded) holds whole tensors, so this is also the re-shard.
      const bool is_m = name == pn + ".exp_avg", is_v = name == pn + ".exp_avg_sq", is_w = name == pn + ".master";
      if (!is_m && !is_v && !is_w) continue;
      const auto& p = params_[i].second;
      if (value.sizes() != p.sizes()) throw Error("optimizer state '" + name + "': shape mismatch with its parameter");
      if (is_w && master_is_param_) return;  // fp32 parameters come from model.safetensors
      const int64_t b = shard_->bucket_of(static_cast<int64_t>(i)),
                    off = shard_->offset_in_bucket(static_cast<int64_t>(i));
      const int64_t lo = shard_->shard_offset(b), hi = lo + shard_->shard_numel(b);
      const int64_t a = std::max(off, lo), e = std::min(off + p.numel(), hi);
      if (a >= e) return;  // no part of this parameter is in this rank's slice
      const auto src = value.reshape({-1}).narrow(0, a - off, e - a);
      auto& dst = is_m ? exp_avg_[b] : is_v ? exp_avg_sq_[b] : master_[b];
      dst.narrow(0, a - lo, e - a).copy_(src);
      return;
    }
    if (name == pn + ".master") {  // without a master of its own (fp32) the parameter is loaded
      if (!param_master_[i].defined()) return;
      if (value.sizes() != params_[i].second.sizes())
        throw Error("optimizer state '" + name + "': shape mismatch with its parameter");
      param_master_[i].copy_(value);
      return;
    }
    torch::Tensor* dst = nullptr;
    if (name == pn + ".exp_avg")
      dst = &exp_avg_[i];
    else if (name == pn + ".exp_avg_sq")
      dst = &exp_avg_sq_[i];
    if (!dst) continue;
    if (dst->sizes() != value.sizes()) throw Error("optimizer state '" + name + "': shape mismatch with its parameter");
    dst->copy_(value);
    return;
  }
  throw Error("optimizer state '" + name + "': no such parameter");
}

void AdamW::load_param_value(const std::string& name, const torch::Tensor& value) {
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].first != name) continue;
    const auto& p = params_[i].second;
    if (value.sizes() != p.sizes()) throw Error("parameter '" + name + "': shape mismatch with the optimizer's");
    if (!shard_) {
      if (param_master_[i].defined()) param_master_[i].copy_(value);
      return;
    }
    if (master_is_param_) return;
    const int64_t b = shard_->bucket_of(static_cast<int64_t>(i)),
                  off = shard_->offset_in_bucket(static_cast<int64_t>(i));
    const int64_t lo = shard_->shard_offset(b), hi = lo + shard_->shard_numel(b);
    const int64_t a = std::max(off, lo), e = std::min(off + p.numel(), hi);
    if (a < e) master_[b].narrow(0, a - lo, e - a).copy_(value.reshape({-1}).narrow(0, a - off, e - a));
    return;
  }
  throw Error("parameter '" + name + "': not one the optimizer updates");
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm, bool fused_cuda) {
  torch::NoGradGuard ng;
  torch::Tensor total;
  std::vector<torch::Tensor> gs;
  for (const auto& p : params)
    if (p.grad().defined()) gs.push_back(p.grad());
  const bool fused = fused_cuda && !gs.empty() && gs[0].is_cuda();
  if (fused) {
    total = foreach_sum_squares(gs);
  } else {
    for (const auto& g : gs) {
      const auto s = sum_squares(g);
      total = total.defined() ? total + s : s;
    }
  }
  if (!total.defined()) return 0.0;
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    if (fused) {
      at::_foreach_mul_(gs, scale);
    } else {
      for (auto& g : gs) g.mul_(scale);
    }
  }
  return norm;
}

}  // namespace kf::learner
