#include "kf/learner/grad_buckets.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "kf/common/error.h"

namespace kf::learner {
namespace {

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradBuckets* b, int64_t i) : buckets(b), index(i) {}
  void operator()(const torch::autograd::Variable&) override { buckets->on_grad_ready(index); }
  GradBuckets* buckets;
  int64_t index;
};

}  // namespace

GradBuckets::GradBuckets(const std::vector<std::pair<std::string, torch::Tensor>>& params, std::size_t bucket_bytes,
                         Communicator* comm, bool sharded)
    : comm_(comm), sharded_(sharded) {
  torch::NoGradGuard ng;
  const int64_t n = static_cast<int64_t>(params.size());
  bucket_of_.assign(n, -1);
  offset_of_.assign(n, 0);
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
  const auto gdtype = sharded_ && n > 0 ? params_[0].scalar_type() : torch::kFloat32;
  // Reverse order: the last layers' gradients come first in backward.
  std::vector<std::vector<int64_t>> members;
  std::vector<int64_t> elems;
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t numel = params_[i].numel();
    if (members.empty() || (elems.back() > 0 && (elems.back() + numel) * 4 > static_cast<int64_t>(bucket_bytes))) {
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
    auto flat = torch::zeros({len}, params_[0].options().dtype(gdtype));
    torch::Tensor pflat;
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
      p.mutable_grad() = flat.narrow(0, off, p.numel()).view(p.sizes());
      off += p.numel();
    }
    flat_.push_back(flat);
    if (sharded_) param_flat_.push_back(pflat);
    bucket_size_.push_back(static_cast<int64_t>(members[b].size()));
  }
  pending_ = bucket_size_;
  for (int64_t i = 0; i < n; ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<ReadyHook>(this, i));
}

GradBuckets::~GradBuckets() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

int64_t GradBuckets::padded_numel() const {
  int64_t n = 0;
  for (const auto& f : flat_) n += f.numel();
  return n;
}

void GradBuckets::zero() {
  for (auto& f : flat_) f.zero_();
}

void GradBuckets::arm() {
  armed_ = true;
  next_launch_ = 0;
  launched_in_backward_ = 0;
  pending_ = bucket_size_;
}

void GradBuckets::on_grad_ready(int64_t param) {
  if (!armed_) return;
  const int64_t b = bucket_of_[param];
  if (pending_[b] > 0) --pending_[b];
  launch_ready_in_order(true);
}

void GradBuckets::launch_ready_in_order(bool in_backward) {
  while (next_launch_ < static_cast<int64_t>(flat_.size()) && (!in_backward || pending_[next_launch_] == 0)) {
    if (comm_ && sharded_) comm_->reduce_scatter_async(flat_[next_launch_]);
    else if (comm_) comm_->all_reduce_async(flat_[next_launch_]);
    if (in_backward) ++launched_in_backward_;
    ++next_launch_;
  }
}

void GradBuckets::finish() {
  if (!armed_) arm();
  launch_ready_in_order(false);
  if (comm_) comm_->synchronize();
  armed_ = false;
}

}  // namespace kf::learner
