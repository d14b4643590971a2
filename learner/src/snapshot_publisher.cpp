#include "snapshot_publisher.h"
#include "kf/learner/learner.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/policy/policy.h"

#ifdef KF_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kf::learner {

std::map<std::string, std::string> lora_metadata(const policy::LoraConfig& c) {
  std::string targets;
  for (const auto& t : c.targets) targets += (targets.empty() ? "" : ",") + t;
  char alpha[32];
  std::snprintf(alpha, sizeof alpha, "%.17g", c.alpha);
  return {{"kf_lora_rank", std::to_string(c.rank)}, {"kf_lora_alpha", alpha}, {"kf_lora_targets", targets}};
}

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

SnapshotPublisher::SnapshotPublisher(policy::CausalLM model, replay::SnapshotStore* store, torch::ScalarType dtype)
    : model_(std::move(model)), store_(store), dtype_(dtype) {
  cuda_ = model_->options().device().is_cuda();
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  // A LoRA model publishes its adapters only: the actors hold the same frozen base.
  const auto& lora = model_->lora();
  for (const auto& p : model_->named_parameters())
    if (lora.rank == 0 || policy::is_lora_param(p.key())) params.emplace_back(p.key(), p.value());
  const std::size_t es = torch::elementSize(dtype);
  for (const auto& [name, t] : params) {
    const uint64_t n = static_cast<uint64_t>(t.numel()) * es;
    header[name] = {
        {"dtype", policy::safetensors_dtype(dtype)}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"}, {"kf_version", "-1"}};
  if (lora.rank > 0) {
    for (const auto& [k, v] : lora_metadata(lora)) header["__metadata__"][k] = v;
  }
  std::string hs = header.dump();
  // The version is patched in place at publish time: reserve room for any int64.
  const std::string marker = "\"kf_version\":\"-1\"";
  const auto pos = hs.find(marker);
  hs.replace(pos, marker.size(), "\"kf_version\":\"-1" + std::string(20, ' ') + "\"");
  while ((8 + hs.size()) % 8) hs.push_back(' ');
  const uint64_t hlen = hs.size();
  blob_bytes_ = 8 + hlen + off;
  auto host_opts = torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(cuda_);
  host_ = torch::empty({static_cast<int64_t>(blob_bytes_)}, host_opts);
  auto* base = host_.data_ptr<unsigned char>();
  std::memcpy(base, &hlen, 8);
  std::memcpy(base + 8, hs.data(), hlen);
  uint64_t data_off = 8 + hlen;
  for (const auto& [name, t] : params) {
    Slot s;
    s.name = name;
    s.param = t;
    s.host_view = torch::from_blob(base + data_off, t.sizes(), torch::TensorOptions().dtype(dtype));
    if (cuda_) s.staging = torch::empty(t.sizes(), t.options().dtype(dtype));
    data_off += static_cast<uint64_t>(t.numel()) * es;
    slots_.push_back(std::move(s));
  }
  stats_.blob_bytes = blob_bytes_;
  if (store_ && store_->max_bytes() < blob_bytes_)
    throw Error("learner snapshot publisher: the weights blob is " + std::to_string(blob_bytes_) +
                " bytes but the snapshot store holds at most " + std::to_string(store_->max_bytes()) +
                " (raise replay.snapshot.max_bytes, or learner.snapshot.dtype: bf16)");
}

SnapshotPublisher::~SnapshotPublisher() {
  if (worker_.joinable()) worker_.join();
}

void SnapshotPublisher::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void SnapshotPublisher::publish(int64_t version) {
  const double t0 = now_ms();
  wait();
  // Versions only grow: a learner restarted from an older checkpoint (or before its first
  // one) would otherwise publish numbers the store already gave to other weights. It
  // publishes again once its version passes the store's newest; until then the actors
  // keep sampling from that newest snapshot.
  static bool holding_back = false;  // publish() runs on the rank-0 training thread only
  static int64_t last_own = -1;      // this process's newest published version
  if (store_) {
    const int64_t newest = store_->latest().version;
    if (version <= newest) {
      if (version == newest && newest == last_own) return;  // these weights are already out
      if (!holding_back)
        log_warn("learner snapshot publisher: the store already holds version ", newest,
                 " (from an earlier learner process); not publishing version ", version,
                 " under a number that names other weights; publishing resumes at version ", newest + 1);
      holding_back = true;
      return;
    }
    if (holding_back) log_info("learner snapshot publisher: publishing again at version ", version);
    holding_back = false;
    last_own = version;
  }
  torch::NoGradGuard ng;
  // Patch the version into the header's reserved field.
  {
    auto* base = host_.data_ptr<unsigned char>();
    uint64_t hlen;
    std::memcpy(&hlen, base, 8);
    std::string h(reinterpret_cast<char*>(base + 8), hlen);
    const auto pos = h.find("\"kf_version\":\"");
    const auto start = pos + 14;
    const auto end = h.find('"', start);
    std::string v = std::to_string(version);
    v.resize(end - start, ' ');
    std::memcpy(base + 8 + start, v.data(), v.size());
  }
  if (cuda_) {
#ifdef KF_HAVE_CUDA
    for (auto& s : slots_) s.staging.copy_(s.param);
    auto ev = std::make_shared<at::cuda::CUDAEvent>();
    ev->record(c10::cuda::getCurrentCUDAStream());
    ready_event_ = ev;
#endif
  } else {
    for (auto& s : slots_) s.host_view.copy_(s.param);
  }
  const double stall = now_ms() - t0;
  worker_ = std::thread([this, version, stall, t0] {
    try {
      background(version, stall, t0);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  stats_.last_stall_ms = stall;
  stats_.max_stall_ms = std::max(stats_.max_stall_ms, stall);
  stats_.total_stall_ms += stall;
  ++stats_.publishes;
}

void SnapshotPublisher::background(int64_t version, double, double t0) {
  if (cuda_) {
#ifdef KF_HAVE_CUDA
    const auto dev = model_->options().device();
    c10::cuda::CUDAGuard guard(dev);
    auto stream = c10::cuda::getStreamFromPool(false, dev.index());
    c10::cuda::CUDAStreamGuard sg(stream);
    std::static_pointer_cast<at::cuda::CUDAEvent>(ready_event_)->block(stream);
    for (auto& s : slots_) s.host_view.copy_(s.staging, /*non_blocking=*/true);
    stream.synchronize();
#endif
  }
  if (store_) store_->publish(version, host_.data_ptr<unsigned char>(), blob_bytes_, 4);
  stats_.last_total_ms = now_ms() - t0;
}

int64_t load_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context) {
  const auto h = policy::st_parse(static_cast<const uint8_t*>(data), bytes, context);
  const bool adapters = h.metadata.count("kf_lora_rank") > 0;
  if (adapters && model->lora().rank == 0)
    throw Error(context + ": an adapter-only (LoRA) blob, but the model has no adapters");
  torch::NoGradGuard ng;
  auto params = model->named_parameters();
  std::size_t expected = 0;
  for (const auto& p : params)
    if (!adapters || policy::is_lora_param(p.key())) ++expected;
  std::size_t matched = 0;
  for (const auto& t : h.tensors) {
    auto* p = params.find(t.name);
    if (!p) throw Error(context + ": tensor '" + t.name + "' is not a parameter of the model");
    const auto dtype = policy::dtype_from_name(t.dtype, context + ": tensor '" + t.name + "'");
    if (p->sizes().vec() != t.shape) throw Error(context + ": tensor '" + t.name + "': shape mismatch");
    auto src = torch::from_blob(const_cast<uint8_t*>(static_cast<const uint8_t*>(data)) + t.offset, t.shape,
                                torch::TensorOptions().dtype(dtype));
    p->copy_(src);
    ++matched;
  }
  if (matched != expected)
    throw Error(context + ": blob has " + std::to_string(matched) + " of the model's " + std::to_string(expected) +
                (adapters ? " adapter" : "") + " parameters");
  auto it = h.metadata.find("kf_version");
  if (it == h.metadata.end()) return -1;
  return std::stoll(it->second);
}

}  // namespace kf::learner
