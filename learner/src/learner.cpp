#include "kf/learner/learner.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "batch.h"
#include "checkpoint.h"
#include "grad_buckets.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/policy/policy.h"
#include "loss.h"
#include "optimizer.h"
#include "snapshot_publisher.h"

#ifdef KF_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace kf::learner {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// bf16 autocast for the forward pass on CUDA (weights and optimizer stay fp32).
struct AutocastGuard {
  bool on;
  explicit AutocastGuard(bool enable) : on(enable) {
    if (!on) return;
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
  }
};

std::string to_hex(const torch::Tensor& bytes) {
  const auto t = bytes.contiguous().to(torch::kCPU);
  const auto* p = t.data_ptr<uint8_t>();
  std::string s;
  s.reserve(t.numel() * 2);
  const char* d = "0123456789abcdef";
  for (int64_t i = 0; i < t.numel(); ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

torch::Tensor from_hex(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) p[i / 2] = static_cast<uint8_t>(v(s[i]) << 4 | v(s[i + 1]));
  return t;
}

// The start-up line's words on recomputation: which layers, when not all.
std::string recompute_note(bool on, int64_t layers, const policy::ModelConfig& mc) {
  if (!on || layers == 0) return "";
  if (layers < 0 || layers >= mc.num_hidden_layers) return ", layers recomputed in backward";
  return ", " + std::to_string(layers) + " of " + std::to_string(mc.num_hidden_layers) +
         " layers recomputed in backward";
}

}  // namespace

std::vector<std::pair<std::string, double>> step_scalars(const StepStats& st) {
  std::vector<std::pair<std::string, double>> out = {{"loss", st.loss},
                                                     {"grpo_loss", st.grpo_loss},
                                                     {"pairwise_loss", st.pairwise_loss},
                                                     {"kl", st.kl},
                                                     {"clip_fraction", st.clip_fraction},
                                                     {"mean_ratio", st.mean_ratio},
                                                     {"kl_behaviour", st.kl_behaviour},
                                                     {"entropy", st.entropy},
                                                     {"grad_norm", st.grad_norm},
                                                     {"lr", st.lr},
                                                     {"response_length_mean", st.response_length_mean},
                                                     {"response_length_max", double(st.response_length_max)},
                                                     {"sequences", double(st.sequences)},
                                                     {"tokens", double(st.tokens)},
                                                     {"pairs", double(st.pairs)},
                                                     {"micro_batches", double(st.micro_batches)},
                                                     {"publish_stall_ms", st.publish_stall_ms},
                                                     {"checkpoint_seconds", st.checkpoint_seconds},
                                                     {"take_seconds", st.take_seconds},
                                                     {"gpu_wait_seconds", st.gpu_wait_seconds},
                                                     {"buckets_in_backward", double(st.buckets_in_backward)},
                                                     {"padding_fraction", st.padding_fraction}};
  if (st.kl_start >= 0) out.emplace_back("kl_start", st.kl_start);
  // Truncation is known only when the model names its end-of-sequence ids.
  if (st.truncated_fraction >= 0) out.emplace_back("truncated_fraction", st.truncated_fraction);
  return out;
}

policy::ModelConfig model_shape(const std::string& name) { return policy::named_model_shape(name); }

struct Learner::Impl {
  NamedTensors params;  // trainable, name order
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradBuckets> buckets;
  std::unique_ptr<policy::ParamHooks> gathers;  // sharded parameters only (layer_gathers)
  bool params_sharded = false;
  bool any_publisher = false;  // sharded parameters: rank 0 publishes (every rank gathers for it)
  std::unique_ptr<SnapshotPublisher> publisher;
  policy::CausalLM reference{nullptr};
  policy::GpuShare gpu_share;  // shared hold of a GPU the run's evaluator may be timing on
  bool autocast = false;
  bool reference_is_base = false;  // LoRA: reference log-probs from the model, adapters off
  bool kl_start = false;           // log kl_start: KL to the start policy (the reference)
  std::string config_json;
};

Learner::Learner(LearnerConfig cfg, LearnerDeps deps) : cfg_(std::move(cfg)), deps_(deps), impl_(new Impl) {
  if (!deps_.comm) throw Error("learner: no communicator given");
  if (!deps_.source) throw Error("learner: no group source given");
  const auto dev = deps_.device;
  impl_->gpu_share = policy::GpuShare(dev);
  if (cfg_.deterministic) {
    // On CUDA some kernels have no deterministic version (and cuBLAS needs
    // CUBLAS_WORKSPACE_CONFIG): warn there instead of failing. Exact resume is a CPU promise.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/dev.is_cuda());
    torch::manual_seed(cfg_.seed);
  }
  if (cfg_.precision == "bf16" && !dev.is_cuda())
    throw Error("learner.precision: bf16 autocast needs a CUDA device (this learner runs on CPU)");
  impl_->autocast = dev.is_cuda() && cfg_.precision != "fp32";
  const bool lora = cfg_.lora_rank > 0;
  if (lora && cfg_.shard == ShardMode::params)
    throw Error(
        "learner.dist.shard: params (ZeRO-3) cannot be combined with learner.lora.rank > 0 (LoRA trains "
        "small adapters on a frozen base that every rank holds whole); use learner.dist.shard: gradients or "
        "none with LoRA");
  // The weights' dtype (learner.param_dtype). bf16 weights keep an fp32 master copy in the
  // optimizer. "auto": with LoRA the frozen base in the compute dtype (bf16 under autocast;
  // the adapters are fp32 anyway); full fine-tuning bf16 only when sharded under autocast,
  // where it cuts the per-rank state (unsharded, bf16 weights + grads + an fp32 master take
  // as many bytes as fp32 weights + grads, and only cost the fp32 residual stream).
  torch::ScalarType base_dtype;
  if (cfg_.param_dtype == "fp32")
    base_dtype = torch::kFloat32;
  else if (cfg_.param_dtype == "bf16")
    base_dtype = torch::kBFloat16;
  else if (cfg_.param_dtype == "auto")
    base_dtype = impl_->autocast && (lora || cfg_.shard != ShardMode::none) ? torch::kBFloat16 : torch::kFloat32;
  else
    throw Error("learner.param_dtype: '" + cfg_.param_dtype + "' is not one of auto, fp32, bf16");
  const auto opts = torch::TensorOptions().dtype(base_dtype).device(dev);
  policy::ModelConfig mc;
  if (!cfg_.policy.empty()) {
    auto p = policy::load_policy(cfg_.policy, dev, base_dtype);
    model_ = p.model;
    mc = p.config;
    const std::string tok = cfg_.policy + "/tokenizer.json";
    std::ifstream in(tok, std::ios::binary);
    if (in) tokenizer_json_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else {
    mc = model_shape(cfg_.init_shape);
    model_ = policy::CausalLM(mc, opts);
    model_->init_random(cfg_.seed);
  }
  int64_t model_params = 0;
  for (const auto& p : model_->parameters()) model_params += p.numel();
  // Large models recompute decoder layers in backward by default: their activations at
  // thousands of tokens per sequence outgrow the memory the weights leave.
  const bool recompute =
      cfg_.gradient_checkpointing || (cfg_.recompute_min_params > 0 && model_params >= cfg_.recompute_min_params);
  model_->set_gradient_checkpointing(recompute);
  model_->set_recompute_layers(cfg_.recompute_layers);
  model_->train();
  impl_->config_json = policy::model_config_to_json(mc);
  // Rank 0's weights are everyone's (random init or a checkpoint on a shared disk).
  {
    torch::NoGradGuard ng;
    for (auto& p : model_->named_parameters()) {
      auto& t = p.value();
      // The communicators broadcast fp32; bf16 goes through fp32 and back exactly.
      auto flat = t.detach().contiguous().view({-1});
      if (flat.scalar_type() != torch::kFloat32) flat = flat.to(torch::kFloat32);
      deps_.comm->broadcast(flat, 0);
      if (flat.data_ptr() != t.data_ptr()) t.view({-1}).copy_(flat);
    }
  }
  if (lora) {
    policy::LoraConfig lc;
    lc.rank = cfg_.lora_rank;
    lc.alpha = cfg_.lora_alpha;
    lc.targets = cfg_.lora_targets;
    // Same seed on every rank: the same adapters everywhere (B = 0: the base's outputs).
    model_->enable_lora(lc, cfg_.seed + 1, torch::kFloat32);
    if (cfg_.policy.empty() && deps_.comm->rank() == 0)
      log_warn("learner: LoRA on a random-init base (learner.policy is empty): snapshots carry only the adapters, ",
               "so the actors' base is their own random init from run.seed, the same weights only when they run on ",
               "the same kind of device as this learner; set learner.policy to a model folder for a real run");
  }
  // The optimizer, the gradient buckets and checkpoints see the trainable parameters
  // only: every weight, or with LoRA just the adapters.
  for (const auto& p : model_->named_parameters())
    if (p.value().requires_grad()) impl_->params.emplace_back(p.key(), p.value());
  // The reference is the start policy: for kl_coef, the pairwise objective and kl_start.
  impl_->kl_start = cfg_.logs_kl_start(model_params);
  if ((cfg_.needs_reference() || impl_->kl_start) && lora) {
    impl_->reference_is_base = true;  // the frozen base itself: the model with adapters off
  } else if (cfg_.needs_reference() || impl_->kl_start) {
    impl_->reference = policy::CausalLM(mc, opts);
    torch::NoGradGuard ng;
    auto rp = impl_->reference->named_parameters();
    for (auto& [name, t] : impl_->params) rp[name].copy_(t);
    for (auto& p : impl_->reference->parameters()) p.set_requires_grad(false);
    impl_->reference->eval();
  }
  // Sharded training state (learner.dist.shard, docs/learner-scale.md "Sharded state"; optimizer.h,
  // grad_buckets.h): with "optimizer" the buckets reduce-scatter and own the parameters'
  // storage, and AdamW keeps fp32 state for this rank's slice only. Its clip_grad_norm and
  // state() are then collective (every rank calls them, as below).
  // With "params" (ZeRO-3) the buckets follow the layers and keep only this rank's slice of
  // each; the model asks for whole layers through LayerGathers.
  std::vector<int64_t> groups;
  if (cfg_.shard == ShardMode::params) groups = layer_groups(impl_->params);
  impl_->buckets = std::make_unique<GradBuckets>(impl_->params, static_cast<std::size_t>(cfg_.bucket_mb) << 20,
                                                 deps_.comm, cfg_.shard, groups);
  impl_->opt = std::make_unique<AdamW>(impl_->params, cfg_.optim, impl_->buckets.get());
  if (cfg_.shard == ShardMode::params) {
    impl_->params_sharded = true;
    impl_->gathers = layer_gathers(*impl_->buckets, groups, mc.num_hidden_layers);
    model_->set_param_hooks(impl_->gathers.get());
    // Every rank gathers whole weights when rank 0 publishes a snapshot.
    auto flag = torch::full({1}, deps_.comm->rank() == 0 && deps_.snapshots && cfg_.snapshot_every > 0 ? 1.0 : 0.0,
                            torch::TensorOptions().dtype(torch::kFloat64).device(dev));
    deps_.comm->all_reduce_sum(flag);
    impl_->any_publisher = flag.to(torch::kCPU).item<double>() > 0;
  }
  if (deps_.snapshots && deps_.comm->rank() == 0 && cfg_.snapshot_every > 0)
    impl_->publisher = std::make_unique<SnapshotPublisher>(
        model_, deps_.snapshots, cfg_.snapshot_dtype == "fp32" ? torch::kFloat32 : torch::kBFloat16);
  for (const char* k :
       {"steps", "empty_steps", "groups_in", "groups_used", "dropped_stale", "skipped_equal", "skipped_small",
        "candidates_missing", "candidates_malformed", "candidates_environment", "groups_excluded", "probe_groups",
        "waiting_steps", "tokens", "sequences", "pairs", "publishes", "checkpoints"})
    counters_[k] = 0;
  int64_t trainable = 0;
  for (const auto& [name, t] : impl_->params) trainable += t.numel();
  log_info("learner rank ", deps_.comm->rank(), "/", deps_.comm->world(), ": ", mc.num_hidden_layers, " layers, ",
           impl_->params.size(), " trainable tensors (", trainable, " parameters",
           lora ? ", LoRA rank " + std::to_string(cfg_.lora_rank) + " on a frozen " +
                      (base_dtype == torch::kBFloat16 ? "bf16" : "fp32") + " base"
                : std::string(),
           lora                             ? ""
           : base_dtype == torch::kBFloat16 ? ", bf16 weights with an fp32 master in the optimizer"
                                            : ", fp32 weights",
           "), ", impl_->buckets->buckets(), " gradient buckets on ", dev.str(),
           impl_->autocast ? " (bf16 autocast)" : " (fp32)", recompute_note(recompute, cfg_.recompute_layers, mc),
           cfg_.pack ? ", sequences packed into rows of " : ", padded micro-batches of ", cfg_.micro_batch_tokens,
           " tokens; ", deps_.comm->name());
}

Learner::~Learner() {
  if (model_) model_->set_param_hooks(nullptr);  // the hooks die with impl_
  if (impl_ && impl_->publisher) {
    try {
      impl_->publisher->wait();
    } catch (const std::exception& e) {
      log_error("learner: last snapshot publish failed: ", e.what());
    }
  }
}

PublishStats Learner::publish_stats() const {
  if (!impl_->publisher) return {};
  impl_->publisher->wait();
  return impl_->publisher->stats();
}

void Learner::publish_snapshot() {
  if (impl_->params_sharded) {
    // Collective: rank 0 publishes whole weights, every rank takes part in gathering them.
    if (!impl_->any_publisher) return;
    impl_->buckets->gather_all();
    struct Release {
      GradBuckets* b;
      ~Release() { b->release_all(); }
    } release{impl_->buckets.get()};
    if (impl_->publisher) {
      impl_->publisher->publish(version());  // copies the weights before returning
      ++counters_["publishes"];
    }
    return;
  }
  if (!impl_->publisher) return;
  impl_->publisher->publish(version());
  ++counters_["publishes"];
}

NamedTensors Learner::named_weights() {
  if (impl_->params_sharded) return sharded_weights_cpu(true);
  NamedTensors out;
  for (const auto& p : model_->named_parameters())
    out.emplace_back(p.key(), p.value().detach().to(torch::kCPU).clone());
  return out;
}

// Sharded parameters: the trainable weights as CPU copies, one bucket gathered at a time,
// so no rank's device ever holds more than one whole bucket for it. Collective; keep false:
// this rank only takes part (returns nothing).
NamedTensors Learner::sharded_weights_cpu(bool keep) {
  auto& b = *impl_->buckets;
  NamedTensors out(keep ? impl_->params.size() : 0);
  for (std::size_t k = 0; k < b.buckets(); ++k) {
    const bool was = b.gathered(static_cast<int64_t>(k));
    b.gather(static_cast<int64_t>(k));
    b.wait_gathered(static_cast<int64_t>(k));
    if (keep)
      for (std::size_t i = 0; i < impl_->params.size(); ++i)
        if (b.bucket_of(static_cast<int64_t>(i)) == static_cast<int64_t>(k))
          out[i] = {impl_->params[i].first, impl_->params[i].second.detach().to(torch::kCPU).clone()};
    if (!was) b.release(static_cast<int64_t>(k));
  }
  return out;
}

int64_t Learner::param_storage_bytes() const {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : model_->parameters()) {
    const auto* impl = p.storage().unsafeGetStorageImpl();
    if (seen.insert(impl).second) n += static_cast<int64_t>(p.storage().nbytes());
  }
  if (impl_->params_sharded)
    for (std::size_t b = 0; b < impl_->buckets->buckets(); ++b) n += impl_->buckets->param_shard(b).storage().nbytes();
  return n;
}

StepStats Learner::step() {
  const double t0 = now_s();
  auto& comm = *deps_.comm;
  StepStats st;
  replay::TakeRequest req;
  req.step = step_;
  req.rank = comm.rank();
  req.world = comm.world();
  // This rank's share of n groups.
  auto rank_share = [&](int64_t n) { return n / comm.world() + (comm.rank() < n % comm.world() ? 1 : 0); };
  req.groups = rank_share(cfg_.groups_per_step) - static_cast<int64_t>(pending_.size());
  req.version = version();
  req.max_lag = cfg_.max_staleness;
  const uint64_t src_stale_before = deps_.source->dropped_stale();
  for (auto& g : deps_.source->take(req)) pending_.push_back(std::move(g));
  st.take_seconds = now_s() - t0;
  if (cfg_.min_groups_per_step > 1) {
    // Every rank steps or none does (the step all-reduces): wait while any rank is short.
    auto short_ranks = torch::tensor(
        {static_cast<double>(static_cast<int64_t>(pending_.size()) < rank_share(cfg_.min_groups_per_step))},
        torch::kFloat64);
    short_ranks = short_ranks.to(deps_.device);
    comm.all_reduce_sum(short_ranks);
    if (short_ranks.to(torch::kCPU).item<double>() > 0) {
      ++counters_["waiting_steps"];
      st.step = step_;
      st.seconds = now_s() - t0;
      return st;
    }
  }
  auto groups = std::move(pending_);
  const int64_t before_in = counters_["groups_in"];
  pending_.clear();
  // Groups of tasks the evaluator flagged degenerate (exclude_from_training): their
  // rewards measure nothing, so they are left out; one log line per task.
  {
    static std::set<std::string> logged;
    const auto n0 = groups.size();
    groups.erase(std::remove_if(groups.begin(), groups.end(),
                                [&](const replay::ScoredGroup& g) {
                                  if (!replay::excluded_from_training(g)) return false;
                                  if (logged.insert(g.task).second)
                                    log_warn("learner rank ", comm.rank(), ": task ", g.task,
                                             " is degenerate; its groups are left out of training "
                                             "(evaluator.train_on_degenerate_tasks: false)");
                                  return true;
                                }),
                 groups.end());
    counters_["groups_excluded"] += static_cast<int64_t>(n0 - groups.size());
    counters_["groups_in"] += static_cast<int64_t>(n0 - groups.size());  // taken, then left out
  }
  const double wait0 = impl_->gpu_share.wait_seconds();
  const auto batch = build_step_batch(groups, version(), cfg_, model_->config().vocab_size);
  const auto& bc = batch.counts;
  counters_["groups_in"] += bc.groups_in;
  counters_["groups_used"] += bc.groups_used;
  counters_["dropped_stale"] +=
      bc.dropped_stale + static_cast<int64_t>(deps_.source->dropped_stale() - src_stale_before);
  counters_["skipped_equal"] += bc.skipped_equal;
  counters_["skipped_small"] += bc.skipped_small;
  counters_["candidates_missing"] += bc.candidates_missing;
  counters_["candidates_malformed"] += bc.candidates_malformed;
  counters_["candidates_environment"] += bc.candidates_environment;
  counters_["probe_groups"] += bc.probe_groups;

  // GPU work from here to the optimizer step holds the GPU shared, paused between
  // micro-batches so an evaluator's timed trial waits at most one micro-batch.
  policy::GpuShare::Scope share(&impl_->gpu_share);
  // Global counts: the loss is normalised over every rank's batch.
  const auto dopts = torch::TensorOptions().dtype(torch::kFloat64).device(deps_.device);
  // Response lengths: truncated = not ending in an eos id; the longest per rank goes to
  // its own slot of the sum, so the all-reduce yields every rank's maximum.
  const auto& eos = model_->config().eos_token_ids;
  int64_t truncated = 0, longest = 0;
  for (const auto& sq : batch.seqs) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(sq.tokens.size()) - sq.prompt_len);
    if (std::find(eos.begin(), eos.end(), static_cast<int64_t>(sq.tokens.back())) == eos.end()) ++truncated;
  }
  // Packed: rows of whole sequences (pairwise: whole groups) back to back, no padding.
  const auto mbs = cfg_.pack ? pack_sequences(batch, cfg_.micro_batch_tokens, cfg_.uses_pairwise())
                             : pack_micro_batches(batch, cfg_.micro_batch_tokens);
  // Groups taken this step, the degenerate ones left out before the batch included.
  const auto taken = counters_["groups_in"] - before_in;
  std::vector<double> cv = {static_cast<double>(batch.completion_tokens()),
                            static_cast<double>(batch.seqs.size()),
                            static_cast<double>(batch.pairs.size()),
                            static_cast<double>(bc.groups_used),
                            static_cast<double>(truncated),
                            static_cast<double>(taken),
                            static_cast<double>(bc.skipped_equal),
                            static_cast<double>(bc.probe_groups)};
  // Per rank: its longest completion, then (sharded parameters) its micro-batch count.
  constexpr int64_t kShared = 8;  // the sums above
  cv.resize(kShared + 2 * comm.world(), 0.0);
  cv[kShared + comm.rank()] = static_cast<double>(longest);
  cv[kShared + comm.world() + comm.rank()] = static_cast<double>(mbs.size());
  auto counts = torch::tensor(cv, torch::kFloat64).to(deps_.device);
  comm.all_reduce_sum(counts);
  const auto c = counts.to(torch::kCPU);
  const double n_tok = c[0].item<double>(), n_seq = c[1].item<double>(), n_pairs = c[2].item<double>();
  st.tokens = static_cast<int64_t>(n_tok);
  st.sequences = static_cast<int64_t>(n_seq);
  st.pairs = static_cast<int64_t>(n_pairs);
  st.groups = static_cast<int64_t>(c[3].item<double>());
  st.groups_in = static_cast<int64_t>(c[5].item<double>());
  st.skipped_equal = static_cast<int64_t>(c[6].item<double>());
  st.probe_groups = static_cast<int64_t>(c[7].item<double>());
  if (n_seq > 0) {
    st.response_length_mean = n_tok / n_seq;
    st.response_length_max = static_cast<int64_t>(c.narrow(0, kShared, comm.world()).max().item<double>());
    if (!eos.empty()) st.truncated_fraction = c[4].item<double>() / n_seq;
  }
  const bool any_grpo = cfg_.uses_grpo() && n_seq > 0;
  const bool any_pairs = cfg_.uses_pairwise() && n_pairs > 0;
  // Sharded parameters: every forward and backward gathers each layer, a collective, so
  // every rank runs as many micro-batches as the busiest one (the others run empty ones).
  const std::size_t n_mb =
      impl_->params_sharded
          ? static_cast<std::size_t>(c.narrow(0, kShared + comm.world(), comm.world()).max().item<double>())
          : mbs.size();
  if (!any_grpo && !any_pairs) {
    ++counters_["empty_steps"];
    st.step = step_;
    st.gpu_wait_seconds = impl_->gpu_share.wait_seconds() - wait0;
    st.seconds = now_s() - t0;
    return st;
  }

  impl_->buckets->zero();
  // grpo loss, pairwise loss, clipped, ratio, kl, micro-batches, then token sums of the
  // behaviour KL (k3) and of the entropy, then padding and all token slots of the rows, then
  // the token sum of the KL to the start policy (k3).
  auto stats = torch::zeros({11}, dopts);
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    if (k > 0) impl_->gpu_share.pause_point();
    if (k + 1 == mbs.size()) impl_->buckets->arm();
    const auto mb = cfg_.pack ? make_packed_micro_batch(batch, mbs[k]) : make_micro_batch(batch, mbs[k]);
    stats[8] += static_cast<double>(mb.padded_tokens() - mb.real_tokens);
    stats[9] += static_cast<double>(mb.padded_tokens());
    const auto ids = mb.ids.to(deps_.device);
    // No padding (or packed): no mask, so attention can take the fused causal kernels.
    const auto attn =
        mb.packed() || mb.real_tokens == mb.padded_tokens() ? torch::Tensor() : mb.attention.to(deps_.device);
    const auto comp = mb.completion.to(deps_.device);
    // Log-probs at completion positions only, the head in chunks (never [tokens x vocab]).
    policy::TokenLogprobs cur;
    torch::Tensor ref;
    {
      AutocastGuard ac(impl_->autocast);
      cur = model_->selected_logprobs(ids, attn, comp, cfg_.temperature, cfg_.logit_chunk_tokens, mb.segments);
      if (impl_->reference) {
        torch::NoGradGuard ng;
        ref =
            impl_->reference->selected_logprobs(ids, attn, comp, cfg_.temperature, cfg_.logit_chunk_tokens, mb.segments)
                .logp;
      } else if (impl_->reference_is_base) {
        torch::NoGradGuard ng;
        struct AdaptersOff {  // back on even if the forward throws
          policy::CausalLMImpl* m;
          ~AdaptersOff() { m->set_adapters_active(true); }
        } off{model_.get()};
        model_->set_adapters_active(false);
        ref = model_->selected_logprobs(ids, attn, comp, cfg_.temperature, cfg_.logit_chunk_tokens, mb.segments).logp;
      }
    }
    const auto& logp = cur.logp;
    {
      torch::NoGradGuard ng;
      const auto beh = mb.behaviour.to(deps_.device);
      const auto d = logp.detach() - beh;  // log r, r = pi / pi_behaviour
      stats[6] += ((torch::exp(d) - 1 - d) * comp).sum().to(torch::kFloat64);
      stats[7] += (cur.entropy * comp).sum().to(torch::kFloat64);
      if (impl_->kl_start && ref.defined()) {  // KL(current || start): d = log p_start - log p
        // fp64: early in a run d is tiny and exp(d) - 1 - d cancels in fp32.
        const auto ds = ref.to(torch::kFloat64) - logp.detach().to(torch::kFloat64);
        stats[10] += ((torch::exp(ds) - 1 - ds) * comp.to(torch::kFloat64)).sum();
      }
    }
    torch::Tensor loss = torch::zeros({}, logp.options());
    if (any_grpo) {
      torch::Tensor weight;
      if (cfg_.grpo.aggregation == Aggregation::token) {
        weight = comp / n_tok;
      } else {
        weight = mb.inv_len.to(deps_.device) / n_seq;  // 1 / (its sequence's tokens * sequences)
      }
      const auto g =
          grpo_loss(logp, mb.behaviour.to(deps_.device), ref, mb.advantages.to(deps_.device), weight, cfg_.grpo);
      loss = loss + g.loss;
      stats[0] += g.loss.detach().to(torch::kFloat64);
      stats[2] += g.clipped.to(torch::kFloat64);
      stats[3] += g.ratio.to(torch::kFloat64);
      stats[4] += g.kl.to(torch::kFloat64);
    }
    if (any_pairs) {
      std::unordered_map<int64_t, int64_t> row;
      for (std::size_t r = 0; r < mb.seq_index.size(); ++r) row[mb.seq_index[r]] = static_cast<int64_t>(r);
      std::vector<std::pair<int64_t, int64_t>> local;
      for (const auto& p : batch.pairs) {
        auto a = row.find(p.first), b = row.find(p.second);
        if (a != row.end() && b != row.end()) local.emplace_back(a->second, b->second);
      }
      if (!local.empty()) {
        // Completion log-prob sums per sequence (a packed row holds several).
        const auto n_local = static_cast<int64_t>(mb.seq_index.size());
        const auto slot = mb.seq_slot.to(deps_.device).reshape({-1});
        const auto seq_logp = torch::zeros({n_local}, logp.options()).index_add(0, slot, (logp * comp).reshape({-1}));
        const auto seq_ref = torch::zeros({n_local}, ref.options()).index_add(0, slot, (ref * comp).reshape({-1}));
        const auto pl = pairwise_loss(seq_logp, seq_ref, local, cfg_.pairwise.beta, 1.0 / n_pairs);
        loss = loss + cfg_.pairwise.coef * pl;
        stats[1] += pl.detach().to(torch::kFloat64);
      }
    }
    stats[5] += 1.0;
    // Sharded parameters: every layer's gradients must come in, for the reductions every rank runs.
    if (impl_->params_sharded) loss = loss + logp.sum() * 0.0;
    loss.backward();
  }
  for (std::size_t k = mbs.size(); k < n_mb; ++k) {
    // An empty micro-batch (sharded parameters, a rank with fewer than the others): the
    // same gathers and gradient reductions as a real one, with a zero loss. After the real
    // ones, so each reduction round sums the same micro-batches as with shard: gradients.
    if (k > 0) impl_->gpu_share.pause_point();
    AutocastGuard ac(impl_->autocast);
    const auto ids = torch::zeros({1, 2}, torch::TensorOptions().dtype(torch::kInt64).device(deps_.device));
    const auto lp = model_->selected_logprobs(ids, {}, torch::ones({1, 1}, ids.options()), cfg_.temperature,
                                              cfg_.logit_chunk_tokens);
    (lp.logp.sum() * 0.0).backward();
  }
  impl_->buckets->finish();
  impl_->buckets->release_all();  // sharded parameters: nothing whole is kept between steps
  st.buckets_in_backward = impl_->buckets->launched_in_backward();
  comm.all_reduce_sum(stats);
  st.grad_norm = impl_->opt->clip_grad_norm(cfg_.optim.grad_clip);  // sharded: over all ranks' slices
  st.lr = schedule_lr(cfg_.optim, cfg_.schedule, step_);
  impl_->opt->step(st.lr);
  ++step_;
  const auto s = stats.to(torch::kCPU);
  st.grpo_loss = s[0].item<double>();
  st.pairwise_loss = s[1].item<double>();
  st.loss = st.grpo_loss + cfg_.pairwise.coef * st.pairwise_loss;
  st.clip_fraction = s[2].item<double>();
  st.mean_ratio = s[3].item<double>();
  st.kl = s[4].item<double>();
  st.micro_batches = static_cast<int64_t>(s[5].item<double>());
  st.kl_behaviour = s[6].item<double>() / n_tok;
  st.entropy = s[7].item<double>() / n_tok;
  st.padding_fraction = s[9].item<double>() > 0 ? s[8].item<double>() / s[9].item<double>() : 0.0;
  if (impl_->kl_start) st.kl_start = s[10].item<double>() / n_tok;
  impl_->gpu_share.leave();
  if (cfg_.grpo.aggregation == Aggregation::sequence || !any_grpo) st.clip_fraction = st.mean_ratio = 0;
  st.updated = true;
  st.step = step_;
  ++counters_["steps"];
  counters_["tokens"] += st.tokens;
  counters_["sequences"] += st.sequences;
  counters_["pairs"] += st.pairs;
  if (cfg_.snapshot_every > 0 && step_ % cfg_.snapshot_every == 0 && (impl_->publisher || impl_->any_publisher)) {
    policy::GpuShare::Scope copy(&impl_->gpu_share);  // device-to-host copies of the weights
    publish_snapshot();
    if (impl_->publisher) st.publish_stall_ms = impl_->publisher->stats().last_stall_ms;
  }
  if (cfg_.checkpoint_every > 0 && step_ % cfg_.checkpoint_every == 0 && !deps_.checkpoint_dir.empty()) {
    const double c0 = now_s();
    policy::GpuShare::Scope copy(&impl_->gpu_share);
    checkpoint();
    st.checkpoint_seconds = now_s() - c0;
  }
  st.gpu_wait_seconds = impl_->gpu_share.wait_seconds() - wait0;
  st.seconds = now_s() - t0;
  log_debug("learner step ", step_, ": loss ", st.loss, " groups ", st.groups, " tokens ", st.tokens, " grad_norm ",
            st.grad_norm, " lr ", st.lr, " kl_behaviour ", st.kl_behaviour, " entropy ", st.entropy, " clip_fraction ",
            st.clip_fraction, " response_length mean ", st.response_length_mean, " max ", st.response_length_max, " ",
            st.seconds, " s");
  return st;
}

uint64_t Learner::weights_checksum() const {
  impl_->buckets->gather_all();  // sharded parameters (collective); otherwise nothing
  uint64_t h = 0;
  for (const auto& [name, t] : impl_->params) {
    const auto cpu = t.detach().to(torch::kCPU).contiguous();
    h = hash64(cpu.data_ptr(), cpu.numel() * cpu.element_size(), h);
  }
  impl_->buckets->release_all();
  return h;
}

std::string Learner::checkpoint() {
  auto& comm = *deps_.comm;
  std::string path;
  if (deps_.checkpoint_dir.empty()) throw Error("learner: checkpoint() without a checkpoint_dir");
  auto opt_state = impl_->opt->state();  // sharded: gathers the slices to rank 0 (all ranks call)
  // Sharded parameters: rank 0 gathers whole weights to CPU a bucket at a time (all ranks call).
  NamedTensors whole;
  if (impl_->params_sharded) whole = sharded_weights_cpu(comm.rank() == 0);
  if (comm.rank() == 0) {
    if (impl_->publisher) impl_->publisher->wait();
    ++counters_["checkpoints"];
    CheckpointData d;
    d.step = step_;
    d.model = impl_->params_sharded ? std::move(whole) : impl_->params;
    // LoRA: the adapters, plus the frozen base when it is a random init (nothing on disk to
    // rebuild it from); a base loaded from learner.policy is named in state.json instead.
    if (cfg_.lora_rank > 0 && cfg_.policy.empty())
      for (const auto& p : model_->named_parameters())
        if (!p.value().requires_grad()) d.model.emplace_back(p.key(), p.value());
    d.optimizer = std::move(opt_state);
    if (impl_->reference)
      for (const auto& p : impl_->reference->named_parameters()) d.reference.emplace_back(p.key(), p.value());
    nlohmann::json state;
    state["step"] = step_;
    state["version"] = version();
    state["optimizer_steps"] = impl_->opt->steps();
    state["next_lr"] = schedule_lr(cfg_.optim, cfg_.schedule, step_);
    state["world"] = comm.world();
    state["counters"] = counters_;
    if (cfg_.lora_rank > 0)
      state["lora"] = {{"rank", cfg_.lora_rank},
                       {"alpha", cfg_.lora_alpha},
                       {"targets", cfg_.lora_targets},
                       {"base_model", cfg_.policy},
                       {"base_in_checkpoint", cfg_.policy.empty()}};
    state["rng"]["cpu"] = to_hex(at::detail::getDefaultCPUGenerator().get_state());
#ifdef KF_HAVE_CUDA
    if (deps_.device.is_cuda())
      state["rng"]["cuda"] = to_hex(at::cuda::detail::getDefaultCUDAGenerator(deps_.device.index()).get_state());
#endif
    d.state_json = state.dump(1);
    d.model_config_json = impl_->config_json;
    d.tokenizer_json = tokenizer_json_;
    d.extra = [this](const std::string& dir) {
      if (deps_.shm) {
        deps_.shm->replay().save(dir + "/replay.bin");
        deps_.shm->kernels().save(dir + "/kernel_db.json");
      }
      // The starting model's tokenizer files (chat template, special tokens): an export of
      // this checkpoint keeps them even when that folder has moved (tools/export prefers them).
      if (!cfg_.policy.empty())
        for (const char* f : {"tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}) {
          const std::string from = cfg_.policy + "/" + f;
          if (std::ifstream(from).good()) write_file_atomic(dir + "/" + f, read_file(from));
        }
    };
    path = write_checkpoint(deps_.checkpoint_dir, d, cfg_.checkpoint_keep);
    log_info("learner rank 0: checkpoint ", path, " written (step ", step_, ")");
  }
  comm.barrier();
  return path;
}

std::optional<int64_t> Learner::resume(bool restore_shm) {
  auto& comm = *deps_.comm;
  if (deps_.checkpoint_dir.empty()) throw Error("learner: resume() without a checkpoint_dir");
  auto pick = torch::full({1}, -1.0, torch::TensorOptions().dtype(torch::kFloat64).device(deps_.device));
  if (comm.rank() == 0) {
    if (auto ref = find_latest_valid(deps_.checkpoint_dir)) pick.fill_(static_cast<double>(ref->step));
  }
  comm.broadcast(pick, 0);
  const int64_t step = static_cast<int64_t>(pick.to(torch::kCPU).item<double>());
  if (step < 0) {
    if (comm.rank() == 0)
      log_warn("learner rank 0: no valid checkpoint in ", deps_.checkpoint_dir, "; starting from step 0");
    return std::nullopt;
  }
  load_checkpoint(deps_.checkpoint_dir + "/" + checkpoint_name(step), restore_shm);
  return step;
}

void Learner::load_checkpoint(const std::string& path, bool restore_shm) {
  verify_checkpoint(path);
  torch::NoGradGuard ng;
  auto weights = read_tensors(path + "/model.safetensors");
  // Sharded parameters: load into the whole weights, keep this rank's slices, free the rest.
  impl_->buckets->gather_all();
  struct Release {
    GradBuckets* b;
    ~Release() { b->release_all(); }
  } release{impl_->buckets.get()};
  for (auto& [name, t] : impl_->params) {
    auto it = weights.find(name);
    if (it == weights.end()) throw Error(path + "/model.safetensors: tensor '" + name + "' is missing");
    if (it->second.sizes() != t.sizes())
      throw Error(path + "/model.safetensors: tensor '" + name + "': shape mismatch");
    t.copy_(it->second);
    impl_->opt->load_param_value(name, it->second.to(deps_.device));  // a bf16 weight's fp32 master
  }
  impl_->buckets->store_shards();
  for (const auto& [name, t] : read_tensors(path + "/optimizer.safetensors"))
    impl_->opt->load_state_tensor(name, t.to(deps_.device));
  if (impl_->reference && !std::ifstream(path + "/reference.safetensors").good()) {
    // A checkpoint of a run that kept no reference (kl_start and kl_coef off): the copy
    // made at start-up from learner.policy (or the seeded init) is the start policy.
    log_info("learner rank ", deps_.comm->rank(), ": ", path,
             " holds no reference weights; the start policy is taken from learner.policy (or the seeded init)");
  } else if (impl_->reference) {
    auto rp = impl_->reference->named_parameters();
    for (const auto& [name, t] : read_tensors(path + "/reference.safetensors")) {
      auto* p = rp.find(name);
      if (!p) throw Error(path + "/reference.safetensors: tensor '" + name + "' is not a parameter");
      p->copy_(t);
    }
  }
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_file(path + "/state.json"));
    step_ = state.at("step").get<int64_t>();
    impl_->opt->set_steps(state.at("optimizer_steps").get<int64_t>());
    for (const auto& [k, v] : state.at("counters").items()) counters_[k] = v.get<int64_t>();
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(from_hex(state.at("rng").at("cpu").get<std::string>()));
    }
#ifdef KF_HAVE_CUDA
    if (deps_.device.is_cuda() && state["rng"].contains("cuda")) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(deps_.device.index());
      gen.set_state(from_hex(state["rng"]["cuda"].get<std::string>()));
    }
#endif
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + "/state.json: " + e.what());
  }
  if (restore_shm && deps_.shm && deps_.comm->rank() == 0) {
    std::size_t groups = 0, kernels = 0;
    std::ifstream r(path + "/replay.bin");
    if (r) groups = deps_.shm->replay().load(path + "/replay.bin");
    std::ifstream k(path + "/kernel_db.json");
    if (k) kernels = deps_.shm->kernels().load(path + "/kernel_db.json");
    log_info("learner rank 0: restored ", groups, " replay groups and ", kernels, " kernels from ", path);
  }
  log_info("learner rank ", deps_.comm->rank(), ": resumed from ", path, " at step ", step_);
}

}  // namespace kf::learner
