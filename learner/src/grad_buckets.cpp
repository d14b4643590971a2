#include "grad_buckets.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdio>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/policy/policy.h"

namespace kf::learner {
namespace {

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradBuckets* b, int64_t i) : buckets(b), index(i) {}
  void operator()(const torch::autograd::Variable&) override { buckets->on_grad_ready(index); }
  GradBuckets* buckets;
  int64_t index;
};

constexpr std::size_t kMaxInFlight = 3;  // sharded gradients: reductions not yet accumulated

}  // namespace

GradBuckets::GradBuckets(const std::vector<std::pair<std::string, torch::Tensor>>& params, std::size_t bucket_bytes,
                         Communicator* comm, ShardMode mode, const std::vector<int64_t>& groups)
    : comm_(comm),
      sharded_(mode != ShardMode::none),
      grads_sharded_(mode == ShardMode::gradients || mode == ShardMode::params),
      params_sharded_(mode == ShardMode::params) {
  torch::NoGradGuard ng;
  const int64_t n = static_cast<int64_t>(params.size());
  bucket_of_.assign(n, -1);
  offset_of_.assign(n, 0);
  seen_.assign(n, 0);
  for (const auto& p : params) params_.push_back(p.second);
  if (sharded_) {
    if (!comm_) throw Error("learner gradient buckets: sharded mode needs a communicator");
    rank_ = comm_->rank();
    world_ = comm_->world();
    for (const auto& p : params)
      if (p.second.scalar_type() != params_[0].scalar_type() || p.second.device() != params_[0].device())
        throw Error("learner gradient buckets (" + comm_->name() + "): parameter '" + p.first + "' is " +
                    std::string(c10::toString(p.second.scalar_type())) + " on " + p.second.device().str() +
                    ", the first one " + std::string(c10::toString(params_[0].scalar_type())) + " on " +
                    params_[0].device().str() + ": sharding needs one dtype and device");
  }
  if (params_sharded_ && static_cast<int64_t>(groups.size()) != n)
    throw Error("learner gradient buckets: sharded parameters need a group per parameter (" +
                std::to_string(groups.size()) + " groups for " + std::to_string(n) + " parameters)");
  const auto gdtype = sharded_ && n > 0 ? params_[0].scalar_type() : torch::kFloat32;
  // Reverse order: the last layers' gradients come first in backward.
  std::vector<std::vector<int64_t>> members;
  std::vector<int64_t> elems;
  std::vector<int64_t> group_seen;
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t numel = params_[i].numel();
    const bool split =
        params_sharded_
            ? members.empty() || groups[i] != groups[members.back().back()]
            : members.empty() || (elems.back() > 0 && (elems.back() + numel) * 4 > static_cast<int64_t>(bucket_bytes));
    if (split && params_sharded_) {
      if (std::find(group_seen.begin(), group_seen.end(), groups[i]) != group_seen.end())
        throw Error("learner gradient buckets: parameter '" + params[i].first + "' of group " +
                    std::to_string(groups[i]) + " is not next to the rest of its group");
      group_seen.push_back(groups[i]);
    }
    if (split) {
      members.emplace_back();
      elems.push_back(0);
    }
    members.back().push_back(i);
    bucket_of_[i] = static_cast<int64_t>(members.size()) - 1;
    elems.back() += numel;
  }
  // Sharded: world equal slices per bucket, each a multiple of 64 elements (aligned).
  const int64_t align = sharded_ ? world_ * 64 : 1;
  for (std::size_t b = 0; b < members.size(); ++b) {
    const int64_t len = (elems[b] + align - 1) / align * align;
    bucket_len_.push_back(len);
    torch::Tensor flat, pflat;
    if (!grads_sharded_) flat = torch::zeros({len}, params_[0].options().dtype(gdtype));
    if (sharded_) pflat = torch::zeros({len}, params_[0].options());
    int64_t off = 0;
    for (int64_t i : members[b]) {
      auto& p = params_[i];
      offset_of_[i] = off;
      if (sharded_) {
        auto view = pflat.narrow(0, off, p.numel()).view(p.sizes());
        view.copy_(p.detach());
        p.set_data(view);  // every handle to this parameter (the model's too) now uses the bucket
      }
      if (!grads_sharded_) p.mutable_grad() = flat.narrow(0, off, p.numel()).view(p.sizes());
      off += p.numel();
    }
    if (!grads_sharded_) flat_.push_back(flat);
    if (sharded_) param_flat_.push_back(pflat);
    if (params_sharded_) {
      pshard_.push_back(pflat.narrow(0, rank_ * (len / world_), len / world_).clone());
      gathered_.push_back(1);
      gather_mark_.emplace_back();
      release(static_cast<int64_t>(b));
    }
    if (grads_sharded_) {
      acc_.push_back(torch::zeros({len / world_}, params_[0].options().dtype(torch::kFloat32)));
      staging_.emplace_back();
    }
    bucket_size_.push_back(static_cast<int64_t>(members[b].size()));
  }
  pending_ = bucket_size_;
  for (int64_t i = 0; i < n; ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<ReadyHook>(this, i));
  if (sharded_) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(gradient_bytes()) / (1 << 20));
    log_info("learner gradient buckets (", comm_->name(), "): ", members.size(), " buckets, gradient memory ", mib,
             " (", gradient_bytes(), " bytes) on this rank: ",
             grads_sharded_ ? "fp32 accumulators for this rank's slices (sharded gradients), plus the buckets in flight"
                            : "full buckets (gradients not sharded)");
  }
  if (params_sharded_) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(param_storage_bytes()) / (1 << 20));
    log_info("learner gradient buckets (", comm_->name(), "): parameters sharded, one bucket per layer: ", mib, " (",
             param_storage_bytes(), " bytes) of parameters on this rank between uses");
  }
}

// ---- sharded parameters ----

void GradBuckets::gather(int64_t b) {
  if (!params_sharded_ || gathered_[b]) return;
  torch::NoGradGuard ng;
  auto& f = param_flat_[b];
  // The parameters are views into f: giving its storage memory again makes them valid.
  auto* s = f.storage().unsafeGetStorageImpl();
  const std::size_t nbytes = static_cast<std::size_t>(f.numel()) * f.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
  f.narrow(0, shard_offset(b), shard_numel(b)).copy_(pshard_[b]);
  comm_->all_gather_async(f);
  gather_mark_[b] = comm_->mark();
  gathered_[b] = 1;
}

void GradBuckets::wait_gathered(int64_t b) {
  if (!params_sharded_ || !gather_mark_[b]) return;
  comm_->wait_for(gather_mark_[b]);
  gather_mark_[b].reset();
}

void GradBuckets::release(int64_t b) {
  if (!params_sharded_ || !gathered_[b]) return;
  // With NCCL the gather recorded its stream on this memory: the caching allocator reuses
  // it only after that stream is done, and the compute stream's own uses come first in order.
  auto* s = param_flat_[b].storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, param_flat_[b].device()));
  s->set_nbytes(0);
  gathered_[b] = 0;
  gather_mark_[b].reset();
}

void GradBuckets::gather_all() {
  if (!params_sharded_) return;
  for (std::size_t b = 0; b < param_flat_.size(); ++b) gather(static_cast<int64_t>(b));
  for (std::size_t b = 0; b < param_flat_.size(); ++b) wait_gathered(static_cast<int64_t>(b));
}

void GradBuckets::release_all() {
  for (std::size_t b = 0; b < param_flat_.size(); ++b) release(static_cast<int64_t>(b));
}

void GradBuckets::store_shards() {
  if (!params_sharded_) return;
  torch::NoGradGuard ng;
  for (std::size_t b = 0; b < param_flat_.size(); ++b) {
    if (!gathered_[b])
      throw Error("learner gradient buckets: store_shards with bucket " + std::to_string(b) + " released");
    pshard_[b].copy_(param_flat_[b].narrow(0, shard_offset(b), shard_numel(b)));
  }
}

int64_t GradBuckets::param_storage_bytes() const {
  int64_t n = 0;
  for (const auto& f : param_flat_) n += static_cast<int64_t>(f.storage().nbytes());
  for (const auto& p : pshard_) n += static_cast<int64_t>(p.storage().nbytes());
  return n;
}

GradBuckets::~GradBuckets() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

int64_t GradBuckets::padded_numel() const {
  int64_t n = 0;
  for (int64_t l : bucket_len_) n += l;
  return n;
}

int64_t GradBuckets::gradient_bytes() const {
  int64_t n = 0;
  for (const auto& f : flat_) n += f.numel() * f.element_size();
  for (const auto& a : acc_) n += a.numel() * a.element_size();
  return n;
}

void GradBuckets::zero() {
  for (auto& f : flat_) f.zero_();
  for (auto& a : acc_) a.zero_();
  if (grads_sharded_) launched_in_backward_ = 0;
}

void GradBuckets::arm() {
  if (grads_sharded_) return;  // every backward reduces; rounds keep their own state
  armed_ = true;
  next_launch_ = 0;
  launched_in_backward_ = 0;
  pending_ = bucket_size_;
}

void GradBuckets::on_grad_ready(int64_t param) {
  if (grads_sharded_) {
    stage(param);
    return;
  }
  if (!armed_) return;
  const int64_t b = bucket_of_[param];
  if (pending_[b] > 0) --pending_[b];
  launch_ready_in_order(true);
}

void GradBuckets::launch_ready_in_order(bool in_backward) {
  while (next_launch_ < static_cast<int64_t>(bucket_len_.size()) && (!in_backward || pending_[next_launch_] == 0)) {
    if (grads_sharded_)
      launch(next_launch_);
    else if (comm_ && sharded_)
      comm_->reduce_scatter_async(flat_[next_launch_]);
    else if (comm_)
      comm_->all_reduce_async(flat_[next_launch_]);
    if (in_backward) ++launched_in_backward_;
    ++next_launch_;
  }
}

void GradBuckets::finish() {
  if (grads_sharded_) {
    if (round_open_) flush_round();
    while (open_round(false)) flush_round();  // the others' remaining rounds, with zeros
    drain();
    if (comm_) comm_->synchronize();
    return;
  }
  if (!armed_) arm();
  launch_ready_in_order(false);
  if (comm_) comm_->synchronize();
  armed_ = false;
}

// ---- sharded gradients ----

void GradBuckets::stage(int64_t param) {
  torch::NoGradGuard ng;
  if (round_open_ && seen_[param]) flush_round();  // a second backward: the open round is over
  if (!round_open_ && !open_round(true))
    throw Error("learner gradient buckets (" + comm_->name() +
                "): a round opened by this rank reports no rank working");
  auto& p = params_[param];
  const int64_t b = bucket_of_[param];
  if (!staging_[b].defined()) staging_[b] = torch::zeros({bucket_len_[b]}, p.options());
  const auto g = p.grad();
  if (g.defined()) {
    staging_[b].narrow(0, offset_of_[param], p.numel()).view(p.sizes()).add_(g);
    p.mutable_grad() = torch::Tensor();  // freed: the staging buffer holds it now
  }
  seen_[param] = 1;
  if (pending_[b] > 0) --pending_[b];
  launch_ready_in_order(true);
}

void GradBuckets::launch(int64_t b) {
  if (!staging_[b].defined()) staging_[b] = torch::zeros({bucket_len_[b]}, params_[0].options());
  comm_->reduce_scatter_async(staging_[b]);
  release(b);  // sharded parameters: the bucket's gradients are in, backward is done with its weights
  in_flight_.push_back(b);
  if (in_flight_.size() >= kMaxInFlight) drain();
}

void GradBuckets::drain() {
  if (in_flight_.empty()) return;
  torch::NoGradGuard ng;
  comm_->synchronize();  // NCCL: this stream waits for the reductions; shm and local: done already
  for (int64_t b : in_flight_) {
    acc_[b].add_(staging_[b].narrow(0, shard_offset(b), shard_numel(b)));
    staging_[b] = torch::Tensor();
  }
  in_flight_.clear();
}

bool GradBuckets::open_round(bool working) {
  drain();  // a bucket is staged again in the new round: its last reduction must be accumulated first
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  if (!params_.empty()) opts = opts.device(params_[0].device());
  auto flag = torch::full({1}, working ? 1.0 : 0.0, opts);
  comm_->all_reduce_sum(flag);
  const bool any = flag.to(torch::kCPU).item<double>() > 0;
  round_open_ = any;
  if (any) {
    next_launch_ = 0;
    pending_ = bucket_size_;
    std::fill(seen_.begin(), seen_.end(), 0);
  }
  return any;
}

void GradBuckets::flush_round() {
  launch_ready_in_order(false);
  round_open_ = false;
}

// ---- the model's hooks over sharded parameters ----

namespace {

class LayerGathers : public policy::ParamHooks {
 public:
  LayerGathers(GradBuckets* b, std::vector<int64_t> layer_bucket, std::vector<int64_t> outer)
      : b_(b), layer_(std::move(layer_bucket)), outer_(std::move(outer)) {}
  void pre_forward(int64_t l) override {
    if (l < 0) {
      for (int64_t o : outer_) b_->gather(o);
      if (!layer_.empty()) b_->gather(layer_[0]);
      for (int64_t o : outer_) b_->wait_gathered(o);
      return;
    }
    b_->gather(layer_[l]);  // issued during the layer before: a no-op then
    if (l + 1 < static_cast<int64_t>(layer_.size())) b_->gather(layer_[l + 1]);
    b_->wait_gathered(layer_[l]);  // not for l + 1's, which runs while layer l computes
  }
  void post_forward(int64_t l) override { b_->release(layer_[l]); }
  void pre_backward(int64_t l) override {
    b_->gather(layer_[l]);
    if (l > 0) b_->gather(layer_[l - 1]);
    b_->wait_gathered(layer_[l]);  // nor for a reduce-scatter queued after that gather
  }

 private:
  GradBuckets* b_;
  std::vector<int64_t> layer_, outer_;
};

}  // namespace

std::vector<int64_t> layer_groups(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  static const std::string pre = "model.layers.";
  std::vector<int64_t> g;
  for (const auto& [name, t] : params) {
    if (name.rfind(pre, 0) == 0)
      g.push_back(std::stoll(name.substr(pre.size())));
    else if (name.rfind("model.embed_tokens.", 0) == 0)
      g.push_back(-2);
    else
      g.push_back(-1);
  }
  return g;
}

std::unique_ptr<policy::ParamHooks> layer_gathers(GradBuckets& buckets, const std::vector<int64_t>& groups,
                                                  int64_t layers) {
  if (!buckets.params_sharded()) throw Error("learner: layer gathers need gradient buckets with sharded parameters");
  std::vector<int64_t> layer_bucket(layers, -1), outer;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const int64_t g = groups[i], b = buckets.bucket_of(static_cast<int64_t>(i));
    if (g >= 0 && g < layers)
      layer_bucket[g] = b;
    else if (std::find(outer.begin(), outer.end(), b) == outer.end())
      outer.push_back(b);
  }
  for (int64_t l = 0; l < layers; ++l)
    if (layer_bucket[l] < 0)
      throw Error("learner: decoder layer " + std::to_string(l) + " has no trainable parameter to shard");
  return std::make_unique<LayerGathers>(&buckets, std::move(layer_bucket), std::move(outer));
}

}  // namespace kf::learner
