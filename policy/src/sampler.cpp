// The Sampler (kf/policy/policy.h) and token sampling (policy/src/sampler.h): prompts are
// left-padded into one prefill; each decode step samples one token per row (temperature,
// top-k, top-p, padding logits masked) and records its log-prob. Per-row stop: EOS ids, stop
// strings, a loop (loop_period), max tokens, checked on the host every check_every steps
// (each check is a device sync; the result is exact for any value, a larger one only wastes
// some tokens after a stop). Static decode (KVCache::static_slot) keeps shapes fixed so the
// step is captured once as a CUDA graph and replayed; on the CPU the growing cache is faster,
// hence static_decode = -1 means CUDA only. shared_prefill prefills one row of a group of
// equal prompts and copies its KV cache to the others. SamplingParams::gpu_share is held for
// the whole generation and paused at every host check, so an evaluator's timed trial can run
// between chunks.
#include "kf/policy/policy.h"

#include <algorithm>
#include <limits>

#include "kf/common/error.h"
#include "layers.h"
#include "sampler.h"

#ifdef KF_POLICY_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kf::policy {

namespace {
torch::Tensor masked_logits(const torch::Tensor& logits_in, int64_t valid_vocab) {
  auto logits = logits_in.to(torch::kFloat32);
  const int64_t V = logits.size(-1);
  if (valid_vocab > 0 && valid_vocab < V)
    logits = logits.clone(),
    logits.narrow(-1, valid_vocab, V - valid_vocab).fill_(-std::numeric_limits<double>::infinity());
  return logits;
}
}  // namespace

torch::Tensor sampling_logits(const torch::Tensor& logits_in, const SamplingParams& p, int64_t valid_vocab) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const auto logits = masked_logits(logits_in, valid_vocab);
  const int64_t V = logits.size(-1);
  const auto x = p.temperature == 1.0 ? logits : logits / p.temperature;
  auto filtered = x;
  if (p.top_k > 0 && p.top_k < V) {
    const auto kth = std::get<0>(x.topk(p.top_k, -1)).narrow(-1, p.top_k - 1, 1);
    filtered = filtered.masked_fill(filtered < kth, neg_inf);
  }
  if (p.top_p < 1.0) {
    auto [sorted, idx] = filtered.sort(-1, /*descending=*/true);
    const auto probs = torch::softmax(sorted, -1);
    // Drop a token when the mass before it already reaches top_p (the first always stays).
    const auto drop = (probs.cumsum(-1) - probs) > p.top_p;
    filtered = torch::full_like(filtered, neg_inf).scatter(-1, idx, sorted.masked_fill(drop, neg_inf));
  }
  return filtered;
}

std::pair<torch::Tensor, torch::Tensor> sample_tokens(const torch::Tensor& logits_in, const SamplingParams& p,
                                                      int64_t valid_vocab, at::Generator& gen) {
  if (p.temperature <= 0) {
    const auto logits = masked_logits(logits_in, valid_vocab);
    auto tok = logits.argmax(-1);
    auto lp = torch::log_softmax(logits, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1);
    return {tok, lp};
  }
  const auto filtered = sampling_logits(logits_in, p, valid_vocab);
  // Gumbel-max: argmax(logits + Gumbel noise) samples from softmax(filtered logits).
  const auto u = torch::rand(filtered.sizes(), gen, filtered.options()).clamp_(1e-20, 1.0 - 1e-7);
  const auto tok = (filtered - torch::log(-torch::log(u))).argmax(-1);
  // The behaviour log-prob is that of the distribution the token was drawn from (tempered,
  // then cut by top-k / top-p and renormalised): the learner's importance ratio and PPO
  // clip compare its policy with exactly what sampled, so with a cut the ratio also
  // carries the correction from the sampled to the tempered distribution.
  const auto logp = torch::log_softmax(filtered, -1);
  return {tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)};
}

int64_t loop_period(const std::vector<int32_t>& tokens, const SamplingParams& p) {
  const int64_t R = p.loop_repeats, n = static_cast<int64_t>(tokens.size());
  if (R < 2 || p.loop_min_span > n) return 0;
  for (int64_t per = 1; per <= p.loop_max_period && per <= n / R; ++per) {
    // Whole repeats of the block: at least R, and enough to span loop_min_span tokens.
    const int64_t need = std::max(R, (p.loop_min_span + per - 1) / per) * per;
    if (need > n) continue;
    // The last `need` tokens are repeats of one block iff each equals the token one period
    // before it; compared from the end, so text that does not loop fails at once.
    int64_t i = n - 1;
    while (i >= n - need + per && tokens[i] == tokens[i - per]) --i;
    if (i < n - need + per) return per;
  }
  return 0;
}

Sampler::Sampler(CausalLM model, const Tokenizer* tokenizer) : model_(std::move(model)), tokenizer_(tokenizer) {}

namespace {

// Index of the token whose text completes the first stop string, or -1.
int64_t find_stop(const Tokenizer& tok, const std::vector<int32_t>& tokens, const std::vector<std::string>& stops) {
  const std::string all = tok.decode(tokens);
  bool any = false;
  for (const auto& s : stops) any = any || all.find(s) != std::string::npos;
  if (!any) return -1;
  std::string text;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    text += tok.decode({tokens[i]});
    for (const auto& s : stops)
      if (text.find(s) != std::string::npos) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

std::vector<Completion> Sampler::generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p) {
  if (prompts.empty()) return {};
  if (!p.stop.empty() && !tokenizer_) throw Error("Sampler: stop strings need a tokenizer");
  if (p.max_new_tokens <= 0) throw Error("Sampler: max_new_tokens must be positive");
  if (p.loop_repeats < 0 || p.loop_repeats == 1)
    throw Error("Sampler: loop_repeats must be 0 (off) or >= 2, not " + std::to_string(p.loop_repeats));
  if (p.loop_max_period < 1)
    throw Error("Sampler: loop_max_period must be >= 1, not " + std::to_string(p.loop_max_period));
  if (p.loop_min_span < 0) throw Error("Sampler: loop_min_span must be >= 0, not " + std::to_string(p.loop_min_span));
  torch::NoGradGuard no_grad;
  const auto& cfg = model_->config();
  const auto opts = model_->options();
  const auto dev = opts.device();
  const bool use_static = p.static_decode > 0 || (p.static_decode < 0 && dev.is_cuda());
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t L = 0;
  for (const auto& pr : prompts) {
    if (pr.empty()) throw Error("Sampler: empty prompt");
    L = std::max<int64_t>(L, static_cast<int64_t>(pr.size()));
  }
  const int64_t valid_vocab = p.valid_vocab > 0 ? p.valid_vocab
                              : tokenizer_      ? tokenizer_->vocab_size()
                                                : cfg.vocab_size;
  for (const auto& pr : prompts)
    for (int32_t t : pr)
      if (t < 0 || t >= cfg.vocab_size)
        throw Error("Sampler: prompt token " + std::to_string(t) + " outside the vocab");

  if (p.shared_prefill)
    for (const auto& pr : prompts)
      if (pr != prompts[0]) throw Error("Sampler: shared_prefill needs every prompt to be the same");
  // Left-padded prompts: every row's next token lands in the same cache slot.
  const int64_t P = p.shared_prefill ? 1 : B;  // rows prefilled
  auto ids = torch::zeros({P, L}, torch::kInt64), am = torch::zeros({P, L}, torch::kInt64);
  for (int64_t b = 0; b < P; ++b) {
    const int64_t n = static_cast<int64_t>(prompts[b].size());
    for (int64_t i = 0; i < n; ++i) {
      ids[b][L - n + i] = prompts[b][i];
      am[b][L - n + i] = 1;
    }
  }
  KVCache cache = KVCache::create(cfg, P, L + p.max_new_tokens, opts);
  auto gen = at::globalContext().defaultGenerator(dev).clone();
  gen.set_current_seed(p.seed);
  GpuShare::Scope share(p.gpu_share);  // GPU work from here on; paused at each host check

#ifdef KF_POLICY_CUDA
  // Graph capture needs a non-default stream: run the whole generation on one.
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  torch::Tensor graph_logits;
  const bool use_graph = dev.is_cuda() && use_static && p.cuda_graph;
  if (use_graph) {
    torch::cuda::synchronize();
    stream_guard.emplace(
        c10::cuda::getStreamFromPool(false, dev.index() < 0 ? c10::cuda::current_device() : dev.index()));
  }
#endif
  // Equal-length rows need no mask (the fused causal attention kernels then apply).
  auto h = model_->hidden(ids.to(dev), P == 1 ? torch::Tensor() : am.to(dev), &cache);
  auto logits = model_->logits(h.narrow(1, L - 1, 1)).squeeze(1);
  if (P < B) {
    logits = logits.repeat({B, 1});
    for (std::size_t l = 0; l < cache.k.size(); ++l) {
      cache.k[l] = cache.k[l].repeat({B, 1, 1, 1});
      cache.v[l] = cache.v[l].repeat({B, 1, 1, 1});
    }
    cache.slot_valid = cache.slot_valid.repeat({B, 1});
    cache.next_pos = cache.next_pos.repeat({B});
  }
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  auto out_tok = torch::zeros({B, p.max_new_tokens}, i64);
  auto out_lp = torch::zeros({B, p.max_new_tokens}, opts.dtype(torch::kFloat32));

  std::vector<Completion> res(B);
  std::vector<bool> done(B, false);
  int64_t steps = 0, checked = 0;
  auto check = [&](int64_t upto) {
    // Host copy of the new tokens; finish rows that hit EOS, a stop string or a loop.
    const auto toks = out_tok.narrow(1, 0, upto).to(torch::kCPU);
    const auto lps = out_lp.narrow(1, 0, upto).to(torch::kCPU);
    const auto ta = toks.accessor<int64_t, 2>();
    const auto la = lps.accessor<float, 2>();
    bool all = true;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      auto& c = res[b];
      for (int64_t i = checked; i < upto && !done[b]; ++i) {
        c.tokens.push_back(static_cast<int32_t>(ta[b][i]));
        c.logprobs.push_back(la[b][i]);
        if (std::find(p.eos_ids.begin(), p.eos_ids.end(), ta[b][i]) != p.eos_ids.end()) {
          done[b] = true;
          c.finish_reason = "eos";
        } else if (p.loop_repeats > 0 && loop_period(c.tokens, p) > 0) {
          // Tested after every token, not once per check: a loop that a check's last
          // tokens happen to break would run on, and the cut would depend on check_every.
          // What is kept is a prefix of the sampled sequence: the learner stays on-policy.
          done[b] = true;
          c.finish_reason = "loop";
        }
      }
      // A stop string that completed before the loop did wins.
      if ((!done[b] || c.finish_reason == "loop") && !p.stop.empty()) {
        const int64_t k = find_stop(*tokenizer_, c.tokens, p.stop);
        if (k >= 0) {
          c.tokens.resize(k + 1);
          c.logprobs.resize(k + 1);
          done[b] = true;
          c.finish_reason = "stop";
        }
      }
      if (!done[b] && upto == p.max_new_tokens) {
        done[b] = true;
        c.finish_reason = "length";
      }
      all = all && done[b];
    }
    checked = upto;
    return all;
  };

  const int64_t every = std::max<int64_t>(1, p.check_every);
  torch::Tensor tok_in;
  while (true) {
    auto [tok, lp] = sample_tokens(logits, p, valid_vocab, gen);
    out_tok.select(1, steps).copy_(tok);
    out_lp.select(1, steps).copy_(lp);
    ++steps;
    if (steps == p.max_new_tokens || steps % every == 0) {
      if (check(steps)) break;
      if (p.gpu_share) p.gpu_share->pause_point();
    }
    if (!use_static) {
      h = model_->hidden(tok.unsqueeze(1), torch::Tensor(), &cache);
      logits = model_->logits(h).squeeze(1);
      continue;
    }
    if (!cache.static_slot.defined()) {
      cache.static_slot = torch::zeros({1}, i64);
      tok_in = torch::zeros({B, 1}, i64);
    }
    tok_in.copy_(tok.unsqueeze(1));
    cache.static_slot.fill_(cache.length);
#ifdef KF_POLICY_CUDA
    // The first static step runs eagerly (warm-up: cuBLAS handles, allocator); the second is
    // captured, and every step from then on replays the graph.
    if (use_graph && steps >= 2) {
      if (!graph) {
        graph = std::make_unique<at::cuda::CUDAGraph>();
        graph->capture_begin();
        graph_logits = model_->decode_static(tok_in, cache);
        graph->capture_end();
      }
      graph->replay();
      logits = graph_logits;
      ++cache.length;
      continue;
    }
#endif
    logits = model_->decode_static(tok_in, cache);
    ++cache.length;
  }
  if (tokenizer_)
    for (auto& c : res) c.text = tokenizer_->decode(c.tokens);
  return res;
}

}  // namespace kf::policy
